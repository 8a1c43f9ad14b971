"""The launcher's orchestration rules, against the shipped fakes: the lifecycle order, fail-fast
and its root cause, exit-code mapping, and the one signal path (INT, TERM, HUP)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from poprun_py.core.result import InstanceResult, LaunchResult, RunSettings
from poprun_py.errors import EXIT_INTERRUPTED, EXIT_LOST, Fault, PreflightError
from poprun_py.launch.launcher import launch
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare
from poprun_py.process.signals import Control
from poprun_py.testing.fakes import FakeBackend, Script
from tests.unit.in_child import in_child


def prepared(hosts: str = "h1,h2,h3,h4", grace: float = 0.5) -> Prepared:
    opts = LaunchOptions(hosts=hosts, program=("train.py",), grace_period=grace)
    return prepare(opts, environ={})


def launch_signalled(
    fake: FakeBackend, prep: Prepared, signum: int, after: float, times: int = 1
) -> tuple[LaunchResult, FakeBackend, bool]:
    """``launch`` run in a forked child that gets ``signum`` ``times`` times, ``after`` seconds
    apart (a late signal can only end that child, never this pytest session): its result, the
    fake's record, and whether ``signum``'s handler afterwards is the one from before."""

    def run() -> tuple[LaunchResult, FakeBackend, bool]:
        old = signal.getsignal(signum)
        result = launch(prep, RunSettings(), backend=fake)
        return result, fake, signal.getsignal(signum) == old

    return in_child(run, signals=[(after, signum)] * times)


def test_the_lifecycle_runs_in_order_and_the_session_is_always_closed() -> None:
    fake = FakeBackend()
    result = launch(prepared(), RunSettings(), backend=fake)
    assert result.ok and result.exit_code == 0
    assert fake.calls == ["open", "preflight", "stage", "start", "wait", "tidy", "close"]


@pytest.mark.parametrize(
    ("settings", "ok"),
    [
        (RunSettings(keep_job_dir=True), True),
        (RunSettings(output_dir="out"), True),
        (RunSettings(), False),
    ],
    ids=["kept", "output-dir", "failed"],
)
def test_the_hosts_job_directory_is_tidied_only_after_a_success_that_keeps_none(
    settings: RunSettings, ok: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fake = FakeBackend(scripts={} if ok else {0: Script(exit_code=3)})
    result = launch(prepared(), settings, backend=fake)
    assert result.ok is ok
    assert "tidy" not in fake.calls and fake.calls[-1] == "close"


def test_sync_happens_between_preflight_and_rendering() -> None:
    fake = FakeBackend()
    launch(prepared(), RunSettings(sync=True), backend=fake)
    assert fake.calls[:3] == ["open", "preflight", "sync"]


def test_the_first_failure_stops_the_rest_and_is_the_root_cause() -> None:
    fake = FakeBackend(
        {
            0: Script(hang=True),
            1: Script(exit_code=7, after=0.05),
            2: Script(exit_code=9, after=30.0),  # would fail later, but is stopped first
            3: Script(hang=True),
        }
    )
    started = time.monotonic()
    result = launch(prepared(), RunSettings(), backend=fake)
    assert time.monotonic() - started < 20  # at the first failure, not at 30 s (loaded machine)
    assert result.root_cause is not None and result.root_cause.index == 1
    assert result.exit_code == 7
    assert [r.state for r in result.instances] == ["stopped", "exited", "stopped", "stopped"]


def test_the_earliest_of_several_failures_is_the_root_cause() -> None:
    fake = FakeBackend({0: Script(exit_code=4, after=0.1), 1: Script(exit_code=5, after=0.02)})
    result = launch(prepared("h1,h2"), RunSettings(), backend=fake)
    assert result.root_cause is not None and result.root_cause.index == 1
    assert result.exit_code == 5


def test_a_lost_host_is_the_root_cause_with_the_documented_code() -> None:
    fake = FakeBackend({0: Script(hang=True), 1: Script(lost=True, after=0.02)})
    result = launch(prepared("h1,h2"), RunSettings(), backend=fake)
    assert result.root_cause is not None and result.root_cause.state == "lost"
    assert result.exit_code == EXIT_LOST == 255


def test_preflight_faults_start_nothing_and_close_the_session() -> None:
    fake = FakeBackend(faults=[Fault("h2", "tools", "mpirun not found on PATH")])
    with pytest.raises(PreflightError) as err:
        launch(prepared(), RunSettings(), backend=fake)
    assert err.value.exit_code == 3
    assert "start" not in fake.calls and fake.calls[-1] == "close"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_int_term_and_hup_stop_every_instance_the_same_way(signum: int) -> None:
    fake = FakeBackend({i: Script(hang=True) for i in range(4)})
    result, fake, restored = launch_signalled(fake, prepared(), signum, 0.1)
    assert result.interrupted and result.exit_code == EXIT_INTERRUPTED
    assert all(r.state == "stopped" for r in result.instances)
    assert restored  # the handler from before launch is back
    assert fake.calls[-1] == "close"


def test_an_instance_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    fake = FakeBackend({0: Script(hang=True, ignores_term=True), 1: Script(exit_code=2)})
    started = time.monotonic()
    result = launch(prepared("h1,h2", grace=0.3), RunSettings(), backend=fake)
    assert 0.3 <= time.monotonic() - started < 15  # not before the grace period; "< 15": not
    # forever (generous: a loaded machine)
    assert result.instances[0].signal == 9 and result.exit_code == 2


def test_a_second_interrupt_kills_at_once() -> None:
    fake = FakeBackend({0: Script(hang=True, ignores_term=True)})
    started = time.monotonic()
    result, fake, _ = launch_signalled(fake, prepared("h1", grace=60), signal.SIGINT, 0.1, times=2)
    assert time.monotonic() - started < 30  # not the 60 s grace period (a loaded machine)
    assert result.interrupted and result.instances[0].signal == 9


def test_a_signal_before_the_job_runs_raises_and_still_closes_the_session() -> None:
    class SlowPreflight(FakeBackend):
        def open(self, prep: Prepared, settings: RunSettings):  # type: ignore[no-untyped-def]
            session = super().open(prep, settings)
            original = session.preflight

            def preflight(p: Prepared):  # type: ignore[no-untyped-def]
                os.kill(os.getpid(), signal.SIGINT)  # the forked child's own pid, not pytest's
                time.sleep(1)  # interrupted by the signal
                return original(p)

            session.preflight = preflight  # type: ignore[method-assign]
            return session

    fake = SlowPreflight()

    def run() -> tuple[bool, list[str]]:  # in a forked child: the SIGINT goes to it
        try:
            launch(prepared(), RunSettings(), backend=fake)
        except KeyboardInterrupt:
            return True, fake.calls
        return False, fake.calls

    raised, calls = in_child(run)
    assert raised  # KeyboardInterrupt out of launch
    assert "start" not in calls and calls[-1] == "close"


def test_the_policy_decides_what_a_failure_means() -> None:
    seen: list[int] = []

    def keep_going(control: Control, result: InstanceResult) -> None:
        seen.append(result.index)

    fake = FakeBackend({0: Script(exit_code=1), 1: Script(exit_code=0, after=0.1)})
    result = launch(prepared("h1,h2"), RunSettings(), backend=fake, policy=keep_going)
    assert [r.state for r in result.instances] == ["exited", "exited"]  # 1 was not stopped
    assert sorted(seen) == [0, 1] and result.exit_code == 1
