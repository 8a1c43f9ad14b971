"""Long runs against the shipped fakes: whole-job restarts, their counts and causes, spares in
the place of lost hosts, the clocks (--timeout, --hang-timeout with stack dumps), forwarded
signals, and the bad input that starts nothing."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from poprun_py.core.result import LaunchResult, RunOptions, RunSettings
from poprun_py.errors import EXIT_INTERRUPTED, EXIT_LOST, EXIT_TIMEOUT, UsageError
from poprun_py.launch.launcher import launch
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare
from poprun_py.process.signals import Control
from poprun_py.render.job import RenderedJob
from poprun_py.testing.fakes import FakeBackend, FakeRunning, Script
from tests.unit.in_child import in_child


def prepared(hosts: str = "h1,h2,h3,h4", **long_run: object) -> Prepared:
    opts = LaunchOptions(hosts=hosts, program=("train.py",), grace_period=0.3, **long_run)  # type: ignore[arg-type]
    return prepare(opts, environ={})


def launch_signalled(
    fake: FakeBackend, prep: Prepared, signum: int, after: float
) -> tuple[LaunchResult, FakeBackend]:
    """``launch`` run in a forked child that gets ``signum`` ``after`` seconds in (a late signal
    can only end that child, never this pytest session); its result and the fake's record."""

    def run() -> tuple[LaunchResult, FakeBackend]:
        return launch(prep, RunSettings(), backend=fake), fake

    return in_child(run, signals=[(after, signum)])


def counts(fake: FakeBackend, key: str = "POPRUN_RESTART_COUNT") -> list[list[str]]:
    return [[c.env[key] for c in job.instances] for job in fake.started_jobs]


def test_a_failed_attempt_restarts_the_whole_job_over_the_same_session() -> None:
    fake = FakeBackend(attempts=[{2: Script(exit_code=3, after=0.05), 0: Script(hang=True)}, {}])
    result = launch(prepared(max_restarts=2), RunSettings(), backend=fake)
    assert result.ok and result.exit_code == 0
    assert [a.exit_code for a in result.attempts] == [3]
    assert result.attempts[0].root_cause is not None and result.attempts[0].root_cause.index == 2
    assert counts(fake) == [["0"] * 4, ["1"] * 4]
    assert counts(fake, "TORCHELASTIC_RESTART_COUNT") == [["0"] * 4, ["1"] * 4]
    assert fake.calls.count("open") == 1 and fake.calls.count("preflight") == 1
    assert fake.calls[-1] == "close"


def test_restarts_running_out_give_the_last_attempts_code() -> None:
    fake = FakeBackend(attempts=[{1: Script(exit_code=3)}, {1: Script(exit_code=5)}])
    result = launch(prepared(max_restarts=2), RunSettings(), backend=fake)
    assert [a.exit_code for a in result.attempts] == [3, 5]
    assert result.exit_code == 5 and len(fake.started_jobs) == 3


def test_no_restart_without_max_restarts() -> None:
    fake = FakeBackend({1: Script(exit_code=3)})
    result = launch(prepared(), RunSettings(), backend=fake)
    assert result.exit_code == 3 and result.attempts == () and len(fake.started_jobs) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_never_restarts(signum: int) -> None:
    fake = FakeBackend({i: Script(hang=True) for i in range(4)})
    result, fake = launch_signalled(fake, prepared(max_restarts=3), signum, 0.2)
    assert result.interrupted and result.exit_code == EXIT_INTERRUPTED
    assert len(fake.started_jobs) == 1


def test_an_interrupt_during_the_restart_delay_ends_the_job() -> None:
    fake = FakeBackend({1: Script(exit_code=3)})
    started = time.monotonic()
    prep = prepared(max_restarts=3, restart_delay=30.0)
    result, fake = launch_signalled(fake, prep, signal.SIGINT, 0.3)
    assert time.monotonic() - started < 20  # not the 30 s delay (generous: a loaded machine)
    assert result.interrupted and len(fake.started_jobs) == 1


def test_the_restart_delay_is_waited() -> None:
    fake = FakeBackend(attempts=[{1: Script(exit_code=3)}, {}])
    started = time.monotonic()
    result = launch(prepared(max_restarts=1, restart_delay=0.5), RunSettings(), backend=fake)
    assert result.ok and time.monotonic() - started >= 0.5


def test_timeout_stops_the_job_with_its_own_cause_and_124() -> None:
    fake = FakeBackend({i: Script(hang=True) for i in range(4)})
    started = time.monotonic()
    result = launch(prepared(timeout="1s"), RunSettings(), backend=fake)
    took = time.monotonic() - started
    assert result.cause is not None and result.cause.reason == "timed out after 1 s"
    assert result.exit_code == EXIT_TIMEOUT and not result.ok
    assert all(r.state == "stopped" for r in result.instances)
    assert 1.0 <= took < 20  # not early; the upper bound only says "not never" (a loaded machine)


def test_a_timed_out_attempt_is_restarted() -> None:
    fake = FakeBackend(attempts=[{0: Script(hang=True)}, {}])
    result = launch(prepared(timeout="0.5", max_restarts=1), RunSettings(), backend=fake)
    assert result.ok and result.attempts[0].exit_code == EXIT_TIMEOUT


def test_a_hang_dumps_every_stack_then_stops_with_the_hung_instance_named() -> None:
    lines: list[tuple[int, str, str]] = []
    scripts = {i: Script(hang=True, faulthandler=True) for i in range(4)}
    fake = FakeBackend(scripts)
    settings = RunSettings(sink=lambda i, s, line: lines.append((i, s, line)))
    started = time.monotonic()
    result = launch(prepared(hang_timeout=0.5), settings, backend=fake)
    assert time.monotonic() - started < 20  # found at all (generous: a loaded machine)
    assert result.cause is not None and result.exit_code == EXIT_TIMEOUT
    assert result.cause.reason == "instance 0 on h1 hung (no progress for 0.5 s)"
    assert fake.dumps == [(0, i, "faulthandler") for i in range(4)]  # no py-spy: SIGUSR1
    stacks = {i for i, stream, line in lines if "most recent call first" in line}
    assert stacks == {0, 1, 2, 3}
    assert not any("poprun-py:" in line for _, _, line in lines)  # markers swallowed


def test_a_hang_is_dumped_by_py_spy_where_it_can_and_by_faulthandler_elsewhere() -> None:
    lines: list[tuple[int, str, str]] = []
    scripts = {i: Script(hang=True, faulthandler=i != 3, pyspy=i < 2) for i in range(4)}
    fake = FakeBackend(scripts)
    settings = RunSettings(sink=lambda i, s, line: lines.append((i, s, line)))
    result = launch(prepared(hang_timeout=0.3), settings, backend=fake)
    assert result.exit_code == EXIT_TIMEOUT and fake.signals == []
    hows = ["py-spy", "py-spy", "faulthandler", "none"]
    assert fake.dumps == [(0, i, how) for i, how in enumerate(hows)]
    assert {i for i, s, line in lines if '(idle): "MainThread"' in line and s == "stderr"} == {0, 1}
    assert {i for i, _, line in lines if "most recent call first" in line} == {2}


def test_no_stack_signal_to_instances_that_did_not_register_faulthandler() -> None:
    scripts = {i: Script(hang=True, faulthandler=i != 2) for i in range(4)}
    fake = FakeBackend(scripts)
    result = launch(prepared(hang_timeout=0.3), RunSettings(), backend=fake)
    assert result.exit_code == EXIT_TIMEOUT and fake.signals == []
    assert [how for _, i, how in fake.dumps if i == 2] == ["none"]


class Chatty(FakeBackend):
    """Fake instances that, while running, print a line every ``every`` seconds (None: never)."""

    def __init__(self, scripts: dict[int, Script], every: float | None) -> None:
        super().__init__(scripts)
        self.every = every

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> FakeRunning:
        running = super().start(job, options, control)
        if self.every is not None:
            threading.Thread(target=self._chatter, args=(running, self.every), daemon=True).start()
        return running

    @staticmethod
    def _chatter(running: FakeRunning, every: float) -> None:
        deadline = time.monotonic() + 60  # never outlives the test for long
        while len(running.results) < len(running.hosts) and time.monotonic() < deadline:
            for index in list(running.hosts):
                if index not in running.results:
                    running._say(index, "stdout", f"step of {index}")
            time.sleep(every)


@pytest.mark.parametrize("chatty", [True, False], ids=["printing", "silent"])
def test_output_is_progress(chatty: bool) -> None:
    """Instances that run three hang timeouts long: printing a line every 0.05 s keeps them
    from being hung; the same instances silent are hung. They are still running when the clock
    would fire (an ended instance is never hung), so their output is all that keeps them."""
    fake = Chatty({i: Script(after=3.0) for i in range(4)}, every=0.05 if chatty else None)
    lines: list[tuple[int, str]] = []
    settings = RunSettings(sink=lambda i, s, line: lines.append((i, line)))
    result = launch(prepared(hang_timeout=1.0), settings, backend=fake)
    if chatty:
        assert result.ok, result.cause
        assert [r.state for r in result.instances] == ["exited"] * 4
        assert {i for i, line in lines if line == f"step of {i}"} == {0, 1, 2, 3}
    else:
        assert result.exit_code == EXIT_TIMEOUT and result.cause is not None
        assert "hung (no progress for 1 s)" in result.cause.reason, result.cause.reason


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGUSR2])
def test_usr1_and_usr2_are_forwarded_and_the_job_goes_on(signum: int) -> None:
    fake = FakeBackend({i: Script(after=2.0) for i in range(4)})  # still running at 0.2 s
    result, fake = launch_signalled(fake, prepared(), signum, 0.2)
    assert result.ok and fake.signals == [(0, signum)]


def test_a_lost_host_is_replaced_by_a_spare_with_the_same_layout(tmp_path: Path) -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True, after=0.05), 0: Script(hang=True)}, {}])
    prep = prepared(hosts="h1,h2,h3", max_restarts=1, spare_hosts="s1,s2", replicas=6)
    result = launch(prep, RunSettings(output_dir=str(tmp_path)), backend=fake)
    assert result.ok and result.attempts[0].exit_code == EXIT_LOST
    assert result.replaced == (("h2", "s1"),)
    assert sorted(fake.opened[:2]) == [("h1", "h2", "h3"), ("s1", "s2")]
    assert fake.opened[2:] == [("h1", "s1", "h3")]
    first, second = fake.started_jobs
    assert [c.host for c in second.instances] == ["h1", "s1", "h3"]
    replicas = "POPDIST_NUM_LOCAL_REPLICAS"
    assert [c.env[replicas] for c in first.instances] == [c.env[replicas] for c in second.instances]
    assert fake.calls.count("close") == 3  # hosts, spares (preflighted, held back), restart
    record = json.loads((tmp_path / "plan-restart-1.json").read_text())
    assert record["replaced"] == {"h2": "s1"} and record["plan"]["hosts"][1]["name"] == "s1"


def test_a_lost_host_that_answers_again_is_reused_without_a_spare() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}])
    result = launch(prepared(hosts="h1,h2", max_restarts=1), RunSettings(), backend=fake)
    assert result.ok and fake.opened == [("h1", "h2"), ("h1", "h2")]


def test_a_lost_host_that_stays_away_without_a_spare_fails_the_restart_in_one_line() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}], down=("h2",))
    result = launch(prepared(hosts="h1,h2", max_restarts=2), RunSettings(), backend=fake)
    assert result.exit_code == EXIT_LOST and len(fake.started_jobs) == 1
    assert result.restart_failed.startswith("cannot restart: host h2 was lost")
    assert "\n" not in result.restart_failed


def test_a_spare_also_takes_the_place_of_a_host_that_fails_preflight_again() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True), 2: Script(lost=True)}, {}], down=("h3",))
    prep = prepared(hosts="h1,h2,h3", max_restarts=1, spare_hosts="s1,s2")
    result = launch(prep, RunSettings(), backend=fake)
    assert result.ok and result.replaced == (("h2", "s1"), ("h3", "s2"))


def test_spares_and_max_restarts_come_from_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "name: c\nhosts:\n  - name: h[1-2]\nspares:\n  - name: s1\n    address: 198.18.0.9\n"
        "defaults:\n  max_restarts: 2\n  timeout: 2h\n  hang_timeout: 60\n"
    )
    prep = prepare(LaunchOptions(cluster=str(spec), program=("t",)), environ={})
    long_run = prep.long_run
    assert (long_run.max_restarts, long_run.timeout, long_run.hang_timeout) == (2, 7200.0, 60.0)
    assert [(s.name, s.address) for s in long_run.spares] == [("s1", "198.18.0.9")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_restarts": -1}, "--max-restarts must be 0 or more"),
        ({"timeout": "soon"}, "--timeout: 'soon' is not a duration"),
        ({"hang_timeout": 0.0}, "--hang-timeout must be more than 0"),
        ({"spare_hosts": "h2"}, "spare host h2 is also a planned host"),
        ({"spare_hosts": "4"}, "--spare-hosts 4: more spares than"),
        ({"restart_delay": -1.0}, "--restart-delay must be 0 or more"),
    ],
)
def test_bad_long_run_input_is_one_line_exit_2(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as err:
        prepared(**options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_spare_hosts_n_holds_back_the_last_n_hosts() -> None:
    prep = prepared(hosts="h1,h2,h3,h4", spare_hosts="1")
    assert [h.name for h in prep.plan.hosts] == ["h1", "h2", "h3"]
    assert [s.name for s in prep.long_run.spares] == ["h4"]


def test_the_instance_side_markers_are_the_ones_poprun_py_swallows() -> None:
    from poprun_py import dist
    from poprun_py.process import progress

    assert dist.HEARTBEAT_LINE.rstrip(b"\n") == progress.HEARTBEAT
    assert dist.FAULTHANDLER_LINE.rstrip(b"\n") == progress.FAULTHANDLER
    assert dist.RESTART_COUNT == "POPRUN_RESTART_COUNT"
    assert progress.step_of((dist.STEP_LINE % 7).rstrip(b"\n")) == 7


STEPS = """
import time
from poprun_py import dist
for step in range(1, 6):
    dist.heartbeat(step=step)  # 1 is told; 2-5 come within 0.1 s of it
time.sleep(0.15)
dist.heartbeat(step=6)  # told: 0.1 s passed
dist.heartbeat(step=7)  # not now: at exit
"""


def test_heartbeat_with_steps_tells_them_rate_limited_and_the_last_one_at_exit() -> None:
    import subprocess
    import sys

    from poprun_py.process import progress

    env = {"POPRUN_RESTART_COUNT": "0", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", STEPS], env=env, capture_output=True, check=True, timeout=30
    )
    lines = done.stderr.splitlines()
    assert all(progress.is_marker(line) for line in lines), lines
    assert [progress.step_of(line) for line in lines if progress.step_of(line)] == [1, 6, 7]
    quiet = subprocess.run(
        [sys.executable, "-c", STEPS],
        env={"PYTHONPATH": env["PYTHONPATH"]},
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert quiet.stderr == b""  # not started by poprun-py: nothing


def test_progress_keeps_each_instances_last_step_and_markers_are_recognised() -> None:
    from poprun_py.process.progress import STEP, Progress, is_marker, step_of

    p = Progress([0, 1], now=0.0)
    assert p.last_step is None
    assert p.seen(0, STEP + b"5]", now=1.0) and p.seen(1, STEP + b"3]\r", now=1.0)
    assert p.seen(0, STEP + b"4]", now=1.0) and p.last_step == 5  # a step never goes back
    assert p.last(0) == p.last(1) == 1.0  # a step is progress
    assert not p.seen(0, "step 9 loss 0.1") and p.last_step == 5
    assert [step_of(x) for x in (STEP + b"x]", STEP + b"12", b"step 3]")] == [None, None, None]
    assert not is_marker(STEP + b"]") and is_marker(STEP + b"0]")


def test_output_swallows_markers_and_counts_every_line_as_progress(tmp_path: Path) -> None:
    from poprun_py.core.result import RunOptions
    from poprun_py.process.output import Output
    from poprun_py.process.progress import HEARTBEAT, Progress

    shown: list[str] = []
    progress = Progress([0], now=0.0)
    opts = RunOptions(
        output_dir=tmp_path, sink=lambda i, s, line: shown.append(line), progress=progress
    )
    out = Output(opts, {0: "h1"})
    out.emit(0, "stderr", HEARTBEAT)
    out.emit(0, "stdout", b"step 1")
    out.close()
    assert shown == ["step 1"] and progress.last(0) > 0.0
    assert (tmp_path / "instance-0.log").read_text() == "step 1\n"
    again = Output(RunOptions(output_dir=tmp_path, sink=lambda *a: None, attempt=1), {0: "h1"})
    again.emit(0, "stdout", b"step 2")
    again.close()
    assert (tmp_path / "instance-0.log").read_text() == "step 1\nstep 2\n"


def test_spares_are_preflighted_and_one_that_fails_is_not_used() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}], refuse=("s1",))
    prep = prepared(hosts="h1,h2", max_restarts=1, spare_hosts="s1,s2")
    result = launch(prep, RunSettings(), backend=fake)
    assert result.ok and result.replaced == (("h2", "s2"),)
    assert sorted(fake.opened[:2]) == [("h1", "h2"), ("s1", "s2")]  # preflighted side by side
    assert fake.opened[2:] == [("h1", "s2")]
