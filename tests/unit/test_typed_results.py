"""States are enums whose text is what was written before, and a group's per-host results are
typed (a value or a fault): job.json, printed rows and old records keep their strings (issue 21,
item 6)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from poprun_py.agent.client import AgentPool, stage_job
from poprun_py.core.result import InstanceResult, InstanceState, LaunchResult
from poprun_py.core.spec import HostSpec
from poprun_py.errors import EXIT_INTERRUPTED, Fault, PreflightError
from poprun_py.jobs.record import (
    JobRecord,
    JobState,
    ended,
    from_json,
    observed,
    running,
    summary_row,
    to_json,
)
from poprun_py.ssh.errors import Cancelled, ConnectionLost, RemoteTimeout
from poprun_py.ssh.fanout import EXIT_TIMEOUT, EXIT_UNREACHABLE, HostOutcome, _outcome
from poprun_py.ssh.hostresult import HostResult, values
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from poprun_py.ssh.sync import HostSync, _report

# job.json as poprun-py wrote it before the states were enums (to_json of the same record)
OLD_RUNNING = (
    '{\n "attempts": 1,\n "backend": "ssh",\n "created": 0.0,\n "ended": null,\n'
    ' "exit_code": null,\n "hosts": [\n  "h1",\n  "h2"\n ],\n'
    ' "id": "c-20261201-120000-ab12",\n "instances": [\n  "h1",\n  "h2"\n ],\n'
    ' "job_dir": "/tmp/j",\n "options": {},\n "pid": 42,\n "pid_start": "99",\n'
    ' "reason": "",\n "started": 1.0,\n "state": "running",\n "supervisor": "h1"\n}\n'
)
OLD_FAILED = OLD_RUNNING.replace('"ended": null', '"ended": 2.0').replace(
    '"exit_code": null', '"exit_code": 7'
)
OLD_FAILED = OLD_FAILED.replace('"reason": ""', '"reason": "instance 1 on h2 failed (exit code 7)"')
OLD_FAILED = OLD_FAILED.replace('"state": "running"', '"state": "failed"')


def a_record() -> JobRecord:
    record = JobRecord(
        "c-20261201-120000-ab12",
        hosts=("h1", "h2"),
        backend="ssh",
        created=0.0,
        supervisor="h1",
        job_dir="/tmp/j",
        pid=42,
        pid_start="99",
        instances=("h1", "h2"),
    )
    return running(record, attempt=0, now=1.0)


def test_job_json_is_byte_for_byte_what_the_string_states_wrote() -> None:
    record = a_record()
    assert to_json(record) == OLD_RUNNING
    failed = ended(record, 7, "instance 1 on h2 failed (exit code 7)", interrupted=False, now=2.0)
    assert to_json(failed) == OLD_FAILED
    assert failed.state is JobState.FAILED


@pytest.mark.parametrize("text", [OLD_RUNNING, OLD_FAILED])
def test_an_old_record_loads_with_enum_states_and_round_trips(text: str) -> None:
    record = from_json(text)
    assert isinstance(record.state, JobState)
    assert record.state == json.loads(text)["state"]
    assert to_json(record) == text
    assert from_json(json.loads(text)) == record


@pytest.mark.parametrize("state", [s.value for s in JobState])
def test_every_state_written_as_a_string_loads(state: str) -> None:
    record = from_json({"id": "j-1", "state": state, "hosts": ["h1"]})
    assert record.state is JobState(state)
    assert record.active == (state in ("starting", "running"))


def test_a_record_missing_its_state_is_starting() -> None:
    assert from_json('{"id": "j-1"}').state is JobState.STARTING


def test_printed_rows_and_messages_keep_the_state_text() -> None:
    record = observed(a_record(), supervisor_alive=False)
    row = summary_row(record)
    assert row[1] == "lost" and str(row[1]) == "lost" and f"{row[1]}" == "lost"
    assert f"job {record.id} {record.state}" == f"job {record.id} lost"
    stopped = ended(a_record(), EXIT_INTERRUPTED, "", interrupted=False, now=3.0)
    assert json.dumps({"state": stopped.state}) == '{"state": "stopped"}'


def test_instance_state_text_and_json_are_as_before() -> None:
    lost = InstanceResult(1, "h2", state=InstanceState.LOST, detail="gone")
    assert json.dumps(asdict(lost)) == (
        '{"index": 1, "host": "h2", "exit_code": null, "signal": null, "state": "lost",'
        ' "started": 0.0, "ended": 0.0, "detail": "gone"}'
    )
    assert [f"{s}" for s in InstanceState] == ["exited", "stopped", "lost", "not-started"]


def test_instance_results_built_with_strings_still_work() -> None:
    old = InstanceResult(0, "h1", state="lost")  # type: ignore[arg-type]
    assert old.state is InstanceState.LOST and old.failed and old.code == 255
    stopped = InstanceResult(1, "h2", signal=15, state="stopped")  # type: ignore[arg-type]
    result = LaunchResult((old, stopped))
    assert result.lost_hosts == ("h1",) and not stopped.failed and stopped.code == 128 + 15
    with pytest.raises(ValueError):
        InstanceResult(2, "h3", state="vanished")  # type: ignore[arg-type]


# ---------------------------------------------------------------- per-host results


class FakeConn:
    """Stands in for an open connection: the pool only hands it to ``fn``."""

    def __init__(self, name: str):
        self.name = name

    def close(self) -> None:
        pass


def fake_group(*names: str) -> ConnectionPool:
    pool = ConnectionPool([HostSpec(n) for n in names], SshSettings())
    pool.connections.update({n: FakeConn(n) for n in names})  # type: ignore[misc]
    return pool


def answer(conn: Any) -> str:
    if conn.name == "down":
        raise ConnectionLost("down", "host down: connection lost")
    if conn.name == "bad":
        raise ValueError("bad answer")
    return str(conn.name).upper()


def test_each_gives_a_value_or_a_typed_fault_per_host() -> None:
    with fake_group("up", "down", "bad") as pool:
        got = pool.each(answer)
        fine = pool.each(answer, ["up"])
    assert list(got) == ["up", "down", "bad"]
    assert got["up"].ok and got["up"].value == "UP" and got["up"].fault is None
    assert not got["down"].ok and isinstance(got["down"].fault, ConnectionLost)
    assert str(got["down"].fault) == "host down: connection lost"
    with pytest.raises(ValueError, match="bad answer"):
        got["bad"].value
    assert values(fine) == {"up": "UP"}
    with pytest.raises(ConnectionLost):  # all or nothing: the first fault, in host order
        values(got)
    assert not hasattr(pool, "map")  # results are typed: no T | BaseException view


def test_each_on_some_hosts_and_a_none_value_is_a_value() -> None:
    with fake_group("h1", "h2") as pool:
        got = pool.each(lambda conn: None, ["h2"])
    assert list(got) == ["h2"] and got["h2"].ok and got["h2"].value is None


def test_an_interrupt_in_a_worker_is_its_fault_and_raised_when_read() -> None:
    def interrupted(conn: Any) -> HostOutcome:
        raise KeyboardInterrupt

    with fake_group("h1") as pool:
        got = pool.each(interrupted)
    assert isinstance(got["h1"].fault, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        _outcome("h1", got["h1"])  # a fanout keeps every host's outcome but an interrupt


def test_fanout_outcomes_keep_their_exit_codes() -> None:
    done = HostOutcome("h1", 0, "out")
    assert _outcome("h1", HostResult(done)) is done
    assert _outcome("h1", HostResult(fault=RemoteTimeout("h1", "h1: timed out"))).exit_code == (
        EXIT_TIMEOUT
    )
    assert _outcome("h1", HostResult(fault=Cancelled("h1", "h1: cancelled"))).exit_code == (
        EXIT_INTERRUPTED
    )
    lost = _outcome("h1", HostResult(fault=ConnectionLost("h1", "h1: lost")))
    assert (lost.exit_code, lost.error) == (EXIT_UNREACHABLE, "h1: lost")
    odd = _outcome("h1", HostResult(fault=OSError("disk")))
    assert (odd.exit_code, odd.error) == (EXIT_UNREACHABLE, "h1: OSError: disk")
    assert _outcome("h9", None).error == "h9: not run"


def test_sync_report_turns_each_fault_into_the_same_faults() -> None:
    pool = fake_group("a", "b", "c", "d")
    theirs = Fault("b", "rsync", "rsync not found on the host")
    outcomes: dict[str, HostResult[HostSync]] = {
        "a": HostResult(HostSync("a", "sftp", 1, 10, 0.1)),
        "b": HostResult(fault=PreflightError([theirs])),
        "c": HostResult(fault=ConnectionLost("c", "c: connection lost")),
        "d": HostResult(fault=RuntimeError()),
    }
    with pytest.raises(PreflightError) as caught:
        _report(pool, outcomes, [], 0)
    assert list(caught.value.faults) == [
        theirs,
        Fault("c", "sync", "c: connection lost"),
        Fault("d", "sync", "RuntimeError"),
    ]
    report = _report(pool, {"a": outcomes["a"]}, [], 10)
    assert [h.host for h in report.hosts] == ["a"]


class FakeAgent:
    def __init__(self, name: str):
        self.name = name

    def put(self, files: Any) -> str:
        if self.name == "down":
            raise ConnectionLost("down", "down: connection lost")
        return "read-only file system" if self.name == "ro" else ""


def test_staging_names_every_host_that_failed_by_fault_or_by_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    pool = fake_group("ok", "ro", "down")
    agents = AgentPool(pool)
    monkeypatch.setattr(agents, "agent", lambda conn: FakeAgent(conn.name))
    job = SimpleNamespace(
        instances=[SimpleNamespace(host=h, shard_file="") for h in ("ok", "ro", "down")],
        files={},
        job_dir="/tmp/j",
    )
    with pytest.raises(PreflightError) as caught:
        stage_job(agents, job)  # type: ignore[arg-type]
    assert list(caught.value.faults) == [
        Fault("down", "stage job files", "down: connection lost"),
        Fault("ro", "stage job files", "read-only file system"),
    ]


def test_a_state_this_version_does_not_know_is_kept_as_its_text() -> None:
    record = from_json('{"id": "j1", "state": "paused", "hosts": ["h1"]}')
    assert record.state == "paused" and not record.active
    assert summary_row(record)[1] == "paused"
    assert json.loads(to_json(record))["state"] == "paused"
    assert JobState("paused") is not JobState.LOST
