"""A launcher that is stopped for a while does not lose its job (issue 20, item 2), through the
real CLI on the ssh test hosts: SIGSTOP for longer than the old 3 s limit (the default
``--host-timeout`` covers it, on the ssh and the mpirun backend); Ctrl-Z (SIGTSTP) for longer
than the limit itself (the agents were told to wait); the limit reaches the agents (a SIGSTOP
longer than ``--host-timeout 2s`` does end the job); and a host that dies is still lost at once,
long before the limit, because its connection ends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from poprun_py.hostside.identity import read_stat
from poprun_py.providers.netns import TestCluster, host_pids
from tests.hostfixtures import MakeCluster
from tests.integration.test_launch_hosts_cli import only_sshd, spec_for

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
STOPPED_FOR = 5.0  # longer than the old hard-coded 3 s: the scenario, not a synchronisation


class Launch:
    """``poprun-py launch`` in a process group of its own within this session (so that
    SIGTSTP stops it: an orphaned group would ignore it), its stdout lines collected."""

    def __init__(self, argv: list[str], cwd: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "poprun_py", "launch", *argv],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            process_group=0,
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, count: int, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while len([x for x in list(self.lines) if re.search(pattern, x)]) < count:
            assert self.proc.poll() is None, self.finish()
            assert time.monotonic() < deadline, self.lines
            time.sleep(0.02)

    def stop_for(self, sig: int, seconds: float) -> None:
        """``sig`` (SIGSTOP or SIGTSTP); once the launcher is stopped, ``seconds``; SIGCONT."""
        self.proc.send_signal(sig)
        deadline = time.monotonic() + 10
        while (read_stat(self.proc.pid) or (0, 0, 0, 0, "?"))[4] != "T":
            assert time.monotonic() < deadline, "the launcher did not stop"
            time.sleep(0.01)
        time.sleep(seconds)  # stopped this long
        self.proc.send_signal(signal.SIGCONT)

    def finish(self, timeout: float = 90.0) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for reader in self.readers:
            reader.join(timeout=10)
        return self.proc.returncode, "\n".join(self.err)


def start(cluster: TestCluster, tmp_path: Path, *flags: str, backend: str = "ssh") -> Launch:
    """One instance per host: says ``up``, sleeps 7 s, says ``done``."""
    spec = spec_for(cluster, tmp_path)
    mark = uuid.uuid4().hex[:8]
    script = f'echo "up $RANK"; sleep 7; echo "done $RANK" # {mark}'
    n = str(len(cluster.hosts))
    argv = ["-c", str(spec), "-b", backend, "-r", n, "-n", n, *flags, "--", "sh", "-c", script]
    run = Launch(argv, tmp_path)
    run.wait_for(r"\] up \d$", len(cluster.hosts))
    return run


def done(run: Launch) -> int:
    return len([x for x in run.lines if re.search(r"\] done \d$", x)])


@pytest.mark.parametrize("backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.mpi)])
def test_a_launcher_stopped_longer_than_3_s_keeps_its_job(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    run = start(test_cluster_4, tmp_path, backend=backend)
    run.stop_for(signal.SIGSTOP, STOPPED_FOR)
    code, err = run.finish()
    assert code == 0, err
    assert done(run) == 4
    only_sshd(test_cluster_4)


@pytest.mark.parametrize("backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.mpi)])
def test_ctrl_z_tells_the_agents_to_wait_beyond_the_host_timeout(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    run = start(test_cluster_4, tmp_path, "--host-timeout", "2s", backend=backend)
    run.stop_for(signal.SIGTSTP, STOPPED_FOR)  # more than twice the limit
    code, err = run.finish()
    assert code == 0, err
    assert done(run) == 4
    only_sshd(test_cluster_4)


@pytest.mark.parametrize("backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.mpi)])
def test_the_host_timeout_reaches_the_agents(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    """Stopped (SIGSTOP: no word to the agents) longer than ``--host-timeout 2s``, the
    launcher is taken to be gone by every agent, which stops its instances."""
    run = start(test_cluster_4, tmp_path, "--host-timeout", "2s", backend=backend)
    run.stop_for(signal.SIGSTOP, STOPPED_FOR)
    code, err = run.finish()
    assert code not in (0, 2), err
    assert done(run) == 0
    assert "lost" in err or "closed" in err or "killed" in err, err
    only_sshd(test_cluster_4, settle=5.0)


def test_a_host_that_dies_is_lost_at_once_whatever_the_host_timeout(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(2, "ht")
    run = start(cluster, tmp_path)  # the default limit: minutes
    victim = cluster.hosts[1]
    for pid in host_pids(victim.netns):  # sshd, the agent, the instance
        with contextlib.suppress(ProcessLookupError):  # ended between the listing and now
            os.kill(pid, signal.SIGKILL)
    died = time.monotonic()
    code, err = run.finish()
    took = time.monotonic() - died
    assert code == 255, err
    assert f"lost contact with host {victim.name}" in err, err
    assert took < 30, took  # its connection ended: not the 3 min of silence
