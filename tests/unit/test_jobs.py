"""Detached jobs without hosts: the record's state machine driven by a real launch on the
shipped fakes (restarts, failures, the handshake with the waiting client), the host-side
operations on a real directory and process, and the registry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.errors import UsageError
from poprun_py.hostside import hostops
from poprun_py.hostside.bundle import bundle
from poprun_py.jobs import registry
from poprun_py.jobs.record import JobRecord, check_job_id, from_json, new_job_id, observed, to_json
from poprun_py.jobs.supervisor import Recorder
from poprun_py.launch.launcher import RunSettings, launch
from poprun_py.prepare.job import LaunchOptions, prepare
from poprun_py.testing.fakes import FakeBackend, Script


def recorder(tmp_path: Path) -> tuple[Recorder, int]:
    read_fd, write_fd = os.pipe()
    record = JobRecord("c-20261201-120000-ab12", hosts=("h1", "h2"), backend="fake", created=1.0)
    return Recorder(tmp_path, record, write_fd), read_fd


def answer(read_fd: int) -> bytes:
    data = os.read(read_fd, 4096)
    os.close(read_fd)
    return data


def run_recorded(tmp_path: Path, fake: FakeBackend, restarts: int = 0) -> tuple[Recorder, bytes]:
    rec, read_fd = recorder(tmp_path)
    prep = prepare(LaunchOptions(hosts="h1,h2", program=("t",), max_restarts=restarts), environ={})
    result = launch(prep, RunSettings(on_running=rec.running), backend=fake)
    rec.ended(result.exit_code, "", interrupted=result.interrupted)
    return rec, answer(read_fd)


def test_a_restarted_job_is_running_once_per_attempt_and_frees_the_client_once(
    tmp_path: Path,
) -> None:
    fake = FakeBackend(attempts=[{1: Script(exit_code=3)}, {}])
    rec, said = run_recorded(tmp_path, fake, restarts=1)
    assert said == b"running\n"  # the first attempt's start; the end is not sent again
    assert (rec.record.state, rec.record.attempts, rec.record.exit_code) == ("succeeded", 2, 0)
    on_disk = from_json((tmp_path / "job.json").read_text())
    assert on_disk == rec.record


def test_a_failing_instance_makes_the_job_failed_with_its_code(tmp_path: Path) -> None:
    fake = FakeBackend({0: Script(exit_code=5, after=0.01), 1: Script(hang=True)})
    rec, said = run_recorded(tmp_path, fake)
    assert said == b"running\n"
    assert (rec.record.state, rec.record.exit_code, rec.record.attempts) == ("failed", 5, 1)


def test_a_job_that_never_ran_tells_the_waiting_client_why(tmp_path: Path) -> None:
    rec, read_fd = recorder(tmp_path)
    rec.ended(3, "host h2: ssh: connection refused", interrupted=False)
    assert answer(read_fd) == b"error 3 host h2: ssh: connection refused"
    assert rec.record.state == "failed"


@pytest.mark.parametrize(
    ("code", "interrupted", "state"),
    [
        (0, False, "succeeded"),
        (130, False, "stopped"),
        (1, True, "stopped"),
        (124, False, "failed"),
    ],
)
def test_how_a_job_ended_names_its_state(code: int, interrupted: bool, state: str) -> None:
    from poprun_py.jobs.record import ended, running

    record = running(JobRecord("j"), attempt=0, now=5.0)
    assert ended(record, code, "", interrupted=interrupted, now=6.0).state == state


def test_a_running_job_whose_supervisor_is_gone_is_lost_and_an_ended_one_stays() -> None:
    running_job = JobRecord("j", state="running")
    assert observed(running_job, supervisor_alive=False).state == "lost"
    done = JobRecord("j", state="failed", exit_code=2)
    assert observed(done, supervisor_alive=False) == done


def test_records_survive_json_and_ids_are_checked() -> None:
    record = JobRecord("j-1", hosts=("a", "b"), instances=("a", "a", "b"), options={"x": [1]})
    assert from_json(to_json(record)) == record
    assert from_json(to_json(record)).options == {"x": [1]}
    assert new_job_id("pod 16/x", now=0.0, token="ab12").endswith("-ab12")
    assert new_job_id("pod 16/x", now=0.0, token="ab12").startswith("pod-16-x-19")
    for bad in ("", "../x", "a b", "-x", "a;b", "x" * 200):
        with pytest.raises(UsageError):
            check_job_id(bad)


def write_job(root: Path, job_id: str, **values: object) -> None:
    (root / job_id).mkdir(parents=True)
    record = {"id": job_id, "state": "running", "created": time.time(), **values}
    (root / job_id / "job.json").write_text(json.dumps(record))


def test_host_operations_follow_a_job_until_its_supervisor_ends_and_stop_it(
    tmp_path: Path,
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = hostops.pid_start(sleeper.pid)
        write_job(tmp_path, "j1", pid=sleeper.pid, pid_start=start)
        write_job(tmp_path, "j2", pid=sleeper.pid, pid_start="0")  # a reused pid: not it
        (tmp_path / "j1" / "output.log").write_bytes(b"one\ntwo\n")
        listed = {r["id"]: r["alive"] for r in hostops.list_jobs(str(tmp_path))}
        assert listed == {"j1": True, "j2": False}
        got: list[bytes] = []
        assert hostops.follow(str(tmp_path), "j1", "output.log", False, got.append)
        assert b"".join(got) == b"one\ntwo\n"
        stopped = hostops.stop(str(tmp_path), "j1", grace=1.0)
        assert stopped is not None and not stopped["alive"]
        assert sleeper.wait(5) == -signal.SIGTERM
        got.clear()
        assert hostops.follow(str(tmp_path), "j1", "output.log", True, got.append)  # ends
        assert b"".join(got) == b"one\ntwo\n"
        assert hostops.show(str(tmp_path), "nope") is None
        assert not hostops.follow(str(tmp_path), "nope", "output.log", True, got.append)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("version", [pytest.param("3.7", marks=pytest.mark.old_pythons), "this"])
def test_the_host_operations_run_as_a_script_on_an_old_python(tmp_path: Path, version: str) -> None:
    write_job(tmp_path / "jobs", "j1", pid=1, pid_start=hostops.pid_start(1))
    script = bundle("hostops")  # what ships: hostops with its imports inlined
    env = {"PATH": os.environ["PATH"], "LOGNAME": "nobody-here"}
    if version == "this":
        python = sys.executable
    else:  # a visible skip without it, allowed with CI=true (tests/requirements.py)
        from tests.integration.test_host_tools import old_python

        python = str(old_python(version))
    proc = subprocess.run(
        [python, "-S", "-c", script, "show", "absent"], capture_output=True, env=env, check=False
    )
    assert proc.returncode == hostops.NO_SUCH_JOB, proc.stderr


def test_the_registry_remembers_how_to_reach_a_job_and_keeps_its_spec(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nhosts: [{name: h1}]\n")
    entry = registry.Entry("c-1", "h1", cluster=str(spec), ssh={"user": "root"}, created=2.0)
    registry.save(entry, tmp_path / "reg", cluster_text=spec.read_text())
    assert registry.find("c-1", tmp_path / "reg") == entry
    assert oct((tmp_path / "reg" / "c-1.json").stat().st_mode & 0o777) == "0o600"
    spec.unlink()
    copy = registry.cluster_copy(entry, tmp_path / "reg")
    assert copy is not None and Path(copy).read_text() == "name: c\nhosts: [{name: h1}]\n"
    assert registry.find("c-2", tmp_path / "reg") is None


def test_a_first_host_without_poprun_py_is_a_preflight_fault_naming_it() -> None:
    from poprun_py.errors import EXIT_PREFLIGHT, PreflightError
    from poprun_py.jobs.place import _check_started

    err = "/usr/bin/python3: No module named poprun_py\n"
    with pytest.raises(PreflightError) as caught:
        _check_started("h1", 1, "", err)
    assert caught.value.exit_code == EXIT_PREFLIGHT
    assert "h1" in str(caught.value) and "install poprun-py there" in str(caught.value)
    assert _check_started("h1", 0, "poprun-py-supervisor: running /tmp/j\n", "") == "/tmp/j"


def test_jobs_asks_a_host_once_more_after_its_job_ended_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import asdict

    from poprun_py.core.spec import SshOptions
    from poprun_py.jobs.finder import all_jobs

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    done = JobRecord("gone-1", hosts=("h1",), state="succeeded", exit_code=0, created=3.0)
    kept = {k: v for k, v in asdict(done).items() if k != "options"}
    # its cluster spec and hosts are long gone: asking them would fail
    registry.save(registry.Entry("gone-1", "h1", cluster="/nonexistent.yaml", ended=kept))
    records, problems = all_jobs(None, None, SshOptions())
    assert [r for r in records if r.id == "gone-1"] == [done]
    assert problems == []
