"""Detached jobs on the local backend (the supervisor on this machine, in a session of its
own): it outlives its client, fails fast, stops on ``stop`` with nothing left, and bad input
gets one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.helpers import left_behind
from tests.integration.helpers import poprun_cli as run_cli

POD16 = str(Path(__file__).resolve().parents[2] / "clusters" / "pod16.yaml")


def poprun_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=60)


@pytest.fixture(autouse=True)
def own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def detach(*program: str, n: int = 3) -> str:
    proc = poprun_cli("launch", "--hosts", "localhost", "-n", str(n), "--detach", "--", *program)
    assert proc.returncode == 0, proc.stderr
    assert "running, supervised on this machine" in proc.stderr
    return proc.stdout.splitlines()[-1]


@pytest.mark.requires("pgrep")
def test_a_local_detached_job_outlives_its_client_and_ends_by_itself(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f'echo "up $RANK"; while [ ! -e {go} ]; do sleep 0.05; done; echo "bye $RANK"'
    job = detach("sh", "-c", script)
    listed = json.loads(poprun_cli("jobs", "--format", "json").stdout)
    assert [(r["state"], r["supervisor"]) for r in listed if r["id"] == job] == [
        ("running", "localhost")
    ]
    go.touch()
    waited = poprun_cli("wait", job)
    assert waited.returncode == 0, waited.stderr
    out = poprun_cli("logs", job).stdout.splitlines()
    assert sorted(out) == sorted(
        [f"[localhost:{i}] up {i}" for i in range(3)]
        + [f"[localhost:{i}] bye {i}" for i in range(3)]
    )
    assert left_behind(f"supervise {job}") == []


@pytest.mark.requires("pgrep")
def test_a_failing_local_instance_stops_the_others_and_wait_gives_its_code() -> None:
    marker = f"{60 + uuid.uuid4().int % 1000 / 997:.6f}"
    job = detach("sh", "-c", f'[ "$RANK" = 1 ] && exit 4; exec sleep {marker}')
    waited = poprun_cli("wait", job)
    assert waited.returncode == 4, waited.stderr
    assert f"job {job} failed (exit code 4): instance 1 on localhost" in waited.stderr
    assert left_behind(f"sleep {marker}") == []
    rows = json.loads(poprun_cli("jobs", "--format", "json").stdout)
    assert [(r["state"], r["exit_code"]) for r in rows if r["id"] == job] == [("failed", 4)]


@pytest.mark.requires("pgrep")
def test_stop_ends_a_local_job_with_nothing_left() -> None:
    marker = f"{90 + uuid.uuid4().int % 1000 / 997:.6f}"
    job = detach("sleep", marker)
    assert left_behind(f"sleep {marker}")
    stopped = poprun_cli("stop", job)
    assert stopped.returncode == 0 and f"job {job} stopped" in stopped.stderr
    assert left_behind(f"sleep {marker}") == []
    assert left_behind(f"supervise {job}") == []
    assert poprun_cli("stop", job).returncode == 0  # a second stop is harmless
    assert poprun_cli("wait", job).returncode == 130


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["logs", "no-such-job"], "unknown job no-such-job"),
        (["wait", "x;rm -rf /"], "bad job id 'x;rm -rf /'"),
        (["stop", "../etc"], "bad job id '../etc'"),
        (
            ["launch", "-c", POD16, "-b", "local", "--detach", "true"],
            "--detach with --backend local",
        ),
        (
            ["launch", "--hosts", "h1", "-b", "slurm", "--detach", "true"],
            "--detach does not apply to the slurm",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = poprun_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_logs_of_an_instance_the_job_does_not_have_is_exit_2() -> None:
    job = detach("true", n=2)
    assert poprun_cli("wait", job).returncode == 0
    proc = poprun_cli("logs", job, "--instance", "99")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"poprun-py: error: logs --instance 99: job {job} has 2 instance(s), 0 to 1"
    )


@pytest.mark.requires("pgrep")
def test_a_detached_jobs_record_carries_the_hangs_verdict(tmp_path: Path) -> None:
    from tests.integration.test_long_run_hosts import HANG_IN_A_FUNCTION

    program = tmp_path / "hang.py"
    program.write_text(HANG_IN_A_FUNCTION)
    launch = ["launch", "--hosts", "localhost", "-n", "4", "--hang-timeout", "2", "--detach"]
    proc = poprun_cli(*launch, "--", "python3", str(program))
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.splitlines()[-1]
    waited = poprun_cli("wait", job)
    assert waited.returncode == 124, waited.stderr
    rows = json.loads(poprun_cli("jobs", "--format", "json").stdout)
    (hang,) = [r["hang"] for r in rows if r["id"] == job]
    assert hang["verdict"].startswith("3 of 4 ranks wait in all_reduce (hang.py:10); rank 2"), hang
    assert [g["ranks"] for g in hang["groups"]] == [[2], [0, 1, 3]]
    assert left_behind(f"supervise {job}") == []
