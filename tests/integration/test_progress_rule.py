"""Restarts stop when nothing advances (``--min-progress``): an attempt that got no further
than the one before (``poprun_py.dist.heartbeat(step=N)``), or that did not write
``--progress-file``, is not restarted; the summary lists each attempt's last step. Real
launches, on this machine and on the test hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.test_long_run_hosts import spec_for
from tests.integration.test_slurm_cli import squeue_empty
from tests.slurmcluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

STEPS = """
import os, sys, time
from poprun_py import dist
ckpt = sys.argv[1]
if os.environ["RANK"] != "0":  # rank 0 reports the steps
    time.sleep(60)  # until rank 0's failure stops it
start = int(open(ckpt).read()) if sys.argv[2] == "resume" and os.path.exists(ckpt) else 0
for step in range(start + 1, start + 6):
    dist.heartbeat(step=step)
with open(ckpt, "w") as f:
    f.write(str(start + 5))
print("attempt", os.environ["POPRUN_RESTART_COUNT"], "reached", start + 5, flush=True)
time.sleep(0.5)  # srun may report the exit before the task's last lines: let them arrive
sys.exit(3)
"""


def launch(
    tmp_path: Path,
    *args: str,
    mode: str,
    spec: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    program = tmp_path / "steps.py"
    program.write_text(STEPS)
    hosts = spec or ["--hosts", "localhost", "-n", "2", "-r", "2"]
    argv = [PY, "-m", "poprun_py", "launch", *hosts, "--max-restarts", "3", *args]
    argv += ["--", PY, str(program), str(tmp_path / "ckpt"), mode]
    env = {**(env or os.environ), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert "poprun-py:step" not in done.stdout + done.stderr  # the markers are swallowed
    return done.returncode, done.stdout, done.stderr


def test_an_attempt_that_gets_no_further_is_not_restarted(tmp_path: Path) -> None:
    code, out, err = launch(tmp_path, "--min-progress", "1", mode="again")
    assert code == 3, err  # the attempt's own code
    assert out.count("reached 5") == 2  # attempts 0 and 1
    assert "attempt 2" not in out
    assert (
        "attempt 1 made no progress (last step 5; attempt 0 reached 5; --min-progress 1): "
        "not restarting" in err
    ), err
    summary = [line for line in err.splitlines() if line.startswith("poprun-py: attempt ")]
    assert summary[-3].endswith("; restarted (last step 5)"), summary
    assert summary[-2].endswith(" (last step 5)"), summary  # the last attempt: not restarted
    assert summary[-3].startswith("poprun-py: attempt 0: instance 0 on localhost exited with")
    assert (
        summary[-2].startswith("poprun-py: attempt 1: instance 0")
        and "restarted" not in summary[-2]
    )
    assert summary[-1] == (
        "poprun-py: attempt 1 made no progress (last step 5; attempt 0 reached 5; "
        "--min-progress 1): not restarting"
    )


def test_attempts_that_advance_are_restarted_until_the_limit(tmp_path: Path) -> None:
    code, out, err = launch(tmp_path, "--min-progress", "5", mode="resume")
    assert code == 3, err
    assert [f"attempt {k} reached {5 * (k + 1)}" in out for k in range(4)] == [True] * 4, out
    assert "made no progress" not in err
    assert "restarted (last step 15)" in err and "(last step 20)" in err


def test_a_progress_file_that_is_written_counts_as_progress(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    code, out, err = launch(
        tmp_path, "--min-progress", "100", "--progress-file", ckpt, mode="again"
    )
    assert code == 3 and "made no progress" not in err, err
    assert out.count("reached 5") == 4  # every attempt ran: each wrote the checkpoint
    other = str(tmp_path / "never-written")
    code, out, err = launch(
        tmp_path, "--min-progress", "100", "--progress-file", other, mode="again"
    )
    assert code == 3
    assert f"attempt 0 made no progress (last step 5, {other} not written; " in err, err


@pytest.mark.hosts
@pytest.mark.parametrize(
    "backend",
    [
        "ssh",
        pytest.param("mpirun", marks=[pytest.mark.mpi, pytest.mark.requires("mpirun")]),
        pytest.param("mpiexec", marks=[pytest.mark.mpi, pytest.mark.requires("mpiexec.hydra")]),
    ],
)
def test_on_the_hosts_a_stalled_attempt_is_not_restarted(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    spec = ["-c", str(spec_for(test_cluster_4, tmp_path)), "-b", backend, "-n", "4", "-r", "4"]
    code, out, err = launch(tmp_path, "--min-progress", "1", mode="again", spec=spec)
    assert code == 3, err
    assert "attempt 1 made no progress (last step 5; attempt 0 reached 5" in err, err
    assert "attempt 2" not in out


@pytest.mark.slurm
@pytest.mark.hosts
def test_under_slurm_a_stalled_attempt_is_not_restarted(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = ",".join(slurm_cluster.node_names[:2])
    spec = ["--backend", "slurm", "--hosts", nodes, "-n", "2", "-r", "2", "--time", "5"]
    code, out, err = launch(tmp_path, "--min-progress", "1", mode="again", spec=spec, env=slurm_env)
    assert code == 3, out + err
    assert "attempt 1 made no progress (last step 5; attempt 0 reached 5" in err, err
    assert "attempt 2" not in out
    assert squeue_empty(slurm_env)
