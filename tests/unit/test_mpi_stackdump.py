"""A hung MPI job's stacks at their seams: the relay gathers every relayed agent's ``dump-ranks``
answer (poprun_py/agent/relay.py), and the launcher's run emits each rank's lines as that rank's
stderr and sends SIGUSR1 through the launcher only when a rank that registered faulthandler was
not dumped and every rank registered it (poprun_py/backends/external.py). The agents' side is
in test_stackdump; the whole path on real hosts in test_long_run_hosts."""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import socket
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from poprun_py.agent.client import AgentLink, Timing
from poprun_py.agent.relay import RankDumps, Relay, RshRelay, _Session
from poprun_py.backends.external import LauncherRun
from poprun_py.backends.mpiexec import in_reach, to_ranks
from poprun_py.core.result import RunOptions
from poprun_py.hostside import protocol as P
from poprun_py.process.output import Output
from poprun_py.process.signals import Control, DumpRequest
from poprun_py.process.supervise import Supervision
from poprun_py.render.job import RenderedJob


class SentLink(AgentLink):
    """An agent link that records the control lines sent to it."""

    def __init__(self, host: str) -> None:
        super().__init__(host, (0,))
        self.sent: list[bytes] = []

    def send(self, line: bytes) -> None:
        self.sent.append(line)


@pytest.fixture
def relay() -> Iterator[RshRelay]:
    made = RshRelay(cast(Any, None), {}, Timing(1.0, 0.5, 3.0, 5.0))
    try:
        yield made
    finally:
        made.listener.close()
        for session in made.sessions:
            session.sock.close()
        shutil.rmtree(made.directory, ignore_errors=True)


def session_on(relay: RshRelay, host: str) -> tuple[_Session, SentLink]:
    mine, theirs = socket.socketpair()
    theirs.close()
    session = _Session(relay, mine)
    session.link = link = SentLink(host)
    relay.sessions.append(session)
    return session, link


def test_the_relay_gathers_every_agents_ranks_then_answers_once(relay: RshRelay) -> None:
    heard: list[RankDumps] = []
    assert not relay.dump_ranks(heard.append)  # no daemon relayed yet
    (one, link1), (two, link2) = session_on(relay, "h1"), session_on(relay, "h2")
    assert relay.dump_ranks(heard.append)
    assert link1.sent == link2.sent == [P.DUMP_RANKS_LINE]
    for record in (b"s 0 Thread 1 (idle)", b"s 0   f (a.py:3)", b"w 0 py-spy", b"w 1 none"):
        one.record(link1, record)
    one.record(link1, b"y 0 none")
    assert heard == []  # h2 has not answered
    two.record(link2, b"s 2 Thread 7 (idle)")
    relay.dump_answered(two)  # its daemon ended instead
    assert heard == [{0: [b"Thread 1 (idle)", b"  f (a.py:3)"], 1: None, 2: [b"Thread 7 (idle)"]}]
    one.record(link1, b"y 0 none")  # late, or again: nothing more
    assert len(heard) == 1


def test_the_relay_has_every_running_daemons_agent_signal_its_ranks(relay: RshRelay) -> None:
    relay.signal_ranks(signal.SIGUSR2)  # no daemon relayed yet: nothing to do
    (_, link1), (_, link2) = session_on(relay, "h1"), session_on(relay, "h2")
    link2.done = True  # its daemon has ended
    relay.signal_ranks(signal.SIGUSR2)
    assert link1.sent == [b"sigr %d" % signal.SIGUSR2] and link2.sent == []


class FakeLauncher:
    """What LauncherRun uses of its Supervision: the loop's post, Output, Control, signal."""

    def __init__(self, lines: list[tuple[int, str, str]]) -> None:
        self.control = Control()
        self.output = Output(RunOptions(sink=lambda i, s, t: lines.append((i, s, t))), {})
        self.signals: list[int] = []
        self.live: dict[int, object] = {}
        self.forward: Callable[[int], None] = self.signal
        self.dumper: Callable[[DumpRequest], None] = lambda request: None

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def post(self, call: Callable[[], None]) -> None:
        call()


class AnsweringRelay(Relay):
    def __init__(self, found: RankDumps) -> None:
        super().__init__()
        self.found = found

    def dump_ranks(self, done: Callable[[RankDumps], None]) -> bool:
        done(self.found)
        return True


def dump(found: RankDumps, request: DumpRequest) -> tuple[FakeLauncher, list[Any]]:
    lines: list[tuple[int, str, str]] = []
    fake = FakeLauncher(lines)
    run = LauncherRun(
        cast(Supervision, fake),
        contextlib.ExitStack(),
        lambda s: cast(Any, None),
        relay=AnsweringRelay(found),
        ranks=range(3),
    )
    run.dump_stacks(request)
    assert fake.control.wait_dumped(0)
    fake.control.close()
    return fake, lines


EVERY = DumpRequest(frozenset({0, 1, 2}), every=True)


def test_ranks_dumped_by_py_spy_get_their_lines_and_no_signal() -> None:
    fake, lines = dump({0: [b"Thread 1 (idle)"], 1: [b"Thread 2"], 2: [b"Thread 3"]}, EVERY)
    assert lines == [
        (0, "stderr", "Thread 1 (idle)"),
        (1, "stderr", "Thread 2"),
        (2, "stderr", "Thread 3"),
    ]
    assert fake.signals == [] and not fake.control.dump_signalled


def test_a_faulthandler_rank_py_spy_missed_gets_sigusr1_through_the_launcher() -> None:
    fake, lines = dump({0: [b"Thread 1 (idle)"], 2: None}, EVERY)
    assert lines == [(0, "stderr", "Thread 1 (idle)")]
    assert fake.signals == [signal.SIGUSR1] and fake.control.dump_signalled


def test_no_signal_when_a_rank_without_faulthandler_would_die_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        fake, _ = dump({0: [b"Thread 1"]}, DumpRequest(frozenset({1}), every=False))
    assert fake.signals == [] and not fake.control.dump_signalled
    assert "no stacks of instances 1,2" in caplog.text


class SignalledRelay(Relay):
    def __init__(self, relays: bool) -> None:
        super().__init__()
        self.relays = relays  # a class attribute; this fake sets its own
        self.signalled: list[int] = []

    def signal_ranks(self, signum: int) -> None:
        self.signalled.append(signum)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_mpiexec_signals_go_past_hydra_through_the_relay_or_locally(signum: int) -> None:
    for relays in (True, False):  # remote proxies through the agents, or all local
        fake, relay = FakeLauncher([]), SignalledRelay(relays)
        to_ranks(cast(Supervision, fake), relay, True, signum)
        assert fake.signals == [] and relay.signalled == [signum]  # hydra never signalled


def job_of(all_local: bool, launcher: tuple[str, ...]) -> RenderedJob:
    plan = SimpleNamespace(cluster=SimpleNamespace(all_local=all_local))
    return cast(RenderedJob, SimpleNamespace(plan=plan, launcher=launcher))


def test_ranks_are_in_reach_through_the_agents_or_under_a_local_hydra_of_its_own() -> None:
    hydra = ("mpiexec.hydra", "-f", "hostfile")
    assert in_reach(job_of(False, hydra), SignalledRelay(relays=True), {})
    assert in_reach(job_of(True, hydra), SignalledRelay(relays=False), {"HYDRA_DEBUG": "1"})
    assert not in_reach(job_of(False, hydra), SignalledRelay(relays=False), {})
    own = (*hydra[:1], "-launcher", "ssh", *hydra[1:])  # to localhost: out of the tree
    assert not in_reach(job_of(True, own), SignalledRelay(relays=False), {})
    assert not in_reach(job_of(True, hydra), SignalledRelay(False), {"HYDRA_BOOTSTRAP": "slurm"})


def test_mpiexec_with_its_own_launcher_passes_usr1_through_hydra_and_drops_usr2(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, relay = FakeLauncher([]), SignalledRelay(relays=False)
    with caplog.at_level(logging.WARNING):
        to_ranks(cast(Supervision, fake), relay, False, signal.SIGUSR1)
        to_ranks(cast(Supervision, fake), relay, False, signal.SIGUSR2)
    assert fake.signals == [signal.SIGUSR1] and relay.signalled == []
    assert "cannot pass signal 12 on to the ranks" in caplog.text
