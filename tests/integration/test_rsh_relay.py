"""The relay between the rsh shim and the hosts' agents, on this machine: the real shim script,
the real relay, and real agents (``python -m poprun_py.hostside.agent``) behind fake streams
(:class:`~poprun_py.testing.streams.AgentBehind`) -- the seam is the agent's stream. No test
hosts needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from poprun_py.agent.client import AgentConnection, Timing
from poprun_py.agent.relay import RshRelay
from poprun_py.hostside import rsh_shim
from poprun_py.testing.streams import AgentBehind

FAST = Timing(grace=1.0, heartbeat=0.1, liveness=0.6, start_timeout=5.0)


class LocalAgents:
    """Stands in for an AgentPool: one local agent per host name, started on first use."""

    def __init__(self) -> None:
        self.behind: dict[str, AgentBehind] = {}

    def agent_on(self, host: str) -> AgentConnection:
        self.behind[host] = AgentBehind()
        return AgentConnection(host, self.behind[host].stream)

    def close(self) -> None:
        for behind in self.behind.values():
            behind.close()


@pytest.fixture
def relay() -> Iterator[RshRelay]:
    """A relay for hosts h1 and h2 (Open MPI may also call h1 by its address 198.18.9.11)."""
    agents = LocalAgents()
    names = {"198.18.9.11": "h1", "h1": "h1", "h2": "h2"}
    try:
        with RshRelay(agents, names, FAST) as served:  # type: ignore[arg-type]
            yield served
    finally:
        agents.close()


def shim(relay: RshRelay, *args: str) -> subprocess.Popen[bytes]:
    """The shim as Open MPI runs it, pointed at ``relay``."""
    env = {**os.environ, **relay.environ}
    argv = [sys.executable, "-S", "-I", rsh_shim.__file__, "-F", "/no/cfg", *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=20)
    return proc.returncode, out.decode(), err.decode()


def unique_sleep() -> str:
    """A sleep duration no other process uses: ``pgrep`` finds its sleeps by it."""
    return f"60.{uuid.uuid4().int % 10**12:012d}"


def pgrep(mark: str) -> list[int]:
    """The ``sleep MARK`` processes (not the shell or shim whose command line names them)."""
    pattern = f"^sleep {mark}$"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def wait_for(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_command_runs_through_the_agent_with_output_and_exit_code(relay: RshRelay) -> None:
    socket_path = relay.environ[rsh_shim.SOCKET_VAR]
    assert os.stat(socket_path).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(socket_path)).st_mode & 0o777 == 0o700
    script = 'echo "out $0"; echo err >&2; printf "%s|" a "b c"; echo; exit 3'
    code, out, err = finish(shim(relay, "198.18.9.11", script))
    assert (code, out, err) == (3, "out /bin/sh\na|b c|\n", "err\n")


def test_words_are_joined_by_spaces_and_run_by_sh_as_ssh_would(relay: RshRelay) -> None:
    code, out, _ = finish(shim(relay, "h2", "printf", "'%s|'", "a b", '"c  d"', "; echo"))
    assert (code, out) == (0, "a|b|c  d|\n")


def test_unknown_and_reused_hosts_are_refused_with_255(relay: RshRelay) -> None:
    code, _, err = finish(shim(relay, "elsewhere", "true"))
    assert code == 255 and "host elsewhere is not one of this launch's hosts" in err
    assert finish(shim(relay, "h1", "true"))[0] == 0
    code, _, err = finish(shim(relay, "198.18.9.11", "true"))  # h1 again, by its address
    assert code == 255 and "host h1 already runs a daemon of this launch" in err


@pytest.mark.requires("pgrep")
def test_a_shim_killed_by_mpirun_stops_what_the_agent_started(relay: RshRelay) -> None:
    mark = unique_sleep()
    proc = shim(relay, "h1", f"sleep {mark} & sleep {mark}; wait")
    wait_for(lambda: len(pgrep(mark)) == 2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=5)
    wait_for(lambda: pgrep(mark) == [], seconds=FAST.grace + 3)


@pytest.mark.requires("pgrep")
def test_leaving_the_relay_stops_daemons_still_running() -> None:
    mark = unique_sleep()
    agents = LocalAgents()
    try:
        with RshRelay(agents, {"h1": "h1"}, FAST) as relay:  # type: ignore[arg-type]
            proc = shim(relay, "h1", f"exec sleep {mark}")
            wait_for(lambda: len(pgrep(mark)) == 1)
        assert pgrep(mark) == []
        assert finish(proc)[0] == 128 + signal.SIGTERM
        assert not os.path.exists(relay.directory)
    finally:
        agents.close()


@pytest.mark.requires("pgrep")
def test_a_silent_host_is_lost_its_shim_exits_255_and_the_relay_names_it() -> None:
    mark = unique_sleep()
    agents = LocalAgents()
    try:
        with RshRelay(agents, {"h1": "h1"}, FAST) as relay:  # type: ignore[arg-type]
            proc = shim(relay, "h1", f"exec sleep {mark}")
            wait_for(lambda: "h1" in agents.behind)
            wait_for(lambda: len(pgrep(mark)) == 1)  # the agent runs the daemon: not a sleep
            os.kill(agents.behind["h1"].proc.pid, signal.SIGSTOP)  # cut off: no heartbeats
            start = time.monotonic()
            code, _, err = finish(proc)
            # found lost at all, long before the daemon's end: how soon is not asserted beyond
            # "< 30 s" (a loaded machine); that it waited the liveness is checked below
            assert time.monotonic() - start < 30
            assert code == 255 and "host h1 stopped answering" in err
            assert list(relay.lost) == ["h1"] and "stopped answering" in relay.lost["h1"].reason
            assert relay.lost["h1"].when <= time.time() - FAST.liveness
    finally:
        for behind in agents.behind.values():
            os.kill(behind.proc.pid, signal.SIGCONT)
        agents.close()
