"""Failures and interrupts with real processes: who is stopped, how, and that nothing is left."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import (
    left_behind,
    make_job,
    plan_for,
    run_local,
    start_driver,
    unique_sleep,
    wait_ready,
    zombies,
)

PY = sys.executable


@pytest.mark.requires("pgrep")
def test_one_failure_stops_the_others_and_is_the_root_cause(tmp_path: Path) -> None:
    marker = unique_sleep()
    script = f'if [ "$RANK" = 2 ]; then sleep 0.3; exit 3; fi; exec sleep {marker}'
    plan = plan_for(["sh", "-c", script], "h1,h2", instances=4)
    start = time.monotonic()
    result, _ = run_local(plan, tmp_path, grace_period=5)
    # stopped at the failure, not when the sleepers' 40 s end: "< 30" is generous for a loaded
    # 2-core machine (or one CPU), with the 5 s grace period the sleepers do not need
    assert time.monotonic() - start < 30, "stopped at once, not after the sleepers' time"
    assert result.exit_code == 3
    assert result.root_cause is not None and result.root_cause.index == 2
    assert [r.index for r in result.failures] == [2]
    others = [r for r in result.instances if r.index != 2]
    assert {(r.state, r.signal) for r in others} == {("stopped", signal.SIGTERM)}
    assert left_behind(f"sleep {marker}") == []
    assert zombies() == []


@pytest.mark.requires("pgrep")
def test_instance_killed_by_a_signal_is_a_failure(tmp_path: Path) -> None:
    marker = unique_sleep()
    script = f'if [ "$RANK" = 1 ]; then kill -9 $$; fi; exec sleep {marker}'
    result, _ = run_local(plan_for(["sh", "-c", script], "h1", instances=2), tmp_path)
    assert result.exit_code == 128 + signal.SIGKILL
    assert result.root_cause is not None and result.root_cause.signal == signal.SIGKILL
    assert left_behind(f"sleep {marker}") == []


@pytest.mark.requires("pgrep")
def test_instance_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    marker = unique_sleep()
    ready = tmp_path / "ready"
    stubborn = (
        "import signal, time, pathlib, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(float(sys.argv[1]))"
    )
    script = (
        f'if [ "$RANK" = 0 ]; then while [ ! -e "{ready}" ]; do sleep 0.02; done; exit 4; fi; '
        f'exec {PY} -c "$0" {marker}'
    )
    plan = plan_for(["sh", "-c", script, stubborn], "h1", instances=2)
    result, lines = run_local(plan, tmp_path, grace_period=0.5)
    assert result.exit_code == 4, lines
    stubborn_result = result.instances[1]
    assert (stubborn_result.state, stubborn_result.signal) == ("stopped", signal.SIGKILL)
    # killed after the 0.5 s grace period, not before; and not when its 40 s sleep ends ("< 30":
    # generous for a loaded machine)
    assert 0.5 <= stubborn_result.ended - result.instances[0].ended < 30
    assert left_behind(marker) == []


def until_running(marker: str) -> str:
    """Shell words that wait (polling, 30 s at most) until ``sleep MARKER`` runs: the escaped
    process exists before the instance goes on, however loaded the machine (not a fixed sleep)."""
    return (
        f"i=0; until pgrep -f 'sleep {marker}$' >/dev/null || [ $i -ge 3000 ]; "
        "do sleep 0.01; i=$((i+1)); done"
    )


@pytest.mark.parametrize("job_fails", [False, True], ids=["job-succeeds", "job-fails"])
@pytest.mark.requires("pgrep")
def test_grandchild_that_called_setsid_is_stopped(tmp_path: Path, job_fails: bool) -> None:
    marker = unique_sleep()
    escape = f"setsid sleep {marker} & {until_running(marker)}"
    last = f'if [ "$RANK" = 1 ]; then exit 5; fi; exec sleep {marker}' if job_fails else "exit 0"
    plan = plan_for(["sh", "-c", f"{escape}; {last}"], "h1", instances=2)
    result, _ = run_local(plan, tmp_path, grace_period=1)
    assert result.exit_code == (5 if job_fails else 0)
    assert left_behind(f"sleep {marker}") == []
    assert zombies() == []


@pytest.mark.requires("pgrep")
def test_double_forked_orphan_with_a_cleared_environment_is_stopped(tmp_path: Path) -> None:
    marker = unique_sleep()
    orphan = f"env -i /usr/bin/setsid /bin/sh -c 'sleep {marker} >/dev/null 2>&1 &'"
    plan = plan_for(["sh", "-c", f"{orphan}; {until_running(marker)}"], "h1", instances=1)
    result, _ = run_local(plan, tmp_path, grace_period=1)
    assert result.ok
    assert left_behind(f"sleep {marker}") == []
    assert zombies() == []


DRIVER = """
import json, pickle, sys
from poprun_py.core.result import RunOptions
from poprun_py.backends.local import LocalBackend
job = pickle.load(open(sys.argv[1], "rb"))
result = LocalBackend().run(job, RunOptions(grace_period=1.0))
print(json.dumps({"interrupted": result.interrupted, "exit_code": result.exit_code,
                  "states": [r.state for r in result.instances]}), flush=True)
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
@pytest.mark.requires("pgrep")
def test_interrupting_the_launcher_stops_everything(tmp_path: Path, sig: int) -> None:
    marker = unique_sleep()
    script = f"echo ready; exec sleep {marker}"
    job = make_job(plan_for(["sh", "-c", script], "h1,h2", instances=4), tmp_path / "job")
    driver = start_driver(DRIVER, job, tmp_path)
    wait_ready(driver, 4, "instance")
    driver.send_signal(sig)
    out, _ = driver.communicate(timeout=20)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"interrupted": True, "exit_code": 130, "states": ["stopped"] * 4}
    assert driver.returncode == 0
    assert left_behind(f"sleep {marker}") == []


def test_signal_handlers_are_restored_after_a_run(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run_local(plan_for(["true"], "h1", instances=1), tmp_path)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.requires("pgrep")
def test_without_pidfds_exits_are_polled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from poprun_py.process import supervise

    monkeypatch.setattr(supervise, "open_pidfd", lambda pid: None)
    marker = unique_sleep()
    script = f'if [ "$RANK" = 1 ]; then sleep 0.2; exit 6; fi; exec sleep {marker}'
    result, _ = run_local(plan_for(["sh", "-c", script], "h1", instances=3), tmp_path)
    assert result.exit_code == 6 and result.root_cause is not None
    assert result.root_cause.index == 1
    assert left_behind(f"sleep {marker}") == []


@pytest.mark.parametrize("new_session", [True, False], ids=["session", "group"])
@pytest.mark.requires("pgrep")
def test_supervise_stops_groups_and_escapees_in_either_mode(new_session: bool) -> None:
    from poprun_py.core.result import RunOptions
    from poprun_py.process.output import Output
    from poprun_py.process.supervise import Child, supervise

    marker = unique_sleep()
    sleeper = f"setsid sleep {marker} & exec sleep {marker}"
    children = [Child(i, "h1", ("sh", "-c", sleeper)) for i in range(3)]
    children.append(Child(3, "h1", ("sh", "-c", "sleep 0.3; exit 7")))
    output = Output(RunOptions(sink=lambda *line: None), {c.index: c.host for c in children})
    run = supervise(children, output, grace_period=2, new_session=new_session)
    assert [e.state for e in run.exits] == ["stopped"] * 3 + ["exited"]
    assert run.exits[3].returncode == 7
    assert left_behind(f"sleep {marker}") == []
    assert zombies() == []


@pytest.mark.parametrize("new_session", [True, False], ids=["session", "group"])
def test_each_child_leads_its_own_group_and_session_when_asked(new_session: bool) -> None:
    from poprun_py.core.result import RunOptions
    from poprun_py.process.output import Output
    from poprun_py.process.supervise import Child, supervise

    code = "import os; print(os.getpgrp() == os.getpid(), os.getsid(0) == os.getpid())"
    lines: list[str] = []
    output = Output(RunOptions(sink=lambda i, s, line: lines.append(line)), {0: "h1"})
    supervise([Child(0, "h1", (PY, "-c", code))], output, new_session=new_session)
    assert lines == [f"True {new_session}"]
