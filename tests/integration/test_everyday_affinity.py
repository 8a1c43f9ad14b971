"""A launch under ``taskset`` (or in a cpuset) stays within it on every backend here: more
instances than allowed CPUs share them, none is bound to a CPU it may not use (Open MPI's and
MPICH's ranks failed with ``numactl: <1> is invalid``; the local backend's escaped the
``taskset``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU = min(os.sched_getaffinity(0))
SHOW = "grep Cpus_allowed_list /proc/self/status"


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        pytest.param("mpirun", marks=pytest.mark.requires("mpirun")),
        pytest.param("mpiexec", marks=pytest.mark.requires("mpiexec.hydra")),
    ],
)
def test_three_instances_under_taskset_run_within_its_cpu(backend: str) -> None:
    argv = ["launch", "--hosts", "localhost", "-n", "3", "-r", "3", "--backend", backend]
    done = subprocess.run(
        [
            "taskset",
            "-c",
            str(CPU),
            sys.executable,
            "-m",
            "poprun_py",
            *argv,
            "--",
            "sh",
            "-c",
            SHOW,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    allowed = re.findall(r"^\[localhost:(\d)\] Cpus_allowed_list:\s*(\S+)$", done.stdout, re.M)
    assert sorted(allowed) == [("0", str(CPU)), ("1", str(CPU)), ("2", str(CPU))], done.stdout
