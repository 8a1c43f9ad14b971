"""``launch --check --detach`` with spares does what the attached launch does, by one code path:
the client's check swaps the failing hosts (poprun_py.launch.check.check_and_swap), the job's
record carries the choices (Swapped.choices), and the supervisor, which plans the job again from
the options, makes them again (check.replay): the same plan, the failed spares dropped,
``plan-check.json`` and the summary's lines, and a spare checked before a restart uses it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.core.result import RunSettings
from poprun_py.jobs import supervisor
from poprun_py.jobs.detach import DetachOptions, supervisor_host, supervisor_record
from poprun_py.jobs.record import from_json, to_json
from poprun_py.launch import check
from poprun_py.launch.check import check_and_swap, replay, spare_check
from poprun_py.launch.launcher import launch
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare
from poprun_py.testing.fakes import FakeBackend, Script

BAD = {"h1": "instance 0: cannot reach MASTER_ADDR", "s1": "instance 0 gave no report"}


def prepared(hosts: str = "h1,h2", spares: str = "s1,s2,s3", **more: object) -> Prepared:
    opts = LaunchOptions(hosts=hosts, spare_hosts=spares, program=("t",), **more)  # type: ignore[arg-type]
    return prepare(opts, environ={})


class Checker:
    """A check failing the hosts of ``bad``; records each plan it saw and its settings."""

    def __init__(self, bad: Mapping[str, str]):
        self.bad, self.seen = dict(bad), list[list[str]]()
        self.settings: list[tuple[float, bool]] = []

    def __call__(
        self, prep: Prepared, timeout: float = 0.0, torch: bool = False, show: object = None
    ) -> dict[str, str]:
        names = [h.name for h in prep.plan.hosts]
        self.seen.append(names)
        self.settings.append((timeout, torch))
        return {h: self.bad[h] for h in names if h in self.bad}


@pytest.fixture
def checker(monkeypatch: pytest.MonkeyPatch) -> Checker:
    made = Checker(BAD)
    monkeypatch.setattr(check, "failing_hosts", made)
    return made


def same_plan(there: Prepared, here: Prepared) -> bool:
    """The same plan, but for the working directory the client resolved for the supervisor."""
    return there.plan == replace(here.plan, workdir=there.plan.workdir)


def names(prep: Prepared) -> list[str]:
    return [h.name for h in prep.plan.hosts]


def test_the_check_s_choices_make_the_same_job_again(checker: Checker) -> None:
    swapped = check_and_swap(prepared(), 3.0, torch=True)
    assert checker.seen == [["h1", "h2"], ["s1", "h2"], ["s2", "h2"]]
    assert names(swapped.prep) == ["s2", "h2"]
    assert [s.name for s in swapped.prep.long_run.spares] == ["s3"]  # s1 failed, s2 is used
    long_run = swapped.prep.long_run
    assert (long_run.check_timeout, long_run.check_torch) == (3.0, True)
    choices = json.loads(json.dumps(swapped.choices()))  # through the record, as JSON
    again = replay(prepared(), choices)
    assert again.prep.plan == swapped.prep.plan and again.prep.long_run == long_run
    assert again.swaps == swapped.swaps and again.rejected == swapped.rejected
    assert (
        again.lines()
        == swapped.lines()
        == [
            f"check: spare host s2 in place of h1 ({BAD['h1']})",
            f"check: spare host s1 failed the check ({BAD['s1']}): not used",
        ]
    )


def test_the_supervisor_runs_the_job_the_client_s_check_left(
    checker: Checker, tmp_path: Path
) -> None:
    swapped = check_and_swap(prepared(), 3.0)
    options = DetachOptions(check=swapped.choices())
    host = supervisor_host(swapped.prep, here=False)
    assert host is not None and host.name == "s2"  # the first host of the replaced set
    record = from_json(to_json(supervisor_record(swapped.prep, options, host.name)))
    assert record.hosts == ("s2", "h2") and record.options["check"]["replaced"] == {"h1": "s2"}
    recorder = supervisor.Recorder(tmp_path, record, -1)
    prep, lines = supervisor.prepared(recorder, str(tmp_path / "logs"))
    assert same_plan(prep, swapped.prep) and prep.long_run == swapped.prep.long_run
    assert lines == swapped.lines()
    written = json.loads((tmp_path / "logs" / "plan-check.json").read_text())
    assert written["replaced"] == {"h1": "s2"} and list(written["spares_failed"]) == ["s1"]
    assert len(checker.seen) == 3  # the supervisor does not check again


def test_without_check_the_supervisor_plans_the_options_alone(tmp_path: Path) -> None:
    prep = prepared()
    record = from_json(to_json(supervisor_record(prep, DetachOptions(), "h1")))
    assert "check" not in record.options
    again, lines = supervisor.prepared(supervisor.Recorder(tmp_path, record, -1), str(tmp_path))
    assert same_plan(again, prep) and again.long_run.check_timeout is None and lines == []
    assert not (tmp_path / "plan-check.json").exists()


def test_with_check_a_restart_checks_its_spare(checker: Checker) -> None:
    """The check the job was told of (spare_check), as the CLI's launch, attached or in the
    supervisor, passes it on."""
    swapped = check_and_swap(prepared(hosts="h2,h3", spares="s1,s3", max_restarts=1), 2.5)
    fake = FakeBackend(attempts=[{1: Script(lost=True)}, {}])
    check = spare_check(swapped.prep.long_run)
    result = launch(swapped.prep, RunSettings(), backend=fake, check=check)
    assert result.ok and result.replaced == (("h3", "s3"),)
    assert checker.seen[1:] == [["h2", "s1"], ["h2", "s3"]]  # s1 fails the restart's check
    assert checker.settings[1:] == [(2.5, False), (2.5, False)]


def test_without_check_no_spare_check() -> None:
    assert spare_check(prepared().long_run) is None
