"""Detached jobs on real test hosts (network namespaces with sshd): ``launch --detach`` over
ssh, its supervisor on the first host, and ``jobs``, ``logs``, ``stop``, ``wait`` from new
processes -- the client SIGKILLed meanwhile, the local registry lost. Afterwards nothing but
sshd may run on any host."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.hostfixtures import add_route, delete_route
from tests.integration.helpers import marked_on
from tests.integration.test_launch_hosts_cli import only_sshd, poprun, spec_for

pytestmark = pytest.mark.hosts


def wait_go(tmp_path: Path) -> str:
    """A shell line that waits until the test touches ``tmp_path/go`` (hosts share the file
    system with the test)."""
    return f"while [ ! -e {tmp_path / 'go'} ]; do sleep 0.05; done; "


@pytest.fixture(autouse=True)
def own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own registry of detached jobs (XDG_STATE_HOME)."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


_detached: list[tuple[str, Path]] = []  # (job, spec) the running test detached


@pytest.fixture(autouse=True)
def released(tmp_path: Path, own_registry: Path) -> Iterator[None]:
    """No job of a test is left on the shared hosts, even when the test fails midway: at its
    end the ``go`` file its jobs wait for is there (they go on and end), and every job it
    detached is stopped (which does nothing to a job that has ended)."""
    _detached.clear()
    yield
    (tmp_path / "go").touch()
    for job, spec in _detached:
        stopped = poprun("stop", job, "-c", str(spec), cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
    _detached.clear()


def detached(spec: Path, cwd: Path, *program: str, n: int = 4, more: tuple[str, ...] = ()) -> str:
    """``launch --detach`` on the test hosts; the job id (its last line on stdout)."""
    args = ["launch", "-c", str(spec), "-b", "ssh", "-r", str(n), "-n", str(n), *more, "--detach"]
    proc = poprun(*args, "--", *program, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.splitlines()[-1]
    _detached.append((job, spec))
    return job


def jobs(cwd: Path, *args: str) -> list[dict[str, object]]:
    proc = poprun("jobs", "--format", "json", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)
    return rows


def state_of(cwd: Path, job: str, *args: str) -> str:
    return next(str(r["state"]) for r in jobs(cwd, *args) if r["id"] == job)


def test_a_detached_job_runs_on_4_hosts_without_its_client(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    script = 'echo "start $RANK $(hostname)"; ' + wait_go(tmp_path) + 'echo "done $RANK"'
    job = detached(spec, tmp_path, "sh", "-c", script)
    first = test_cluster_4.hosts[0]
    assert marked_on(first, f"supervise {job}"), "the supervisor runs on the first host"
    assert state_of(tmp_path, job) == "running"
    # a follower SIGKILLed halfway; a new one reads everything and ends with the job
    follower = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "logs", "--follow", job],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    assert "start" in follower.stdout.readline()
    follower.send_signal(signal.SIGKILL)
    follower.wait(timeout=10)
    # Ctrl-C stops the following, not the job, and leaves no reader on the host
    follower = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "logs", "--follow", job],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert follower.stdout is not None
    assert "start" in follower.stdout.readline()
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=10) == 130
    deadline = time.monotonic() + 5
    while marked_on(first, f"follow {job}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked_on(first, f"follow {job}") == []
    assert state_of(tmp_path, job) == "running"
    (tmp_path / "go").touch()
    logs = poprun("logs", "--follow", job, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    for rank, host in enumerate(test_cluster_4.hosts):
        assert f"[{host.name}:{rank}] start {rank} {host.name}" in logs.stdout
        assert f"[{host.name}:{rank}] done {rank}" in logs.stdout
    waited = poprun("wait", job, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    assert state_of(tmp_path, job) == "succeeded"
    one = poprun("logs", job, "--instance", "3", cwd=tmp_path)
    last = test_cluster_4.hosts[3].name
    assert one.stdout.splitlines() == [f"[{last}:3] start 3 {last}", f"[{last}:3] done 3"]
    only_sshd(test_cluster_4)


def test_an_instance_failing_while_detached_stops_the_others(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    script = wait_go(tmp_path) + '[ "$RANK" = 2 ] && exit 5; exec sleep 60'
    job = detached(spec, tmp_path, "sh", "-c", script)
    (tmp_path / "go").touch()
    waited = poprun("wait", job, cwd=tmp_path)
    assert waited.returncode == 5, waited.stderr
    assert "instance 2 on" in waited.stderr
    assert state_of(tmp_path, job) == "failed"
    only_sshd(test_cluster_4)


def test_stop_leaves_nothing_on_any_host_and_a_second_stop_is_harmless(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    job = detached(spec, tmp_path, "sleep", "300")
    started = time.monotonic()
    stopped = poprun("stop", job, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    # stop does not wait out the job's 300 s: generous for a loaded 2-core machine (it sends
    # TERM over ssh to 4 hosts and waits for their instances and the supervisor to end)
    assert time.monotonic() - started < 60
    assert f"job {job} stopped" in stopped.stderr
    only_sshd(test_cluster_4)
    again = poprun("stop", job, cwd=tmp_path)
    assert again.returncode == 0 and "already ended (stopped)" in again.stderr
    waited = poprun("wait", job, cwd=tmp_path)
    assert waited.returncode == 130


def test_a_lost_registry_loses_no_job_and_secrets_stay_off_disk(
    test_cluster_4: TestCluster, tmp_path: Path, own_registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("TRAIN_API_TOKEN", secret)
    script = wait_go(tmp_path) + 'echo "token ${#TRAIN_API_TOKEN} ${TRAIN_API_TOKEN%%-*}"'
    more = ("--env", "TRAIN_API_TOKEN")
    job = detached(spec, tmp_path, "sh", "-c", script, more=more)
    for path in own_registry.rglob("*.json"):
        assert secret not in path.read_text()
        path.unlink()  # the registry is lost
    unknown = poprun("wait", job, cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown job" in unknown.stderr
    assert state_of(tmp_path, job, "-c", str(spec)) == "running"
    (tmp_path / "go").touch()
    waited = poprun("wait", job, "-c", str(spec), cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    logs = poprun("logs", job, "-c", str(spec), cwd=tmp_path)
    assert logs.stdout.count(f"token {len(secret)} s3cr3t") == 4, logs.stdout
    row = next(r for r in jobs(tmp_path, "-c", str(spec)) if r["id"] == job)
    for path in Path(str(row["job_dir"])).rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
    only_sshd(test_cluster_4)


def test_the_job_goes_on_while_the_client_is_cut_off_the_network(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    from poprun_py.hostside.hostops import jobs_root

    spec = spec_for(test_cluster_4, tmp_path)
    job = detached(spec, tmp_path, "sh", "-c", wait_go(tmp_path) + 'echo "done $RANK"')
    record = Path(jobs_root()) / job / "job.json"  # the first host's file (one file system)
    cut: list[str] = []
    try:
        for host in test_cluster_4.hosts:  # this machine's packets to them refused; theirs flow
            add_route("prohibit", host.address)  # recorded: a killed session's go with the next
            cut.append(host.address)
        with pytest.raises(OSError):  # this machine cannot reach the hosts any more
            socket.create_connection((test_cluster_4.hosts[0].address, 22), timeout=1).close()
        (tmp_path / "go").touch()
        deadline = time.monotonic() + 30
        while json.loads(record.read_text())["state"] == "running":
            assert time.monotonic() < deadline, "the job did not end without its client"
            time.sleep(0.05)
        assert json.loads(record.read_text())["state"] == "succeeded"
    finally:
        for address in cut:
            delete_route("prohibit", address)
    waited = poprun("wait", job, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    assert poprun("logs", job, cwd=tmp_path).stdout.count("] done ") == 4
    only_sshd(test_cluster_4)
