"""Every output path, every failure of the disk (issue 28, classes 4-6): a write that fails (disk full,
`ulimit -f`, a name too long) exits 2 naming the path with no traceback and nothing half-written; any legal
file name can be written; an output that is also an input is skipped or refused; an option two verbs share
is checked by one rule, and every folder a Slurm job writes to exists before it is submitted."""

import errno
import hashlib
import json
import os
import resource
import subprocess
import sys

import pytest

from benchsuite import cli
from benchsuite.atomic import atomic_file, hidden_name
from helpers import REPO
from helpers.records import make_record

SMOKE = str(REPO / "workloads" / "smoke.toml")  # 2 runs
SLURM = ["--nodes", "1", "--gpus-per-node", "2"]
NAME_249 = "n" * 245 + ".bin"  # a legal name whose temp file, named after it, was too long (Errno 36)
NAME_UTF8 = "é" * 124 + ".bin"  # 252 bytes, 128 characters: cut by bytes, never mid-character


def exit_code(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse's refusals
        return e.code


def results(folder, n=3):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"r{i}.json").write_text(json.dumps(make_record(f"k{i}", steps=50)))
    return folder


def text_file(path, size=2000):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("héllo wörld\n" * (size // 14), encoding="utf-8")
    return path


def leftovers(folder):
    """The temp files (.NAME.RANDOM.tmp) a writer left in folder or below it."""
    return list(folder.rglob(".*.tmp"))


def disk_full(monkeypatch, free: int = 0):
    """os.write as on a file system with `free` bytes left: the write that reaches the end is cut short,
    the next fails with ENOSPC. Every output file is written through os.write (atomic_file, export's append)."""
    real = os.write
    left = [free]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, memoryview(data).cast("B")[:left[0]])
        left[0] -= n
        return n

    monkeypatch.setattr(os, "write", write)


# ----------------------------------------------------------------------------- every verb that writes a file

def _tokenize(tmp_path):
    out = tmp_path / "out" / "train.bin"
    return ["tokenize", str(text_file(tmp_path / "doc.txt")), "-o", str(out)], out


def _slurm(tmp_path):
    out = tmp_path / "out" / "job.sh"
    return ["slurm", SMOKE, *SLURM, "--out", str(tmp_path / "res"), "-o", str(out)], out


def _export(tmp_path):
    out = tmp_path / "out" / "emissions.csv"
    out.parent.mkdir()  # export appends to a team's file: its folder must exist
    return ["export", str(results(tmp_path / "res")), "-o", str(out)], out


WRITERS = {"tokenize": _tokenize, "slurm": _slurm, "export": _export}


@pytest.mark.parametrize("verb", sorted(WRITERS))
@pytest.mark.parametrize("free", [0, 700])
def test_a_full_disk_exits_2_naming_the_output_and_keeps_the_previous_file(verb, free, tmp_path, monkeypatch,
                                                                          capsys):
    argv, out = WRITERS[verb](tmp_path)
    out.parent.mkdir(exist_ok=True)
    if verb != "export":  # (export appends to a file that is there: its failed append is cut back, test_export)
        out.write_bytes(b"previous")
    disk_full(monkeypatch, free)
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert f"benchsuite: cannot write {out}: No space left on device; free space" in err, err
    assert not leftovers(out.parent)
    if verb == "export":
        assert not out.exists()
    else:
        assert out.read_bytes() == b"previous"


def test_a_full_disk_while_the_dashboard_is_rebuilt_leaves_whole_files_and_the_previous_index(tmp_path, monkeypatch,
                                                                                               capsys):
    res, site = results(tmp_path / "res"), tmp_path / "site"
    assert exit_code(["dashboard", str(res), "-o", str(site)]) == 0
    index = (site / "index.html").read_bytes()
    capsys.readouterr()
    results(res, n=6)  # three more run pages to write
    disk_full(monkeypatch, free=30_000)  # the manifest and the assets fit, not every run page
    assert exit_code(["dashboard", str(res), "-o", str(site)]) == 2
    err = capsys.readouterr().err
    assert f"-o {site}: the site is not fully rebuilt (cannot write {site / 'runs'}/" in err and "No space left" in err
    assert (site / "index.html").read_bytes() == index and not leftovers(site)


def test_a_write_error_under_json_is_one_document_naming_the_path(tmp_path, monkeypatch, capsys):
    argv, out = _tokenize(tmp_path)
    disk_full(monkeypatch)
    assert exit_code([*argv, "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "output" and doc["path"] == str(out) and "No space left on device" in doc["message"]


@pytest.mark.parametrize("name", [NAME_249, NAME_UTF8, "n" * 251 + ".bin"])
@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_any_legal_file_name_can_be_written(verb, name, tmp_path, capsys):
    argv, out = WRITERS[verb](tmp_path)
    legal = out.parent / (name[:-4] + out.suffix)
    argv[argv.index(str(out))] = str(legal)
    assert exit_code(argv) == 0, capsys.readouterr().err
    assert legal.is_file() and len(os.fsencode(legal.name)) <= 255
    assert not leftovers(legal.parent)


def test_a_name_longer_than_the_file_system_holds_is_named_before_any_work(tmp_path, capsys):
    argv, out = _tokenize(tmp_path)
    too_long = out.parent / ("n" * 252 + ".bin")
    argv[argv.index(str(out))] = str(too_long)
    assert exit_code(argv) == 2
    assert f"cannot write {too_long}: File name too long; give a shorter file name" in capsys.readouterr().err
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("char", ["n", "é", "✓", "😀"])
def test_the_temp_and_lock_names_fit_any_legal_final_name_and_stay_utf8(char, tmp_path):
    for length in range(1, 256):
        name = (char * 255).encode()[:length].decode(errors="ignore") or "n"
        for suffix in (".0123456789abcdef.tmp", ".lock"):
            hidden = hidden_name(tmp_path / name, suffix)
            assert len(os.fsencode(hidden)) <= 255 and hidden.endswith(suffix)
            hidden.encode("utf-8")  # whole characters only
    with atomic_file(tmp_path / (char * 255).encode()[:255].decode(errors="ignore"), "w", encoding="utf-8") as f:
        f.write("whole")
    assert [p.read_text() for p in tmp_path.iterdir()] == ["whole"]


# ----------------------------------------------------------------------------- under `ulimit -f`, as a process

def _limited(argv, stdout=subprocess.PIPE, limit=512):
    """The CLI in a child process whose files may hold `limit` bytes (`ulimit -f`): SIGXFSZ would kill it."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([sys.executable, "-m", "benchsuite.cli", *argv], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, cwd=REPO, timeout=120, preexec_fn=preexec)


@pytest.mark.procs
@pytest.mark.parametrize("verb", sorted(WRITERS))
def test_under_ulimit_f_every_writer_exits_2_naming_the_file(verb, tmp_path):
    argv, out = WRITERS[verb](tmp_path)
    res = _limited(argv)
    assert res.returncode == 2, res.stderr
    assert f"cannot write {out}: File too large; the file is larger than this process may write (ulimit -f)" \
           in res.stderr and "Traceback" not in res.stderr
    assert not out.exists() and not leftovers(out.parent)


@pytest.mark.procs
def test_under_ulimit_f_the_dashboard_exits_2_naming_the_file(tmp_path):
    site = tmp_path / "site"
    res = _limited(["dashboard", str(results(tmp_path / "res")), "-o", str(site)])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"-o {site}: the site is not fully rebuilt (cannot write {site}" in res.stderr
    assert "File too large" in res.stderr and not (site / "index.html").exists() and not list(site.rglob("*.tmp"))


@pytest.mark.procs
@pytest.mark.parametrize("argv", [["report", "RES"], ["schema"], ["slurm", SMOKE, *SLURM, "--out", "RES"]])
def test_stdout_into_a_file_past_ulimit_f_exits_2_naming_that_file(argv, tmp_path):
    res_dir = results(tmp_path / "res")
    target = tmp_path / "printed.txt"
    with target.open("w") as stdout:
        res = _limited([str(res_dir) if a == "RES" else a for a in argv], stdout=stdout)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    assert f"benchsuite: cannot write stdout ({target}): File too large" in res.stderr


# ----------------------------------------------------------------------------- an output that is also an input

def test_tokenize_twice_over_a_glob_holding_its_output_gives_the_same_tokens(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    text_file(data / "a.txt")
    text_file(data / "b.txt", 500)
    monkeypatch.chdir(tmp_path)
    shas = []
    for _ in range(2):  # `tokenize data/* -o data/train.bin`: the second glob holds train.bin
        assert exit_code(["tokenize", *sorted(map(str, data.relative_to(tmp_path).iterdir())),
                          "-o", "data/train.bin"]) == 0
        shas.append(hashlib.sha256((data / "train.bin").read_bytes()).hexdigest())
    assert shas[0] == shas[1]
    assert "warning: data/train.bin: skipped, it is the output file -o data/train.bin" in capsys.readouterr().err
    os.link(data / "train.bin", data / "c.txt")  # the same file under a text name
    assert exit_code(["tokenize", "data/a.txt", "data/b.txt", "data/c.txt", "-o", "data/train.bin"]) == 0
    assert "data/c.txt: skipped, it is the output file" in capsys.readouterr().err
    assert hashlib.sha256((data / "train.bin").read_bytes()).hexdigest() == shas[0]


def test_tokenize_never_reads_a_token_file_as_text(tmp_path, capsys):
    text, other = text_file(tmp_path / "a.txt"), tmp_path / "val.bin"
    other.write_bytes("hello".encode("utf-16-le"))  # UTF-8 too (NUL bytes are): refused by its name
    assert exit_code(["tokenize", str(text), str(other), "-o", str(tmp_path / "train.bin")]) == 0
    assert f"{other}: skipped, a token file, not text" in capsys.readouterr().err
    assert exit_code(["tokenize", str(other), "-o", str(tmp_path / "t2.bin")]) == 2
    assert "no text file to tokenize" in capsys.readouterr().err and not (tmp_path / "t2.bin").exists()


@pytest.mark.parametrize("through", ["same path", "symlink"])
def test_slurm_refuses_to_write_its_script_over_the_suite(through, tmp_path, capsys):
    suite = tmp_path / "suite.toml"
    suite.write_bytes((REPO / "workloads" / "smoke.toml").read_bytes())
    target = suite
    if through == "symlink":
        target = tmp_path / "job.sh"
        target.symlink_to(suite)
    assert exit_code(["slurm", str(suite), *SLURM, "--out", str(tmp_path / "res"), "-o", str(target)]) == 2
    assert f"-o {target}: is the input {suite}" in capsys.readouterr().err
    assert suite.read_bytes() == (REPO / "workloads" / "smoke.toml").read_bytes()


def test_export_refuses_to_write_over_its_record_or_a_record_name_in_the_results(tmp_path, capsys):
    res = results(tmp_path / "res", n=1)
    rec = res / "r0.json"
    before = rec.read_bytes()
    assert exit_code(["export", str(rec), "-o", str(rec)]) == 2
    assert f"-o {rec}: is the input {rec}" in capsys.readouterr().err
    assert exit_code(["export", str(res), "-o", str(res / "sub" / "emissions.json")]) == 2
    assert "is read as a record by every verb; name the CSV *.csv" in capsys.readouterr().err
    assert rec.read_bytes() == before and sorted(p.name for p in res.iterdir()) == ["r0.json"]


# ----------------------------------------------------------------------------- one rule for a shared option

@pytest.mark.parametrize("value", ["0", "-1", "x", "2048", "2049", "5000"])
def test_run_and_slurm_take_and_refuse_the_same_repeat(value, tmp_path, monkeypatch, capsys):
    """smoke.toml: 2 runs, so at most 2048 repeats (4096 measurements); slurm's job passes --repeat to run."""
    from benchsuite import launch

    monkeypatch.setattr(launch, "run_suite", lambda *args, **kwargs: [])  # run stops before measuring
    codes, said = [], []
    for argv in (["run", SMOKE, "--out", str(tmp_path / "a")], ["slurm", SMOKE, *SLURM, "--out", str(tmp_path / "b")]):
        codes.append(exit_code([*argv, "--repeat", value]))
        said.append([line.split("error: ")[-1] for line in capsys.readouterr().err.splitlines()
                     if "--repeat" in line and not line.startswith("usage:")])
    assert codes[0] == codes[1] == (0 if value == "2048" else 2)
    assert said[0] == said[1] and bool(said[0]) == (value != "2048")


def test_slurm_refuses_an_out_folder_as_run_would(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    assert exit_code(["run", SMOKE, "--out", str(blocker)]) == 2
    run_says = capsys.readouterr().err
    assert exit_code(["slurm", SMOKE, *SLURM, "--out", str(blocker)]) == 2
    assert capsys.readouterr().err == run_says and f"--out {blocker}: exists and is not a folder" in run_says


def test_slurm_cpus_per_task_holds_the_ranks_run_starts_per_cpu(tiny_suite, capsys):
    suite = str(tiny_suite(world_sizes=(8,)))
    assert exit_code(["slurm", suite, "--nodes", "1", "--gpus-per-node", "8", "--cpus-per-task", "1"]) == 2
    assert "--cpus-per-task 1: the suite's runs on 1 node(s) start up to 8 ranks per node, and `benchsuite run` " \
           "starts at most 4 per CPU; give --cpus-per-task 2 or more" in capsys.readouterr().err
    assert exit_code(["slurm", suite, "--nodes", "1", "--gpus-per-node", "8", "--cpus-per-task", "2"]) == 0


@pytest.mark.parametrize("pattern, suggestion", [
    ("joblogs/%u/slurm-%j.out", "joblogs/%u-slurm-%j.out"),
    ("joblogs/%x/%u/%j.out", "joblogs/%x-%u-%j.out"),
    ("%u/slurm.out", "%u-slurm.out"),
])
def test_a_job_output_folder_named_by_a_slurm_pattern_is_refused_with_one_that_works(pattern, suggestion, tmp_path,
                                                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert exit_code(["slurm", SMOKE, *SLURM, "--job-output", pattern, "-o", "job.sh"]) == 2
    err = capsys.readouterr().err
    assert f"--job-output {pattern}: a folder named by a %-pattern cannot be created" in err
    assert f"e.g. --job-output {suggestion}" in err
    assert os.listdir(tmp_path) == []  # no script, no folder, no results folder
    assert exit_code(["slurm", SMOKE, *SLURM, "--job-output", suggestion, "-o", "job.sh"]) == 0
    assert (tmp_path / suggestion).parent.is_dir()
    assert f"#SBATCH --output={suggestion}" in (tmp_path / "job.sh").read_text()


def test_a_percent_in_out_is_refused_for_the_default_job_output(tmp_path, capsys):
    out = tmp_path / "res%x"
    assert exit_code(["slurm", SMOKE, *SLURM, "--out", str(out)]) == 2
    assert "give --job-output PATTERN (the default is OUT/logs/slurm-%j.out)" in capsys.readouterr().err
    assert not out.exists()
