"""Before anything starts, on this machine (issue 20, items 16-18), through the CLI with real
processes: a missing program or working directory is exit 3 with one line naming the host and
what is missing, nothing started (local backend, and mpirun/mpiexec on this machine); the
design's own ``launch ... train.py`` runs a non-executable script under this Python; the local
backend says once on stderr that it simulates hosts named after other machines."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.test_launch_hosts_cli import poprun

PRE = "poprun-py: error: preflight failed on localhost: "


def test_a_missing_program_is_exit_3_with_one_line_and_nothing_started(tmp_path: Path):
    name = f"no-such-program-{uuid.uuid4().hex[:8]}"
    proc = poprun("launch", "--hosts", "localhost", "-n", "2", "--", name, "x", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{PRE}program: {name}: not found on PATH; nothing was started"
    ]
    assert proc.stdout == ""


def test_a_missing_workdir_is_exit_3_with_one_line_and_nothing_started(tmp_path: Path):
    marker, absent = tmp_path / "ran", tmp_path / "nonexist"
    proc = poprun(
        "launch", "--hosts", "localhost", "--workdir", str(absent), "--",
        "sh", "-c", f"touch {marker}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{PRE}workdir: working directory {absent} is missing; nothing was started"
    ]
    assert not marker.exists()


def test_the_designs_train_py_runs_under_this_python(tmp_path: Path):
    (tmp_path / "train.py").write_text(
        "import sys, os\nprint('hi', sys.executable, os.environ['RANK'])\n"
    )
    proc = poprun("launch", "--hosts", "localhost", "-n", "2", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        f"[localhost:{i}] hi {sys.executable} {i}" for i in range(2)
    ]


def test_simulated_hosts_are_said_once_on_stderr(tmp_path: Path):
    proc = poprun("launch", "--backend", "local", "--hosts", "h1,h2,h3", "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "poprun-py: warning: --backend local runs every instance on this machine: host(s) "
        "h1, h2, h3 are simulated here, not reached (use --backend ssh to run on them)"
    ]
    spec = Path(__file__).resolve().parents[2] / "clusters" / "local-2.yaml"
    proc = poprun("launch", "-c", str(spec), "--", "true", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("mpirun", marks=pytest.mark.requires("mpirun")),
        pytest.param("mpiexec", marks=pytest.mark.requires("mpiexec.hydra")),
    ],
)
def test_mpi_on_this_machine_checks_the_program_before_starting(tmp_path: Path, backend: str):
    name = f"no-such-program-{uuid.uuid4().hex[:8]}"
    proc = poprun("launch", "--backend", backend, "--hosts", "localhost", "--", name, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{PRE}program: {name}: not found on PATH; nothing was started"
    ]
