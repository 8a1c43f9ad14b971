"""A tool poprun-py needs here and does not find is a preflight fault: exit 3, one line,
nothing started, no host contacted (these hosts do not exist: contacting one would fail
differently)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_without_tools(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    bare = tmp_path / "bin"  # this Python, and nothing else
    bare.mkdir(exist_ok=True)
    if not (bare / "python3").exists():
        (bare / "python3").symlink_to(sys.executable)
    env = {"PATH": str(bare), "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "poprun_py", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_sync_by_rsync_without_rsync_here(tmp_path: Path) -> None:
    proc = run_without_tools(tmp_path, "sync", "--hosts", "nohost1.invalid", "--method", "rsync",
                             str(tmp_path))  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [
        "poprun-py: error: preflight failed on localhost: rsync: rsync not found on PATH; install "
        "rsync (Debian: rsync), or --method auto; nothing was started"
    ]


@pytest.mark.parametrize(
    ("backend", "tool"), [("mpirun", "mpirun"), ("mpiexec", "mpiexec.hydra"), ("slurm", "srun")]
)
def test_a_launcher_missing_here_on_the_local_backend_path(
    tmp_path: Path, backend: str, tool: str
) -> None:
    proc = run_without_tools(tmp_path, "launch", "--hosts", "localhost", "-b", backend, "true")
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"poprun-py: error: preflight failed on localhost: {tool}: {tool} ")
    assert line.endswith("; nothing was started")
