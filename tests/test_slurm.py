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
    (bin_dir / "srun").write_text('#!/bin/bash\nshift 2\nexport SLURM_NNODES=2 SLURM_NODEID=1 SLURM_JOB_ID=77\n'
                                  '"$@"\n')
    (bin_dir / "python-stub").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGS_FILE"\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_reach_the_launcher_verbatim_and_run_nothing(tmp_path, name):
    bin_dir = _fake_bin(tmp_path)
    suite_path, out_dir = tmp_path / f"{name}.toml", tmp_path / f"out {name}"
    script = sbatch_script(suite_path, name, out_dir, nodes=2, gpus_per_node=8, partition="gpu",
                           time="01:00:00", python=str(bin_dir / "python-stub"))
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
           "ARGS_FILE": str(tmp_path / "args")}
    subprocess.run(["bash", str(path)], env=env, cwd=tmp_path, check=True)
    args = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
    assert args == ["-m", "benchsuite.cli", "run", str(suite_path), "--out", str(out_dir), "--nnodes", "2",
                    "--node-rank", "1", "--rdzv-endpoint", "node-a:29500", "--rdzv-id", "77"]
    assert not any(p.name.startswith("PWNED") for p in tmp_path.iterdir())
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script


def test_unsafe_sbatch_values_are_refused():
    with pytest.raises(ValueError, match="--partition"):
        sbatch_script("s.toml", "s", "out", 2, 8, partition="gpu\n#SBATCH --x=1")
