"""The setup step (its remote sh program, run here for real) and the SSH wait's retry logic."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.errors import ProvisionError
from poprun_py.providers.reach import ProbeFatal, wait_for_ssh
from poprun_py.providers.setup import (
    MARKER_ROOT,
    SetupOutcome,
    check_outcomes,
    clean_argv,
    outcome,
    script_digest,
    setup_argv,
)


def run_here(argv: list[str], home: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run a remote argv on this machine, as the SSH transport would run it on a node."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env=env, timeout=30, check=False
    )


def setup_here(home: Path, script: str, node: str = "n1") -> SetupOutcome:
    proc = run_here(setup_argv("demo", node, script_digest(script)), home, script)
    return outcome(node, proc.returncode, proc.stdout, proc.stderr, 0.0)


def test_setup_runs_once_and_again_when_the_script_changes(tmp_path: Path) -> None:
    log = tmp_path / "log"
    first = f"echo one >> {log}\necho visible\n"
    ran = setup_here(tmp_path, first)
    assert (ran.ran, ran.ok, ran.output) == (True, True, "visible")
    assert not setup_here(tmp_path, first).ran  # same content: skipped
    assert setup_here(tmp_path, first.replace("one", "two")).ran  # edited: runs again
    assert log.read_text().split() == ["one", "two"]
    marker = tmp_path / MARKER_ROOT / "demo" / "n1"
    assert (marker / "setup.sha256").read_text().strip() == script_digest(
        first.replace("one", "two")
    )
    assert (marker / "setup.sh").read_text() == first.replace("one", "two")


def test_each_node_keeps_its_own_marker_on_a_shared_home(tmp_path: Path) -> None:
    script = "true\n"
    assert setup_here(tmp_path, script, "n1").ran
    assert setup_here(tmp_path, script, "n2").ran
    assert not setup_here(tmp_path, script, "n2").ran


def test_a_failed_script_records_nothing_and_is_retried(tmp_path: Path) -> None:
    failing = "echo about to fail\nfalse\necho never\n"
    result = setup_here(tmp_path, failing)
    assert (result.ok, result.ran, result.exit_code) == (False, True, 1)
    assert result.output == "about to fail"
    assert not (tmp_path / MARKER_ROOT / "demo" / "n1" / "setup.sha256").exists()
    assert setup_here(tmp_path, failing).ran  # not marked done: runs again


def test_shebang_scripts_run_through_their_interpreter(tmp_path: Path) -> None:
    result = setup_here(
        tmp_path, "#!/usr/bin/env python3\nimport sys\nprint(sys.version_info[0])\n"
    )
    assert (result.ok, result.output) == (True, "3")


def test_clean_removes_only_this_cluster_and_empty_parents(tmp_path: Path) -> None:
    setup_here(tmp_path, "true\n")
    other = tmp_path / MARKER_ROOT / "other"
    other.mkdir()
    assert run_here(clean_argv("demo"), tmp_path).returncode == 0
    assert not (tmp_path / MARKER_ROOT / "demo").exists() and other.exists()
    other.rmdir()
    assert run_here(clean_argv("demo"), tmp_path).returncode == 0
    assert not (tmp_path / ".poprun-py").exists()
    assert run_here(clean_argv("demo"), tmp_path).returncode == 0  # twice is harmless


def test_names_that_could_escape_the_marker_dir_are_refused() -> None:
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(ProvisionError, match="bad"):
            setup_argv("demo", bad, "d")
        with pytest.raises(ProvisionError, match="bad"):
            clean_argv(bad)


def test_failures_name_the_first_node_and_count_the_rest() -> None:
    outcomes = [
        SetupOutcome("n1", True, 0, ""),
        SetupOutcome("n2", True, 3, "pip: error\nno network"),
        SetupOutcome("n3", True, 1, ""),
    ]
    with pytest.raises(ProvisionError) as err:
        check_outcomes(outcomes)
    assert str(err.value) == (
        "setup script failed on n2 with exit code 3 (and 1 more node(s)): no network"
    )
    check_outcomes(outcomes[:1])


# ---------------------------------------------------------------- waiting for SSH

HOSTS = (HostSpec("a"), HostSpec("b"), HostSpec("c"))


class Recorder:
    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.done: Counter[str] = Counter()

    def start(self, step: str, total: int) -> None:
        self.steps[step] = total

    def advance(self, step: str, amount: int = 1) -> None:
        self.done[step] += amount

    def note(self, message: str) -> None:
        pass


def test_wait_retries_each_host_until_it_answers() -> None:
    attempts: Counter[str] = Counter()
    needed = {"a": 1, "b": 3, "c": 2}

    def probe(host: HostSpec) -> None:
        attempts[host.name] += 1
        if attempts[host.name] < needed[host.name]:
            raise OSError("connection refused")

    reporter = Recorder()
    wait_for_ssh(HOSTS, known_hosts=None, timeout=5, interval=0.01, probe=probe, reporter=reporter)
    assert attempts == needed
    assert reporter.steps == {"waiting for SSH": 3} and reporter.done["waiting for SSH"] == 3


def test_wait_times_out_naming_every_silent_host() -> None:
    def probe(host: HostSpec) -> None:
        if host.name != "a":
            raise OSError(f"no route to {host.name}\n(details)")

    started = time.monotonic()
    with pytest.raises(ProvisionError) as err:
        wait_for_ssh(HOSTS, known_hosts=None, timeout=0.3, interval=0.05, probe=probe)
    assert 0.2 < time.monotonic() - started < 20  # waited; "< 20": not forever (loaded machine)
    assert str(err.value) == (
        "b did not answer SSH within 0.3s: no route to b (details) (and 1 more: c)"
    )


def test_a_refused_host_key_stops_the_wait_at_once() -> None:
    calls: Counter[str] = Counter()

    def probe(host: HostSpec) -> None:
        calls[host.name] += 1
        raise ProbeFatal(f"host key of {host.name} changed")

    started = time.monotonic()
    with pytest.raises(ProvisionError, match="host key of a changed"):
        wait_for_ssh(HOSTS[:1], known_hosts=None, timeout=30, interval=0.01, probe=probe)
    # probed once, and well before the 30 s timeout (generous: a loaded machine)
    assert calls["a"] == 1 and time.monotonic() - started < 15
