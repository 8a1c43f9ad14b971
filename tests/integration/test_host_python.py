"""The python3 a host has: the agent runs on any python3 from 3.7 (``MIN_PYTHON``), and a host
whose python3 is older is refused in preflight with one line naming it, exit 3, nothing started.

Real old interpreters (pyenv's 3.7 and 3.6 builds, where this machine has them) are put in place
of ``/usr/bin/python3`` on one test host only: a bind mount inside that host's own mount
namespace (its sshd runs under ``ip netns exec``, which gives it one), so that host's login
sessions -- and so the agent poprun-py starts there -- get that Python, and nothing else does."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.agent.host import MIN_PYTHON
from poprun_py.providers.netns import TestCluster, TestHost
from tests.hostfixtures import MakeCluster
from tests.integration.helpers import strays

pytestmark = pytest.mark.hosts


def settled(cluster: TestCluster, seconds: float = 5.0) -> dict[str, list[int]]:
    """What is still running besides sshd on any host, once ``seconds`` have passed or nothing
    is (a closed session's sshd child and agent take a moment to exit)."""
    deadline = time.monotonic() + seconds
    while (left := strays(cluster)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


PYENV = Path("/root/.pyenv/versions")


def old_python(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no python{version} build here (pyenv) to stand in for a host's python3")
    return found[-1]


def give_python(host: TestHost, python: Path, tmp_path: Path) -> None:
    """Make ``/usr/bin/python3`` run ``python`` in ``host``'s mount namespace only."""
    wrapper = tmp_path / f"python3-{host.name}"
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    subprocess.run(
        ["nsenter", f"--target={host.sshd_pid}", "--mount", "--",
         "mount", "--bind", str(wrapper), "/usr/bin/python3"],
        check=True,
    )  # fmt: skip


def launch(
    cluster: TestCluster, hosts: list[TestHost], cwd: Path
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "poprun_py", "launch", "-b", "ssh", "--ssh-config",
            str(cluster.ssh_config), "--hosts", ",".join(h.name for h in hosts),
            "--", "sh", "-c", 'echo "ran on $(hostname)"']  # fmt: skip
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_agent_runs_on_the_oldest_python_and_refuses_an_older_one(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    assert MIN_PYTHON == (3, 7)
    cluster = make_test_cluster(2, "y")
    oldest, too_old = cluster.hosts
    give_python(oldest, old_python("3.7"), tmp_path)
    give_python(too_old, old_python("3.6"), tmp_path)

    refused = launch(cluster, [oldest, too_old], tmp_path)
    assert refused.returncode == 3, refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("poprun-py: error")]
    assert len(error) == 1, refused.stderr
    assert f"preflight failed on {too_old.name}" in error[0]
    assert "python3 here is 3.6; poprun-py needs 3.7 or later on every host" in error[0]
    assert "ran on" not in refused.stdout  # nothing started, not even on the fit host
    assert oldest.name not in error[0]

    ran = launch(cluster, [oldest], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert f"ran on {oldest.name}" in ran.stdout
    assert settled(cluster) == {}
