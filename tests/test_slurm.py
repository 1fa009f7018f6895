import os
import stat
import subprocess

import pytest

from benchsuite.slurm import sbatch_script

HOSTILE = ["my suite's \"best\" run", "$(touch PWNED)", "`touch PWNED2`", "a\nb; touch PWNED3", "x'$HOME'y"]


def _fake_bin(tmp_path):
    """srun and scontrol that only print what they were given (one argument per line, NUL-separated)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-a\necho node-b\n")
    # srun: its own options to $SRUN_FILE, then runs the command as one task of node 1 of 2.
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do echo "$1" >> "$SRUN_FILE"; shift; done\n'
                                  'export SLURM_NNODES=2 SLURM_NODEID=1\n"$@"\n')
    (bin_dir / "python-stub").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGS_FILE"\npwd > "$PWD_FILE"\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _slurm_env(tmp_path, bin_dir, submit_dir, job_id: int, cpus: int = 64) -> dict:
    """What Slurm sets for a batch script, with the stubs first on PATH."""
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
            "SLURM_JOB_ID": str(job_id), "SLURM_SUBMIT_DIR": str(submit_dir), "SLURM_CPUS_PER_TASK": str(cpus),
            "ARGS_FILE": str(tmp_path / "args"), "PWD_FILE": str(tmp_path / "pwd"),
            "SRUN_FILE": str(tmp_path / "srun")}


@pytest.mark.procs
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_reach_the_launcher_verbatim_and_run_nothing(tmp_path, name):
    bin_dir = _fake_bin(tmp_path)
    suite_path, out_dir = tmp_path / f"{name}.toml", tmp_path / f"out {name}"
    script = sbatch_script(suite_path, name, out_dir, nodes=2, gpus_per_node=8, partition="gpu",
                           time="01:00:00", python=str(bin_dir / "python-stub"), repeat=3)
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    submit_dir = tmp_path / f"submit {name}"
    submit_dir.mkdir()
    subprocess.run(["bash", str(path)], env=_slurm_env(tmp_path, bin_dir, submit_dir, job_id=77), cwd=tmp_path,
                   check=True)
    args = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
    assert args == ["-m", "benchsuite.cli", "run", str(suite_path), "--out", str(out_dir), "--nnodes", "2",
                    "--node-rank", "1", "--rdzv-endpoint", "node-a:20077", "--rdzv-id", "77", "--repeat", "3"]
    assert (tmp_path / "pwd").read_text().strip() == str(submit_dir)
    assert not any(p.name.startswith("PWNED") for p in tmp_path.iterdir())
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script


def test_unsafe_sbatch_values_are_refused():
    with pytest.raises(ValueError, match="--partition"):
        sbatch_script("s.toml", "s", "out", 2, 8, partition="gpu\n#SBATCH --x=1")


def _directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_directives_ask_for_the_node_cpus_and_name_the_job_output():
    script = sbatch_script("s.toml", "s", "/r", nodes=2, gpus_per_node=8, cpus_per_task=96, exclusive=True,
                           job_output="/r/logs/slurm-%j.out")
    assert _directives(script) == ["#SBATCH --job-name=benchsuite-s", "#SBATCH --nodes=2",
                                   "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                                   "#SBATCH --cpus-per-task=96", "#SBATCH --exclusive",
                                   "#SBATCH --output=/r/logs/slurm-%j.out", "#SBATCH --signal=B:TERM@300",
                                   "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    default = _directives(sbatch_script("s.toml", "s", "/r", nodes=1, gpus_per_node=4))
    assert "#SBATCH --cpus-per-task=32" in default  # 8 per GPU, not Slurm's 1 per task
    assert not any(d.startswith(("#SBATCH --exclusive", "#SBATCH --output", "#SBATCH --mem")) for d in default)


@pytest.mark.procs
def test_rendezvous_port_follows_the_job_id_and_srun_gets_the_cpus(tmp_path):
    bin_dir = _fake_bin(tmp_path)
    path = tmp_path / "job.sh"
    path.write_text(sbatch_script("s.toml", "s", "out", nodes=2, gpus_per_node=8, python=str(bin_dir / "python-stub")))
    ports = []
    for job_id in (123456, 9):
        subprocess.run(["bash", str(path)], env=_slurm_env(tmp_path, bin_dir, tmp_path, job_id, cpus=48), check=True)
        args = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
        ports.append(args[args.index("--rdzv-endpoint") + 1])
    assert ports == ["node-a:23456", "node-a:20009"]
    assert "--cpus-per-task=48" in (tmp_path / "srun").read_text().split()


@pytest.mark.procs
def test_cli_writes_the_script_with_its_log_folder(tmp_path, capsys):
    from benchsuite.cli import main

    out = tmp_path / "res"
    job = tmp_path / "job.sh"
    assert main(["slurm", "workloads/smoke.toml", "--nodes", "1", "--gpus-per-node", "2", "--out", str(out),
                 "--exclusive", "-o", str(job)]) == 0
    directives = _directives(job.read_text())
    assert f"#SBATCH --output={out}/logs/slurm-%j.out" in directives and "#SBATCH --exclusive" in directives
    assert (out / "logs").is_dir()  # Slurm does not create the output's folder
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0


@pytest.mark.parametrize("value", ["0", "-4", "many"])
def test_cpus_per_task_must_be_a_positive_whole_number(capsys, value):
    from benchsuite.cli import main

    with pytest.raises(SystemExit) as e:
        main(["slurm", "workloads/smoke.toml", "--nodes", "1", "--gpus-per-node", "2", "--cpus-per-task", value])
    assert e.value.code == 2 and "--cpus-per-task" in capsys.readouterr().err


def test_an_unsafe_job_output_is_refused_naming_that_option(capsys):
    """Not the sbatch directive's name (--output), which is the option of the script file here."""
    from benchsuite.cli import main

    assert main(["slurm", "workloads/smoke.toml", "--nodes", "1", "--gpus-per-node", "2",
                 "--job-output", "my logs/slurm-%j.out"]) == 2
    err = capsys.readouterr().err
    assert "--job-output 'my logs/slurm-%j.out': only letters, digits" in err and "--output '" not in err


def test_an_out_folder_sbatch_cannot_take_asks_for_job_output(tmp_path, capsys):
    from benchsuite.cli import main

    args = ["slurm", "workloads/smoke.toml", "--nodes", "1", "--gpus-per-node", "2",
            "--out", str(tmp_path / "my results")]
    assert main(args) == 2
    assert "--job-output PATTERN" in capsys.readouterr().err
    assert main([*args, "--job-output", str(tmp_path / "logs" / "slurm-%j.out")]) == 0
