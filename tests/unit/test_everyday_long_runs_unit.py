"""Long runs, issue 20 section B, at the seams: an ended instance is never hung (items 1), the
signal state across attempts and the clocks' stop (item 4), restarts told as they happen
(item 5). The real launches are in tests/integration/test_everyday_long_runs.py."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest

from poprun_py.core.result import InstanceResult, RunSettings
from poprun_py.launch.clocks import Clocks
from poprun_py.launch.launcher import launch
from poprun_py.launch.restarts import ANNOUNCE
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare
from poprun_py.process.progress import ENDED, HEARTBEAT, Progress
from poprun_py.process.signals import Control, handling_signals
from poprun_py.testing.fakes import FakeBackend, FakeSession, Script
from tests.unit.in_child import in_child


def prepared(hosts: str = "h1,h2", **long_run: object) -> Prepared:
    return prepare(LaunchOptions(hosts=hosts, program=("t",), **long_run), environ={})  # type: ignore[arg-type]


# ---------------------------------------------------------------- 1. an ended instance


def test_an_ended_instance_is_never_the_stalest() -> None:
    p = Progress([0, 1, 2], now=0.0)
    p.ended(0)  # told by Control.ended (local, ssh, a launcher's exit)
    assert p.stalest(now=50.0) == (1, 50.0)
    assert p.seen(1, ENDED, now=51.0)  # a rank wrapper's marker (mpirun, mpiexec, srun)
    assert p.seen(2, HEARTBEAT, now=52.0)
    assert p.stalest(now=60.0) == (2, 8.0)
    assert p.running == frozenset({2})
    p.seen(1, "a line after its end", now=70.0)  # does not bring it back
    p.ended(2)
    assert p.stalest(now=1000.0) is None and not p.dumpable


def test_the_clocks_never_call_an_ended_instance_hung() -> None:
    """Instance 0 exited 0 at once, instance 1 keeps printing: no hang, for several times
    the hang timeout (the attempt tells its progress of every end through the Control)."""
    control, progress = Control(), Progress([0, 1])
    done = threading.Event()

    def prints() -> None:
        while not done.wait(0.05):
            progress.seen(1, "step")

    feeder = threading.Thread(target=prints, daemon=True)
    feeder.start()
    try:
        clocks = Clocks(control, progress, {0: "h1", 1: "h1"}, hang_timeout=0.3)
        with control.listening(lambda r: progress.ended(r.index)), clocks:
            control.ended(InstanceResult(0, "h1", exit_code=0))
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline and not control.stopping:
                time.sleep(0.05)
    finally:
        done.set()
        feeder.join()
        control.close()
    assert clocks.cause is None and control.stop_reason is None


def test_an_instance_that_ends_while_its_stacks_are_dumped_was_not_hung() -> None:
    """Instance 0 is silent past the hang timeout; it ends (exit 0) while the clock waits for
    the stacks: the job is not stopped, the clock goes on watching instance 1."""
    control, progress = Control(), Progress([0, 1])
    done = threading.Event()

    def runner() -> None:  # a backend's loop: prints for instance 1, answers the dump
        while not done.wait(0.05):
            progress.seen(1, "step")
            if control.take_dumps():
                control.ended(InstanceResult(0, "h1", exit_code=0))
                control.dumped(signalled=False)

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    try:
        clocks = Clocks(control, progress, {0: "h1", 1: "h1"}, hang_timeout=0.3)
        with control.listening(lambda r: progress.ended(r.index)), clocks:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not control.stopping:
                time.sleep(0.05)
            assert progress.running == frozenset({1})  # it was dumped, then ended
    finally:
        done.set()
        thread.join()
        control.close()
    assert clocks.cause is None and control.stop_reason is None


# ---------------------------------------------------------------- 4. signal state, clocks' stop


class FailsMeanwhile(Control):
    """An instance fails while the clocks fire: right after they looked at ``stopping`` (and
    saw False), or just before their stop takes hold -- the interleavings that made the clocks
    report an instance's failure as their time-out (exit 124)."""

    def __init__(self) -> None:
        super().__init__()
        self.race = True

    def _fail(self) -> None:
        if self.race:
            self.race = False
            self.ended(InstanceResult(1, "h2", exit_code=3))  # fail_fast: stop("instance 1...")

    @property
    def stopping(self) -> bool:
        seen = super().stopping
        if not seen:
            self._fail()
        return seen

    def stop(self, reason: str) -> bool:
        self._fail()
        return super().stop(reason)


def test_a_failure_between_the_clocks_check_and_their_stop_stays_the_root_cause() -> None:
    control = FailsMeanwhile()
    clocks = Clocks(control, Progress([0, 1]), {0: "h1", 1: "h2"}, timeout=5.0)
    try:
        from poprun_py.core.result import JobCause

        clocks._fire(JobCause("timed out after 5 s", 124))
    finally:
        control.close()
    assert control.stop_reason == "instance 1 on h2 failed"
    assert clocks.cause is None  # the failure, exit 3, stays the cause: not 124


def test_stop_says_whether_it_was_first() -> None:
    control = Control()
    try:
        assert control.stop("a") and not control.stop("b") and control.stop_reason == "a"
        control.next_attempt()
        control.interrupt()
        assert not control.stop("c")  # the user stopped it first
    finally:
        control.close()


def interrupted_within(seconds: float) -> bool:
    """Send SIGINT to this process -- a forked child's (:func:`in_child`), never pytest's;
    True when KeyboardInterrupt came (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    try:
        os.kill(os.getpid(), signal.SIGINT)  # the handler may run as os.kill returns
        while time.monotonic() < deadline:
            time.sleep(0.01)
    except KeyboardInterrupt:
        return True
    return False


def test_a_stop_signal_between_attempts_raises_again() -> None:
    def run() -> tuple[bool, int, bool, bool]:  # in a forked child: the signals go to it
        control = Control()
        try:
            with handling_signals(control):
                control.arm()  # attempt 0 runs: a signal interrupts it
                during = interrupted_within(0.2), control.interrupts
                control.interrupts = 0  # (as if attempt 0 had failed instead)
                control.next_attempt()  # the restart: reconnect, preflight, stage
                return (*during, control.armed, interrupted_within(5.0))
        finally:
            control.close()

    raised, interrupts, armed, raised_between = in_child(run)
    assert (raised, interrupts) == (False, 1)  # attempt 0: interrupted, no exception
    assert not armed and raised_between  # between attempts: KeyboardInterrupt again


CONNECT_TIMEOUT = 60.0
"""How long the slow preflight below would take without the Ctrl-C."""


class SlowReconnect(FakeBackend):
    """Attempt 0 loses host h2; the restart's session is slow to preflight, and the user's
    Ctrl-C comes meanwhile (sent to this process: run it in a forked child)."""

    def open(self, prep: Prepared, settings: RunSettings) -> FakeSession:
        session = super().open(prep, settings)
        if len(self.opened) < 2:
            return session
        backend = self

        class Slow(FakeSession):
            def preflight(self, prep: Prepared) -> object:  # type: ignore[override]
                backend.calls.append("slow preflight")
                os.kill(os.getpid(), signal.SIGINT)
                deadline = time.monotonic() + CONNECT_TIMEOUT
                while time.monotonic() < deadline:
                    time.sleep(0.01)
                return super().preflight(prep)

        return Slow(self)


def test_ctrl_c_during_a_restarts_preflight_interrupts_it() -> None:
    prep = prepared(max_restarts=1)
    fake = SlowReconnect(attempts=[{1: Script(lost=True, after=0.01)}, {}])

    def run() -> tuple[bool, int, list[str], float]:  # in a forked child: SIGINT goes to it
        t0 = time.monotonic()
        result = launch(prep, RunSettings(), backend=fake)
        return result.interrupted, result.exit_code, fake.calls, time.monotonic() - t0

    interrupted, exit_code, calls, took = in_child(run, within=2 * CONNECT_TIMEOUT)
    assert interrupted and exit_code != 0
    assert "slow preflight" in calls and calls.count("start") == 1  # no attempt 1
    # interrupted, not waited out: half the 60 s "connect timeout" is generous for a loaded
    # machine (a 1-CPU run included)
    assert took < CONNECT_TIMEOUT / 2
    assert calls.count("close") == calls.count("open")


def test_sigusr1_does_not_cut_the_restart_delay_short() -> None:
    """SIGUSR1 (a forward, ignored between attempts) writes to the Control's wake-up pipe as
    every signal does; the delay is waited out all the same. A thread of a forked child sends
    it to that child every 0.05 s, never to pytest (a late one can only end the child)."""
    delay = 1.0
    prep = prepared(max_restarts=1, restart_delay=delay)
    fake = FakeBackend(attempts=[{0: Script(exit_code=3)}, {}])

    def run() -> tuple[bool, dict[int, float]]:
        running: dict[int, float] = {}
        stop = threading.Event()

        def usr1() -> None:
            while not stop.wait(0.05):
                os.kill(os.getpid(), signal.SIGUSR1)

        sender = threading.Thread(target=usr1, daemon=True)

        def on_running(k: int) -> None:
            running[k] = time.monotonic()
            if k == 0:
                sender.start()
            else:
                stop.set()
                sender.join()  # before launch() gives SIGUSR1 its default back (it kills)

        result = launch(prep, RunSettings(on_running=on_running), backend=fake)
        return result.ok, running

    ok, running = in_child(run)
    assert ok and sorted(running) == [0, 1]
    assert running[1] - running[0] >= delay - 0.1  # the delay was waited out


# ---------------------------------------------------------------- 5. restarts told at once


def test_each_restart_is_told_before_the_next_attempt_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prep = prepared(max_restarts=2, restart_delay=0.05)
    fake = FakeBackend(attempts=[{0: Script(exit_code=7)}, {1: Script(exit_code=9)}, {}])
    told: list[tuple[int, list[str]]] = []

    def on_running(k: int) -> None:
        told.append((k, [r.getMessage() for r in caplog.records]))

    with caplog.at_level(logging.INFO, logger=ANNOUNCE.name):
        result = launch(prep, RunSettings(on_running=on_running), backend=fake)
    assert result.ok
    assert told[1] == (
        1,
        [
            "attempt 0 failed: instance 0 on h1 exited with code 7; restarting (1/2) in 0.05 s",
            "attempt 1 running (restart 1/2)",
        ],
    )
    assert told[2][1][2:] == [
        "attempt 1 failed: instance 1 on h2 exited with code 9; restarting (2/2) in 0.05 s",
        "attempt 2 running (restart 2/2)",
    ]
