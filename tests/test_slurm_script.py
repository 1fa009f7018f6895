"""The sbatch script run under stub srun/scontrol and a stub interpreter on 2 nodes × 8 GPUs: the arguments
each step passes, the set-up before benchsuite, no path of the generating machine, requeue on SIGTERM with
no run measured twice; and the options that choose GPUs, memory, set-up, node counts and requeue."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchsuite.cli import main
from benchsuite.slurm import sbatch_script
from helpers import REPO

JOB_ID = 4242
PORT = f"{20000 + JOB_ID % 10000}"

# srun: its options as one line to $SRUN_LOG, then the command once per node of the step (SLURM_NODEID),
# forwarding SIGTERM to them as srun does.
SRUN = r"""#!/bin/bash
opts=()
while [[ "$1" == -* ]]; do opts+=("$1"); shift; done
echo "${opts[*]}" >> "$SRUN_LOG"
n=1
for o in "${opts[@]}"; do [[ "$o" == --nodes=* ]] && n=${o#--nodes=}; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_NODEID=$i SLURM_NNODES=$n "$@" & pids+=($!); done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
status=0
for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do wait "$p" || status=$?; done
done
exit "$status"
"""
SCONTROL = """#!/bin/bash
if [[ "$1" == show ]]; then echo node-a; echo node-b; else echo "scontrol $*" >> "$LOG"; fi
"""
# The job's interpreter, found only once the set-up put venv/bin on PATH: logs its arguments, then "measures"
# runs a and b (node 0 records them in DONE, a resume skips them); HANG_ON_B: b waits for a signal.
PYTHON = r"""#!/bin/bash
trap 'echo "TERM node $SLURM_NODEID" >> "$LOG"; kill "$sleeper" 2>/dev/null; exit 130' TERM
echo "python3 node $SLURM_NODEID cwd $PWD" >> "$LOG"
printf '%s\0' "$@" > "$ARGS_DIR/node$SLURM_NODEID.$8"  # $8: --nnodes
[[ -n "${SETUP_MARK:-}" ]] && echo "mark $SETUP_MARK node $SLURM_NODEID" >> "$LOG"  # exported by a set-up
for run in a b; do
    grep -qx "$run" "$DONE" 2>/dev/null && continue
    [[ "$SLURM_NODEID" == 0 ]] && echo "measure $run" >> "$LOG"
    if [[ "$run" == b && -n "${HANG_ON_B:-}" ]]; then
        touch "$ARGS_DIR/hanging"
        sleep 30 & sleeper=$!
        wait "$sleeper"
    fi
    [[ "$SLURM_NODEID" == 0 ]] && echo "$run" >> "$DONE"
done
exit 0
"""
ACTIVATE = 'export PATH="$PWD/venv/bin:$PATH"\necho setup >> "$LOG"\n'
TWO_NODE_SUITE = """[suite]
name = "scale"

[defaults]
model = { layers = 2, hidden = 32, heads = 2, vocab = 128, seq_len = 16 }
train = { micro_batch = 2, steps = 3, warmup_steps = 2, timeout_s = 60 }

[[workload]]
name = "dense"
kind = "dense"

[sweep]
world_size = [2, 8]
nodes = [1, 2]
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def cluster(tmp_path):
    """A submit folder holding the suite and an environment to activate (venv/bin/activate, venv/bin/python3),
    and a bin folder of stub srun and scontrol."""
    submit = tmp_path / "submit"
    _executable(submit / "venv" / "bin" / "python3", PYTHON)
    (submit / "venv" / "bin" / "activate").write_text(ACTIVATE)
    (submit / "scale.toml").write_text(TWO_NODE_SUITE)
    (tmp_path / "args").mkdir()
    _executable(tmp_path / "bin" / "srun", SRUN)
    _executable(tmp_path / "bin" / "scontrol", SCONTROL)
    return submit


def _env(submit: Path, **extra) -> dict:
    """What Slurm sets for the batch script of a 2-node job; PATH without the job's interpreter."""
    tmp = submit.parent
    return {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": str(JOB_ID),
            "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2", "SLURM_SUBMIT_DIR": str(submit),
            "SLURM_CPUS_PER_TASK": "64", "LOG": str(tmp / "log"), "SRUN_LOG": str(tmp / "srun"),
            "ARGS_DIR": str(tmp / "args"), "DONE": str(tmp / "done"), **extra}


def _write_script(submit: Path, monkeypatch, *options: str) -> Path:
    """The CLI's script for scale.toml, written from the submit folder with absolute paths inside it."""
    monkeypatch.chdir(submit)
    job = submit / "job.sh"
    assert main(["slurm", str(submit / "scale.toml"), "--gpus-per-node", "8", "--out", str(submit / "res"),
                 "-o", str(job), *options]) == 0
    return job


def _args(submit: Path, node: int, nodes: int) -> list[str]:
    return (submit.parent / "args" / f"node{node}.{nodes}").read_bytes().decode().split("\0")[:-1]


@pytest.mark.procs
def test_two_nodes_of_eight_gpus_run_each_node_count_as_a_step_after_the_set_up(cluster, monkeypatch):
    job = _write_script(cluster, monkeypatch, "--nodes", "2", "--gpu-request", "gres", "--mem", "256G",
                        "--setup", "source venv/bin/activate", "--repeat", "2")
    script = job.read_text()
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0
    for local in {str(cluster.parent), str(REPO), sys.prefix, sys.executable, os.getcwd()}:
        assert local not in script  # no path of the generating machine
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for wanted in ("--nodes=2", "--gres=gpu:8", "--mem=256G", "--cpus-per-task=64", "--requeue",
                   "--signal=B:TERM@300", "--output=res/logs/slurm-%j.out"):
        assert f"#SBATCH {wanted}" in directives
    assert not any("gpus-per-node" in d for d in directives)

    subprocess.run(["bash", str(job)], env=_env(cluster), cwd=cluster.parent, check=True)
    steps = (cluster.parent / "srun").read_text().splitlines()
    assert steps == [f"--kill-on-bad-exit=1 --nodes={k} --ntasks={k} --ntasks-per-node=1 --nodelist={hosts} "
                     f"--cpus-per-task=64 --gres=gpu:8" for k, hosts in ((1, "node-a"), (2, "node-a,node-b"))]
    for nodes, node in ((1, 0), (2, 0), (2, 1)):
        assert _args(cluster, node, nodes) == ["-m", "benchsuite.cli", "run", "scale.toml", "--out", "res",
                                               "--nnodes", str(nodes), "--node-rank", str(node), "--rdzv-endpoint",
                                               f"node-a:{PORT}", "--rdzv-id", str(JOB_ID), "--repeat", "2"]
    log = (cluster.parent / "log").read_text().splitlines()
    assert log[0] == "setup" and log.count("setup") == 1  # the set-up before any benchsuite
    assert f"python3 node 0 cwd {cluster}" in log and "scontrol requeue" not in " ".join(log)


@pytest.mark.procs
@pytest.mark.parametrize("requeue", [True, False])
def test_sigterm_stops_the_step_and_requeues_and_the_restart_measures_no_run_twice(cluster, requeue):
    """SIGTERM (the time-limit warning, preemption) reaches every node's benchsuite, the job requeues itself,
    and the next start resumes: a, recorded before the signal, is not measured again; b, interrupted, is."""
    script = sbatch_script("scale.toml", "scale", "res", nodes=2, gpus_per_node=8, requeue=requeue,
                           setup=["source venv/bin/activate"])
    job = cluster / "job.sh"
    job.write_text(script)
    hanging = cluster.parent / "args" / "hanging"
    proc = subprocess.Popen(["bash", str(job)], env=_env(cluster, HANG_ON_B="1"), cwd=cluster.parent)
    try:
        deadline = time.monotonic() + 20
        while not hanging.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hanging.exists(), "the stub interpreter never started run b"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 130
    finally:
        proc.kill()
    log = (cluster.parent / "log").read_text().splitlines()
    assert {"TERM node 0", "TERM node 1"} <= set(log)
    assert (f"scontrol requeue {JOB_ID}" in log) == requeue

    restart = _env(cluster, SLURM_RESTART_COUNT="1")
    subprocess.run(["bash", str(job)], env=restart, cwd=cluster.parent, check=True)
    measured = [line for line in (cluster.parent / "log").read_text().splitlines() if line.startswith("measure")]
    assert measured == ["measure a", "measure b", "measure b"]  # a once; b again after its interruption
    assert (cluster.parent / "done").read_text().split() == ["a", "b"]


@pytest.mark.procs
def test_no_requeue_past_max_requeues(cluster):
    job = cluster / "job.sh"
    job.write_text(sbatch_script("scale.toml", "scale", "res", nodes=2, gpus_per_node=8, max_requeues=3,
                                 setup=["source venv/bin/activate"]))
    proc = subprocess.Popen(["bash", str(job)], env=_env(cluster, HANG_ON_B="1", SLURM_RESTART_COUNT="3"),
                            cwd=cluster.parent, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (cluster.parent / "args" / "hanging").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "requeued 3 times (--max-requeues)" in stderr
    assert "scontrol requeue" not in (cluster.parent / "log").read_text()


@pytest.mark.procs
def test_an_interpreter_missing_after_the_set_up_is_named(cluster):
    job = cluster / "job.sh"
    job.write_text(sbatch_script("scale.toml", "scale", "res", nodes=2, gpus_per_node=8, python="python-nowhere"))
    res = subprocess.run(["bash", str(job)], env=_env(cluster), cwd=cluster.parent, capture_output=True, text=True)
    assert res.returncode == 2 and "python-nowhere is not on PATH after the set-up" in res.stderr
    assert not (cluster.parent / "srun").exists()


def test_node_counts_choose_the_steps_and_the_script_names_the_ones_left_out(cluster, monkeypatch, capsys):
    script = _write_script(cluster, monkeypatch, "--node-counts", "2").read_text()
    assert "#SBATCH --nodes=2" in script and "for NODES in 2; do" in script
    assert "# Not in this job: the runs on 1 node(s)" in script
    assert "the suite's runs on 1 node(s) are not in this job" in capsys.readouterr().err
    script = _write_script(cluster, monkeypatch).read_text()  # default: every count, the largest allocated
    assert "#SBATCH --nodes=2" in script and "for NODES in 1 2; do" in script and "Not in this job" not in script
    script = _write_script(cluster, monkeypatch, "--nodes", "1").read_text()
    assert "#SBATCH --nodes=1" in script and "for NODES in 1; do" in script
    assert "#SBATCH --gpus-per-node=8" in script and "GPUS=--gpus-per-node=8" in script


@pytest.mark.parametrize("options, said", [
    (["--node-counts", "3"], "--node-counts 3: no run of scale.toml has nodes = 3 (its node counts: 1, 2)"),
    (["--nodes", "3"], "no run has nodes = 3"),
    (["--nodes", "1", "--node-counts", "2"], "no run has nodes = 1"),
    (["--setup", "env/setup.sh"], "--setup env/setup.sh: no such file"),
])
def test_steps_and_set_up_the_job_cannot_run_are_refused(cluster, monkeypatch, capsys, options, said):
    monkeypatch.chdir(cluster)
    assert main(["slurm", "scale.toml", "--gpus-per-node", "8", *options]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("value", ["64GB", "-1", "1.5G", "lots"])
def test_mem_takes_only_slurm_sizes(cluster, monkeypatch, capsys, value):
    monkeypatch.chdir(cluster)
    with pytest.raises(SystemExit) as e:
        main(["slurm", "scale.toml", "--gpus-per-node", "8", "--mem", value])
    assert e.value.code == 2 and "--mem" in capsys.readouterr().err


@pytest.mark.procs  # bash -n checks the set-up text
def test_set_up_file_python_command_and_no_requeue(cluster, monkeypatch, capsys):
    (cluster / "env.sh").write_text("module load cuda/12.4\nsource activate bench\n")
    script = _write_script(cluster, monkeypatch, "--setup", "env.sh", "--setup", "export NCCL_DEBUG=WARN",
                           "--python", "apptainer exec --nv bench.sif python3", "--no-requeue",
                           "--signal-seconds", "600").read_text()
    lines = script.splitlines()
    start = lines.index("module load cuda/12.4")
    assert lines[start:start + 2] == ["module load cuda/12.4", "source activate bench"]  # verbatim, in order
    assert start < lines.index("export NCCL_DEBUG=WARN") < lines.index("PYTHON=(apptainer exec --nv bench.sif python3)")
    assert "#SBATCH --signal=B:TERM@600" in lines and "REQUEUE=0" in lines
    assert "#SBATCH --requeue" not in lines and "#SBATCH --open-mode=append" not in lines


# Set-up text bash cannot parse on its own: an unclosed quote would swallow the job's own lines.
UNPARSABLE = {
    "double quote": ('module load cuda/12.4"', 'close the " quote it opens'),
    "single quote": ("source venv/bin/activate\necho 'ready", "close the ' quote it opens"),
    "if": ("if [ -d venv ]; then\n  source venv/bin/activate", "close the if (fi)"),
    "case": ('case "$HOSTNAME" in\n  gpu*) module load cuda ;;', "case (esac)"),
    "heredoc": ("cat > env.txt <<EOF\nX=1", "end the here-document with a line that is exactly EOF"),
    "substitution": ("export NODE=$(hostname", "close the $( or ( it opens"),
}


@pytest.mark.procs  # bash -n checks the set-up text
@pytest.mark.parametrize("name", UNPARSABLE)
def test_set_up_bash_cannot_parse_on_its_own_is_refused_naming_setup(cluster, monkeypatch, capsys, name):
    text, fix = UNPARSABLE[name]
    monkeypatch.chdir(cluster)
    assert main(["slurm", "scale.toml", "--gpus-per-node", "8", "--setup", text, "-o", "job.sh"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err  # one line
    assert err.startswith(f"benchsuite: --setup {text!r}: bash cannot parse it on its own (")
    assert fix in err and "each --setup value runs on its own" in err
    assert not (cluster / "job.sh").exists()


@pytest.mark.procs  # bash -n checks the set-up text
def test_a_set_up_file_bash_cannot_parse_is_refused_by_its_name(cluster, monkeypatch, capsys):
    (cluster / "env.sh").write_text('module load cuda/12.4"\nsource venv/bin/activate\n')
    monkeypatch.chdir(cluster)
    assert main(["slurm", "scale.toml", "--gpus-per-node", "8", "--setup", "env.sh"]) == 2
    err = capsys.readouterr().err
    assert "benchsuite: --setup env.sh: bash cannot parse it on its own (line " in err and "unexpected EOF" in err


def test_without_bash_the_set_up_is_written_unchecked_and_said(cluster, monkeypatch, capsys):
    monkeypatch.setattr("benchsuite.commands.slurm.shutil.which", lambda name: None)
    _write_script(cluster, monkeypatch, "--setup", "module load cuda/12.4")
    assert "note: --setup 'module load cuda/12.4': its shell syntax is not checked (bash is not on PATH)" in \
        capsys.readouterr().err


# Valid set-up: module loads, an environment, exports, a here-document whose terminator is the script's own,
# a last line ending in a backslash (inline, it would join the script's next line).
VALID_SETUP = ["module load cuda/12.4\nmodule load nccl\nsource venv/bin/activate\nexport SETUP_MARK=1",
               "cat > \"$LOG.here\" <<'BENCHSUITE_SETUP_END'\nkept\nBENCHSUITE_SETUP_END\necho heredoc done \\"]


@pytest.mark.procs
def test_valid_multi_line_set_up_runs_and_the_job_goes_on_past_it(cluster, monkeypatch):
    _executable(cluster.parent / "bin" / "module", '#!/bin/bash\necho "module $*" >> "$LOG"\n')
    options = [word for text in VALID_SETUP for word in ("--setup", text)]
    job = _write_script(cluster, monkeypatch, "--node-counts", "2", *options)
    assert "<<'BENCHSUITE_SETUP_END_2'" in job.read_text()  # the script's terminator is none of the set-up's lines
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0
    res = subprocess.run(["bash", str(job)], env=_env(cluster), cwd=cluster.parent, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    log = (cluster.parent / "log").read_text().splitlines()
    assert log[:3] == ["module load cuda/12.4", "module load nccl", "setup"]
    assert {"mark 1 node 0", "mark 1 node 1"} <= set(log)  # past the set-up: the step ran, with its export
    assert (cluster.parent / "log.here").read_text() == "kept\n" and "heredoc done" in res.stdout


def _run_with_setup(cluster: Path, *setup: str) -> subprocess.CompletedProcess:
    """sbatch_script itself, no CLI check in between: what the script alone does with the set-up text."""
    job = cluster / "job.sh"
    job.write_text(sbatch_script("scale.toml", "scale", "res", nodes=2, gpus_per_node=8,
                                 setup=["source venv/bin/activate", *setup]))
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0
    return subprocess.run(["bash", str(job)], env=_env(cluster, LC_ALL="C"), cwd=cluster.parent, capture_output=True,
                          text=True)


@pytest.mark.procs
def test_an_unclosed_quote_in_the_set_up_stops_the_job_there_and_swallows_none_of_its_lines(cluster):
    """Inline, the quote ran to the next " of the script: a word of benchsuite's own lines ran as a command."""
    res = _run_with_setup(cluster, 'module load cuda/12.4"')
    assert res.returncode == 2 and "eval: line" in res.stderr and "unexpected EOF" in res.stderr, res.stderr
    assert "command not found" not in res.stderr and not (cluster.parent / "srun").exists()


@pytest.mark.procs
def test_an_unclosed_here_document_in_the_set_up_ends_with_its_text_and_the_job_goes_on(cluster):
    """It parses on its own (bash only warns); inline, it took the rest of the script as its body: no step ran."""
    res = _run_with_setup(cluster, "cat >/dev/null <<EOF\nunfinished")
    assert res.returncode == 0, res.stderr
    assert "python3 node 0 cwd" in (cluster.parent / "log").read_text()  # the steps ran after the set-up
