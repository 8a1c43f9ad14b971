"""Issue 20, D, for real: instance logs that hold every line at once (a SIGKILLed launcher
loses nothing; ``logs --instance`` of a running detached job shows it), a job root that
another Unix user made first is refused in one line with nothing started, a successful job's
directory removed (kept after a failure, or with --keep-job-dir), and ``jobs --prune``."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests import requirements
from tests.integration.helpers import REPO, left_behind
from tests.integration.helpers import poprun_cli as run_cli
from tests.integration.test_launch_hosts_cli import poprun, spec_for


def poprun_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=60)


@pytest.fixture(autouse=True)
def own_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own job root and registry (nobody else's jobs are pruned)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("POPRUN_PY_JOB_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return tmp_path / "root"


def until(check: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.05)


@pytest.mark.requires("pkill")
def test_a_sigkilled_launcher_leaves_logs_with_every_line_so_far(tmp_path: Path) -> None:
    marker = f"{40 + uuid.uuid4().int % 1000 / 997:.6f}"
    logs = tmp_path / "logs"
    launcher = subprocess.Popen(
        [
            *(sys.executable, "-m", "poprun_py", "launch", "--hosts", "localhost", "-n", "2"),
            *("-o", str(logs), "--", "sh", "-c", f'echo "line 1 of $RANK"; exec sleep {marker}'),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for rank in (0, 1):
            log = logs / f"instance-{rank}.log"
            until(lambda log=log: log.exists() and log.read_bytes(), f"a line in {log}")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        for rank in (0, 1):
            log = logs / f"instance-{rank}.log"
            assert log.read_text() == f"line 1 of {rank}\n"
            assert oct(log.stat().st_mode & 0o777) == "0o600"
    finally:
        launcher.kill()
        launcher.wait()
        subprocess.run(["pkill", "-f", f"sleep {marker}"], check=False)


def test_logs_of_one_instance_of_a_running_detached_job_show_its_lines(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f'echo "up $RANK"; while [ ! -e {go} ]; do sleep 0.05; done; echo "bye $RANK"'
    proc = poprun_cli(
        "launch", "--hosts", "localhost", "-n", "2", "--detach", "--", "sh", "-c", script
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.splitlines()[-1]
    try:
        until(
            lambda: poprun_cli("logs", job, "--instance", "1").stdout == "[localhost:1] up 1\n",
            "instance 1's line in its log while the job runs",
        )
    finally:
        go.touch()
        assert poprun_cli("wait", job).returncode == 0
    assert (
        poprun_cli("logs", job, "--instance", "1").stdout
        == "[localhost:1] up 1\n[localhost:1] bye 1\n"
    )


def job_dirs(root: Path) -> list[Path]:
    jobs = root / "jobs"
    return sorted(p for p in jobs.iterdir() if p.name != "detached") if jobs.exists() else []


def test_a_successful_jobs_directory_goes_a_failed_ones_stays_and_is_named(own_roots: Path) -> None:
    ok = poprun_cli("launch", "--hosts", "localhost", "-n", "2", "--", "true")
    assert ok.returncode == 0, ok.stderr
    assert job_dirs(own_roots) == [] and "kept" not in ok.stderr
    failed = poprun_cli("launch", "--hosts", "localhost", "-n", "2", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3
    (kept,) = job_dirs(own_roots)
    assert f"poprun-py: the job's files are kept in {kept}\n" in failed.stderr
    assert sorted(p.name for p in kept.iterdir()) == ["shard-0.txt", "shard-1.txt"]
    kept.rename(kept.with_name("seen"))
    again = poprun_cli("launch", "--hosts", "localhost", "--keep-job-dir", "--", "true")
    assert again.returncode == 0, again.stderr
    (kept,) = [p for p in job_dirs(own_roots) if p.name != "seen"]
    assert f"poprun-py: the job's files are kept in {kept}\n" in again.stderr


def test_jobs_prune_removes_ended_detached_jobs_and_their_records(
    tmp_path: Path, own_roots: Path
) -> None:
    go = tmp_path / "go"
    ended = poprun_cli("launch", "--hosts", "localhost", "--detach", "--", "true")
    running = poprun_cli(
        "launch",
        "--hosts",
        "localhost",
        "--detach",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {go} ]; do sleep 0.05; done",
    )
    assert ended.returncode == 0 and running.returncode == 0, ended.stderr + running.stderr
    done, busy = ended.stdout.splitlines()[-1], running.stdout.splitlines()[-1]
    try:
        assert poprun_cli("wait", done).returncode == 0
        young = poprun_cli("jobs", "--prune", "--older-than", "1h")
        assert young.returncode == 0 and "pruned 0 ended job(s)" in young.stderr, young.stderr
        bad = poprun_cli("jobs", "--prune", "--older-than", "soon")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1
        assert "--older-than: 'soon' is not a duration" in bad.stderr
        pruned = poprun_cli("jobs", "--prune")
        assert pruned.returncode == 0, pruned.stderr
        assert pruned.stderr == f"poprun-py: pruned 1 ended job(s): {done}\n"
        listed = json.loads(poprun_cli("jobs", "--format", "json").stdout)
        assert [r["id"] for r in listed] == [busy]
        detached = own_roots / "jobs" / "detached"
        assert sorted(p.name for p in detached.iterdir()) == [busy]
        assert not (tmp_path / "state" / "poprun-py" / "jobs" / f"{done}.json").exists()
    finally:
        go.touch()
        poprun_cli("wait", busy)


@pytest.fixture
def two_users() -> Iterator[tuple[str, str]]:
    """Two new Unix users, a victim and an intruder (removed again)."""
    requirements.require("root")  # useradd
    names = [f"pp{kind}{uuid.uuid4().hex[:8]}" for kind in ("v", "x")]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    try:
        yield names[0], names[1]
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False)


def test_a_job_root_another_user_made_first_is_refused_in_one_line(
    two_users: tuple[str, str], tmp_path: Path
) -> None:
    """The intruder makes the job root first (0777, its own); the user who runs poprun-py --
    the test's own, so that it finds its Python and poprun-py wherever they are installed --
    is refused in one line and nothing starts. The root is named by POPRUN_PY_JOB_ROOT, so the
    session's own default root (/tmp/poprun-py-UID) is left alone; the check is the same."""
    _, intruder = two_users
    root = Path(f"/tmp/poprun-py-everyday-{uuid.uuid4().hex}")
    subprocess.run(["runuser", "-u", intruder, "--", "mkdir", "-m", "0777", str(root)], check=True)
    marker = Path(f"/tmp/poprun-everyday-{uuid.uuid4().hex}")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["POPRUN_PY_JOB_ROOT"] = str(root)
    me, uid = pwd.getpwuid(os.geteuid()).pw_name, os.geteuid()
    argv = [sys.executable, "-m", "poprun_py", "launch", "--hosts", "localhost", "--", "touch"]
    try:
        proc = subprocess.run(
            [*argv, str(marker)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=env,
            check=False,
        )
        assert proc.returncode == 3, proc.stderr
        assert proc.stderr == (
            f"poprun-py: error: preflight failed on localhost: job directory: {root} is owned "
            f"by {intruder} (uid {root.stat().st_uid}), not by {me} (uid {uid}); "
            "nothing was started\n"
        )
        assert not marker.exists() and os.listdir(root) == []
    finally:
        subprocess.run(["rm", "-rf", str(root), str(marker)], check=False)


@pytest.mark.requires("root")  # chown to another user
def test_a_supervisor_refuses_a_detached_root_another_user_owns(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    root = shared / "poprun-py-0"
    root.mkdir()
    os.chown(root, 65534, 65534)
    env = {**os.environ, "POPRUN_PY_JOB_ROOT": str(root)}
    marker = tmp_path / "started"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "poprun_py", "launch", "--hosts", "localhost", "--detach"),
            *("--", "touch", str(marker)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr == (
        f"poprun-py: error: preflight failed on {os.uname().nodename}: job root: {root} is "
        "owned by nobody (uid 65534), not by root (uid 0); nothing was started\n"
    )
    listed = subprocess.run(
        [sys.executable, "-m", "poprun_py", "jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert listed.returncode == 3, listed.stderr
    assert listed.stderr == (
        f"poprun-py: error: preflight failed on localhost: job root: {root} is owned by "
        "nobody (uid 65534), not by root (uid 0); nothing was started\n"
    )
    assert not marker.exists() and left_behind(f"touch {marker}") == []


@pytest.mark.hosts
@pytest.mark.parametrize(
    "backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.requires("mpirun"))]
)
def test_on_the_hosts_a_job_root_another_user_owns_starts_nothing(
    test_cluster_4: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    shared = tmp_path / "shared"  # the hosts share this file system: their /tmp, as it were
    shared.mkdir()
    shared.chmod(0o1777)
    root = shared / "poprun-py-0"
    root.mkdir()
    os.chown(root, 65534, 65534)
    monkeypatch.setenv("POPRUN_PY_JOB_ROOT", str(root))  # the path rendered for every host
    spec = spec_for(test_cluster_4, tmp_path)
    marker = tmp_path / "started"
    proc = poprun(
        "launch", "-c", str(spec), "-b", backend, "--", "touch", str(marker), cwd=tmp_path
    )
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.splitlines()[-1]  # after preflight's table of the 4 hosts' faults
    assert last.startswith("poprun-py: error: preflight failed on ") and "stage job files" in last
    assert f"{root} is owned by nobody (uid 65534), not by root (uid 0)" in last
    assert last.endswith("(and 3 more); nothing was started") and not marker.exists()
    assert os.listdir(root) == []
