"""Pytest plugin: a real Slurm (munged, slurmctld, one slurmd per test host) for the session.

Enable with ``pytest_plugins = ["tests.slurmfixtures"]`` in tests/conftest.py. Fixtures:

- ``slurm_cluster``: a :class:`~tests.slurmcluster.SlurmCluster` of three nodes, each a test host
  (network namespace with its own hostname and address) running its own slurmd; started once
  per session, stopped and removed at its end. Each node has a private, empty
  :data:`~poprun_py.launch.launcher.JOBS_ROOT` (poprun-py's default job directories), as a real
  node has its own /tmp: a launch without ``--output-dir`` must stage its job files itself.
- ``slurm_env``: for one test, ``SLURM_CONF`` of that cluster set in ``os.environ`` and any
  outer allocation's ``SLURM_*`` variables removed; returns the environment for subprocesses.

Example::

    def test_hostnames(slurm_env):
        out = subprocess.run(["srun", "-N2", "hostname"], env=slurm_env, capture_output=True,
                             text=True, check=True).stdout

When Slurm cannot start here (not root, packages missing...), the fixtures skip with the
reason, which is also printed in the terminal summary; with ``CI=true`` they fail instead.
Names carry the session's pid (cluster ``pt<pid>-slurm``, hosts ``s<tag><i>``) so sessions can
run side by side; Slurms and hosts of sessions that were killed (pid gone, or reused by a process
started at another time: tests.hostfixtures.session_alive) are removed by the next one.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from poprun_py.launch.launcher import JOBS_ROOT
from poprun_py.providers.netns import can_create_hosts, create_cluster, destroy_cluster, host_pids
from tests.hostfixtures import register_session, session_alive, session_tag
from tests.slurmcluster import SlurmCluster, can_start_slurm, list_slurm, start_slurm, stop_slurm

SLURM_NODES = 3

_SESSION = re.compile(r"pt(\d+)-[a-z0-9]+")
_notes: list[str] = []


def _require_slurm() -> None:
    """Skip (or, with CI=true, fail) the requesting test when Slurm cannot start here."""
    reason = can_create_hosts() or can_start_slurm()
    if reason is None:
        return
    message = f"cannot start a test Slurm: {reason}"
    if message not in _notes:
        _notes.append(message)
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(message + " (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(message)


@functools.cache
def _reap_stale() -> None:
    """Stop the Slurms (and hosts) of earlier sessions that are dead."""
    for name in list_slurm():
        match = _SESSION.fullmatch(name)
        if match and not session_alive(int(match.group(1))):
            stop_slurm(name)
            destroy_cluster(name)


def _assert_gone(cluster: SlurmCluster) -> None:
    left = [n.netns for n in cluster.nodes if host_pids(n.netns)]
    assert not left, f"processes left in {left}"
    needle = str(cluster.state_dir)
    out = subprocess.run(["ps", "-eo", "stat=,args="], check=True, capture_output=True, text=True)
    alive = [line for line in out.stdout.splitlines() if needle in line and line[0] != "Z"]
    assert not alive, f"Slurm daemons left: {alive}"
    assert not cluster.state_dir.exists()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Three Slurm nodes (one slurmd per test host), for the whole session."""
    _require_slurm()
    _reap_stale()
    register_session()
    name = f"pt{os.getpid()}-slurm"
    started = time.monotonic()
    hosts = create_cluster(name, SLURM_NODES, host_prefix=f"s{session_tag()}")
    cluster = None
    try:
        cluster = start_slurm(name, hosts, private=(JOBS_ROOT,))
        _notes.append(f"test Slurm ({SLURM_NODES} nodes) up in {time.monotonic() - started:.2f} s")
        yield cluster
    finally:
        stopping = time.monotonic()
        stop_slurm(name)
        destroy_cluster(name)
        if cluster is not None:
            _assert_gone(cluster)
            _notes.append(f"test Slurm stopped in {time.monotonic() - stopping:.2f} s")


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``SLURM_CONF`` of the session's Slurm in os.environ, outer ``SLURM_*`` removed."""
    for key in list(os.environ):
        if key.startswith("SLURM_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return dict(os.environ)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why Slurm tests were skipped (even without ``-rs``), and how long Slurm took."""
    for message in _notes:
        terminalreporter.write_line(f"tests.slurmfixtures: {message}", yellow=True)
