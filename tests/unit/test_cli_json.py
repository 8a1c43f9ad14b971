"""``--format json`` on every command that prints a table, machine-readable: it parses, a
missing value is null (never the table's ``-``), and an attached launch's summary is the last
line on stdout (issue 22, item 3)."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from poprun_py.cli import run
from poprun_py.cli.machine import check_dict
from poprun_py.launch.check import CheckReport, HostCheck

LOCAL = ["-H", "localhost", "-n", "2", "-r", "2"]


def poprun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "poprun_py", *args]
    return subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


def values(data: Any) -> list[Any]:
    """Every scalar in ``data``, however deep."""
    if isinstance(data, dict):
        return [v for item in data.values() for v in values(item)]
    if isinstance(data, list):
        return [v for item in data for v in values(item)]
    return [data]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", *LOCAL, "t.py"],
        ["render", *LOCAL, "t.py"],
        ["launch", *LOCAL, "--dry-run", "t.py"],
    ],
)
def test_plan_and_render_print_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*argv[:1], "-f", "json", *argv[1:]]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)


@pytest.mark.parametrize("command", ["jobs", "status"])
def test_jobs_and_status_print_a_json_list(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    argv = [command, "-f", "json"] + (["--no-refresh"] if command == "status" else [])
    assert run(argv) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)


def test_an_attached_launch_ends_with_its_summary_in_json(tmp_path: Path) -> None:
    fail = "echo boom >&2; exit 3"
    failed = poprun(tmp_path, "launch", *LOCAL, "-f", "json", "--", "sh", "-c", fail)
    assert failed.returncode == 3, failed.stderr
    summary = json.loads(failed.stdout.splitlines()[-1])
    assert summary["ok"] is False and summary["exit_code"] == 3
    assert summary["error"] == failed.stderr.strip().split("error: ", 1)[1]
    root = summary["instances"][0]
    assert root["root_cause"] is True and root["exit_code"] == 3 and root["signal"] is None
    assert root["detail"] == "boom"  # its last stderr line, as the table's detail
    assert "-" not in values(summary)
    ok = poprun(tmp_path, "launch", *LOCAL, "--format", "json", "--", "true")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout.splitlines()[-1])
    assert (summary["ok"], summary["error"], summary["root_cause"]) == (True, None, None)
    assert [i["code"] for i in summary["instances"]] == [0, 0]


def test_an_instance_killed_by_sigterm_says_so_in_json(tmp_path: Path) -> None:
    script = 'if [ "$RANK" = 1 ]; then kill -TERM $$; fi'
    proc = poprun(tmp_path, "launch", *LOCAL, "-f", "json", "--", "sh", "-c", script)
    assert proc.returncode == 143, proc.stderr
    root = json.loads(proc.stdout.splitlines()[-1])["instances"][0]
    assert (root["instance"], root["code"], root["killed_by"]) == (1, 143, "SIGTERM")
    assert "killed by SIGTERM (143)" in proc.stderr


def test_check_json_has_nulls_and_the_tables_units() -> None:
    host = HostCheck("h1", 2, None, None, "-", problems=("no answer",))
    data = json.loads(json.dumps(check_dict(CheckReport((host,), 1.5))))
    (row,) = data["hosts"]
    assert row["latency_ms"] is None and row["bandwidth_MBps"] is None
    assert row["devices"] is None and row["gloo"] is None
    assert "bandwidth_mbps" not in row and "-" not in values(data)


def test_check_prints_json_on_this_machine(tmp_path: Path) -> None:
    proc = poprun(tmp_path, "check", *LOCAL, "--check-timeout", "30s", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and [h["host"] for h in data["hosts"]] == ["localhost"]
    assert "-" not in values(data)
