"""A launch past a thousand hosts (issue 24): the pool's connect window (at most W hosts
resolve and connect at once, while every host's command runs at once), ``RLIMIT_NOFILE`` raised
to its hard limit, and the host agent reading a descriptor above 1023. No real host: the pool's
``connect`` and resolver are replaced by fakes that count what is in flight. Every wait polls
against a deadline."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.hostside import agent
from poprun_py.ssh import pool as pool_module
from poprun_py.ssh.pool import ConnectionPool, raise_nofile_limit
from poprun_py.ssh.settings import SshSettings

DEADLINE = 20.0


def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after DEADLINE seconds."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE:g} s: {what}"
        time.sleep(0.005)


class FakeConnection:
    """What ``pool.each`` hands ``fn``: a name, and a close that does nothing."""

    def __init__(self, name: str):
        self.name = name

    def close(self) -> None:
        pass


class InFlight:
    """Counts calls under way (now and at most), each held until ``release`` is set."""

    def __init__(self) -> None:
        self.now = self.peak = self.calls = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            assert self.release.wait(DEADLINE), "never released"
        finally:
            with self._lock:
                self.now -= 1


@pytest.fixture
def handshakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[InFlight]:
    """The pool's ``connect`` held in flight until released; the resolver answers at once."""
    flight = InFlight()

    def fake_connect(host: HostSpec, settings: Any, context: Any) -> FakeConnection:
        flight.hold()
        return FakeConnection(host.name)

    monkeypatch.setattr(pool_module, "connect", fake_connect)
    yield flight
    flight.release.set()


def fake_pool(count: int, window: int) -> ConnectionPool:
    hosts = [HostSpec(f"h{i}", address="198.18.0.1") for i in range(count)]
    pool = ConnectionPool(hosts, SshSettings(connect_timeout=2.0), window=window)
    setattr(pool._context.resolver, "endpoint", lambda host: None)
    return pool


def run_each(pool: ConnectionPool, fn: Callable[[Any], Any]) -> dict[str, Any]:
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(pool.each(fn, connect=True)))
    worker.start()
    box["thread"] = worker
    return box


def test_at_most_window_hosts_connect_at_once(handshakes: InFlight) -> None:
    with fake_pool(40, window=4) as pool:
        box = run_each(pool, lambda conn: conn.name)
        until(lambda: handshakes.now == 4, "four handshakes in flight")
        handshakes.release.set()
        until(lambda: not box["thread"].is_alive(), "every host connected")
        assert handshakes.peak == 4  # a fifth never started while four were in flight
        assert handshakes.calls == 40
        assert sorted(out.value for name, out in box.items() if name != "thread") == sorted(
            f"h{i}" for i in range(40)
        )


def test_a_host_starts_connecting_only_once_a_slot_is_free(handshakes: InFlight) -> None:
    """The connect timeout is taken inside ``connect``: it counts from the host's own attempt,
    not from when it was queued behind the window."""
    with fake_pool(10, window=1) as pool:
        box = run_each(pool, lambda conn: conn.name)
        until(lambda: handshakes.now == 1, "one handshake in flight")
        handshakes.release.set()
        until(lambda: not box["thread"].is_alive(), "every host connected")
        assert handshakes.peak == 1 and handshakes.calls == 10


def test_commands_are_not_windowed_only_connections(handshakes: InFlight) -> None:
    """Every host's command runs at once (a long command does not hold back other hosts)."""
    handshakes.release.set()
    running = InFlight()
    with fake_pool(100, window=4) as pool:
        box = run_each(pool, lambda conn: running.hold())
        until(lambda: running.now == 100, "the command running on all 100 hosts at once")
        running.release.set()
        until(lambda: not box["thread"].is_alive(), "every command done")
        assert handshakes.peak <= 4


@pytest.fixture
def nofile() -> Iterator[tuple[int, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield soft, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_descriptor_limit_is_raised_to_the_hard_limit(nofile: tuple[int, int]) -> None:
    _, hard = nofile
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    got = raise_nofile_limit()
    wanted = pool_module.NOFILE_FALLBACK if hard == resource.RLIM_INFINITY else hard
    assert got == resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    ConnectionPool([], SshSettings())  # every pool raises it
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == wanted


def test_the_agent_reads_its_requests_from_a_descriptor_above_1023(
    nofile: tuple[int, int],
) -> None:
    soft, hard = nofile
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: no descriptor 1500 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    r, w = os.pipe()
    high = os.dup2(r, 1500)
    try:
        job: dict[str, Any] = {"instances": []}
        os.write(w, b"job " + json.dumps(job).encode() + b"\nrest")
        assert agent.serve(high, idle=DEADLINE) == (job, b"rest")
        with pytest.raises(SystemExit):  # silent past ``idle``: poprun-py is gone
            agent.serve(high, idle=0.01)
        os.close(w)
        with pytest.raises(SystemExit):  # its end
            agent.serve(high, idle=DEADLINE)
    finally:
        for fd in (high, r):
            os.close(fd)


class RunningConnection(FakeConnection):
    """A connection whose ``run`` succeeds at once; it records being closed."""

    closed: ClassVar[list[str]] = []

    def run(self, argv: Any, **kwargs: Any) -> Any:
        from poprun_py.ssh.connection import RemoteResult

        assert self.name not in self.closed, "ran on a closed connection"
        return RemoteResult(self.name, 0, "", "", 0.0)

    def close(self) -> None:
        self.closed.append(self.name)


def test_exec_closes_each_host_connection_once_its_command_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand idle Paramiko transports, each waking ten times a second, cost more than the
    handshakes: exec lets each go as soon as its host's command is done."""
    from poprun_py.ssh.fanout import run_everywhere

    RunningConnection.closed = []
    monkeypatch.setattr(pool_module, "connect", lambda host, *_: RunningConnection(host.name))
    with fake_pool(30, window=4) as pool:
        outcomes = run_everywhere(pool, ["true"])
        assert [o.exit_code for o in outcomes] == [0] * 30
        assert sorted(RunningConnection.closed) == sorted(f"h{i}" for i in range(30))
        assert pool.connections == {}
