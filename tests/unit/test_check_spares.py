"""Bad hosts swapped before they cost a run: ``launch --check`` with spares puts a spare in the
place of every host that fails the check until it passes (poprun_py.launch.check.swap_failing),
and with --check a spare passes the check before it replaces a lost host in a restart."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from poprun_py.core.result import RunSettings
from poprun_py.errors import EXIT_LOST, Fault, PreflightError
from poprun_py.launch import check
from poprun_py.launch.check import Swap, check_prep, failing_hosts, swap_failing
from poprun_py.launch.launcher import launch
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare
from poprun_py.testing.fakes import FakeBackend, Script


def prepared(hosts: str = "h1,h2,h3", spares: str = "s1,s2", **more: object) -> Prepared:
    opts = LaunchOptions(hosts=hosts, spare_hosts=spares, program=("t",), grace_period=0.3, **more)  # type: ignore[arg-type]
    return prepare(opts, environ={})


class Checker:
    """A check that fails the hosts in ``bad`` (with their problem) and records each plan."""

    def __init__(self, bad: Mapping[str, str]):
        self.bad, self.seen = dict(bad), list[list[str]]()

    def __call__(self, prep: Prepared) -> dict[str, str]:
        names = [h.name for h in prep.plan.hosts]
        self.seen.append(names)
        return {h: self.bad[h] for h in names if h in self.bad}


def names(prep: Prepared) -> list[str]:
    return [h.name for h in prep.plan.hosts]


def test_a_host_that_fails_the_check_is_replaced_by_a_spare_and_checked_again() -> None:
    checker = Checker({"h2": "instance 1: cannot reach MASTER_ADDR 198.19.0.11:29500"})
    swapped = swap_failing(prepared(), checker)
    assert checker.seen == [["h1", "h2", "h3"], ["h1", "s1", "h3"]]
    assert names(swapped.prep) == ["h1", "s1", "h3"]
    assert swapped.swaps == (Swap("h2", "s1", checker.bad["h2"]),)
    assert [s.name for s in swapped.prep.long_run.spares] == ["s2"]  # left for restarts
    assert swapped.lines() == [f"check: spare host s1 in place of h2 ({checker.bad['h2']})"]


def test_every_failing_host_gets_a_spare_in_plan_order() -> None:
    checker = Checker({"h3": "slow: latency 9 ms", "h1": "instance 0 gave no report"})
    swapped = swap_failing(prepared(), checker)
    assert names(swapped.prep) == ["s1", "h2", "s2"]
    assert [(s.host, s.spare) for s in swapped.swaps] == [("h1", "s1"), ("h3", "s2")]
    assert len(checker.seen) == 2


def test_a_spare_that_fails_the_check_is_not_used_and_named(tmp_path: Path) -> None:
    checker = Checker({"h2": "broken", "s1": "instance 1: cannot reach MASTER_ADDR"})
    swapped = swap_failing(prepared(), checker)
    assert checker.seen == [["h1", "h2", "h3"], ["h1", "s1", "h3"], ["h1", "s2", "h3"]]
    assert swapped.swaps == (Swap("h2", "s2", "broken"),)  # why: the planned host's problem
    assert swapped.rejected == (("s1", "instance 1: cannot reach MASTER_ADDR"),)
    assert swapped.lines()[1] == (
        "check: spare host s1 failed the check (instance 1: cannot reach MASTER_ADDR): not used"
    )
    record = json.loads(swapped.write(str(tmp_path / "out")).read_text())
    assert record["replaced"] == {"h2": "s2"} and record["why"] == {"h2": "broken"}
    assert record["spares_failed"] == {"s1": "instance 1: cannot reach MASTER_ADDR"}
    assert [h["name"] for h in record["plan"]["hosts"]] == ["h1", "s2", "h3"]


def test_a_passing_check_swaps_nothing() -> None:
    prep = prepared()
    swapped = swap_failing(prep, Checker({}))
    assert swapped.prep is prep and swapped.swaps == () and swapped.lines() == []


@pytest.mark.parametrize(
    ("bad", "spares", "detail"),
    [
        (
            {"h2": "broken", "s1": "down"},
            "s1",
            "broken; spare host s1 failed too: down (no spare host left)",
        ),
        ({"h1": "broken", "h2": "broken"}, "s1", "broken (1 spare host(s) left for 2)"),
    ],
)
def test_when_spares_run_out_the_failing_hosts_are_named_exit_3(
    bad: dict[str, str], spares: str, detail: str
) -> None:
    with pytest.raises(PreflightError) as caught:
        swap_failing(prepared(spares=spares), Checker(bad))
    assert caught.value.exit_code == 3
    assert all(f.check == "check" and f.detail == detail for f in caught.value.faults)
    assert [f.host for f in caught.value.faults] == [h for h in bad if h.startswith("h")]


def test_a_host_the_check_cannot_start_on_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(prep: Prepared, *args: object) -> None:
        raise PreflightError([Fault("h3", "ssh", "connection refused"), Fault("x", "y", "z")])

    monkeypatch.setattr(check, "run_check", refused)
    assert failing_hosts(prepared()) == {"h3": "ssh: connection refused"}


def test_a_preflight_fault_of_no_planned_host_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(prep: Prepared, *args: object) -> None:
        raise PreflightError([Fault("this machine", "python", "missing")])

    monkeypatch.setattr(check, "run_check", refused)
    with pytest.raises(PreflightError):
        failing_hosts(prepared())


def test_the_check_itself_runs_once_without_spares_or_clocks() -> None:
    prep = prepared(max_restarts=3, hang_timeout=5.0)
    long_run = check_prep(prep).long_run
    assert (long_run.max_restarts, long_run.spares, long_run.hang_timeout) == (0, (), None)


def test_a_spare_that_fails_the_check_is_skipped_for_the_next_in_a_restart() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}])
    checker = Checker({"s1": "instance 1: cannot reach MASTER_ADDR"})
    prep = prepared(hosts="h1,h2", max_restarts=1)
    result = launch(prep, RunSettings(), backend=fake, check=checker)
    assert result.ok and result.attempts[0].exit_code == EXIT_LOST
    assert checker.seen == [["h1", "s1"], ["h1", "s2"]]
    assert result.replaced == (("h2", "s2"),)
    assert fake.opened[-1] == ("h1", "s2")


def test_without_a_spare_that_passes_the_lost_host_is_tried_again() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}])
    checker = Checker({"s1": "broken", "s2": "slow: bandwidth 3 MB/s"})
    result = launch(prepared(hosts="h1,h2", max_restarts=1), RunSettings(), fake, check=checker)
    assert result.ok and result.replaced == () and fake.opened[-1] == ("h1", "h2")


def test_without_check_a_spare_is_used_unchecked() -> None:
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}])
    result = launch(prepared(hosts="h1,h2", max_restarts=1), RunSettings(), backend=fake)
    assert result.ok and result.replaced == (("h2", "s1"),)
