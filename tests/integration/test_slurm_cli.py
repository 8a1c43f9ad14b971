"""`poprun-py launch --backend slurm` end to end through the CLI, against the real test Slurm:
outside an allocation (salloc, then srun, then release), inside one (hosts and backend from the
allocation), and a failing task's exit code. Nothing may be left in squeue afterwards."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

SHOW = 'echo "$RANK $POPRUN_HOST_NAME $(hostname) $POPDIST_REPLICA_INDEX_OFFSET"'


def poprun(args: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def squeue_empty(env: Mapping[str, str]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h"], env=dict(env), capture_output=True, text=True, check=False
        )
        if not out.stdout.strip():
            return True
        time.sleep(0.1)
    return False


def logs(out: Path, n: int) -> list[list[str]]:
    return [(out / f"instance-{i}.log").read_text().split() for i in range(n)]


def test_launch_outside_an_allocation_asks_for_one_and_releases_it(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = slurm_cluster.node_names[:2]
    out = tmp_path / "out"
    proc = poprun(
        [
            "launch",
            "--backend",
            "slurm",
            "--hosts",
            ",".join(nodes),
            "-r",
            "4",
            "-n",
            "4",
            "--time",
            "5",
            "-o",
            str(out),
            "--",
            "sh",
            "-c",
            SHOW,
        ],
        slurm_env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    got = logs(out, 4)
    assert [g[0] for g in got] == ["0", "1", "2", "3"]
    assert [g[1] for g in got] == [nodes[0], nodes[0], nodes[1], nodes[1]]
    assert [g[2] for g in got] == [g[1] for g in got]  # really ran on that node
    assert [g[3] for g in got] == ["0", "1", "2", "3"]
    assert squeue_empty(slurm_env)


def test_launch_inside_an_allocation_takes_its_hosts_and_backend(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--time=2",
            sys.executable,
            "-m",
            "poprun_py",
            "launch",
            "-r",
            "2",
            "-o",
            str(out),
            "--",
            "sh",
            "-c",
            SHOW,
        ],
        env=slurm_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = logs(out, 2)
    assert [g[1] for g in got] == list(slurm_cluster.node_names[:2])
    assert [g[2] for g in got] == [g[1] for g in got]
    assert squeue_empty(slurm_env)


def test_failing_task_gives_its_own_exit_code(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = slurm_cluster.node_names[:2]
    proc = poprun(
        [
            "launch",
            "--backend",
            "slurm",
            "--hosts",
            ",".join(nodes),
            "-r",
            "2",
            "--time",
            "5",
            "-o",
            str(tmp_path / "out"),
            "--grace-period",
            "1",
            "--",
            "sh",
            "-c",
            'if [ "$RANK" = 1 ]; then exit 7; fi; sleep 30',
        ],
        slurm_env,
        tmp_path,
    )
    assert proc.returncode == 7, proc.stderr
    assert "instance 1 on" in proc.stderr and "exited with code 7" in proc.stderr
    assert squeue_empty(slurm_env)
