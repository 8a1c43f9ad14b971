"""Stack dumps with py-spy at their seam (poprun_py/process/stackdump.py): which processes of an
instance's tree are dumped, what a failing or hanging py-spy gives (nothing, and nothing left
running), and the agent source that ships the module. A stand-in ``py-spy`` script plays py-spy
here; the real one is used by the integration tests (test_long_run_local, test_long_run_hosts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.process import stackdump
from poprun_py.process.proctree import alive

PY = sys.executable


def fake_pyspy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def wrapped() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``sh`` (which does not exec: a command follows) running a Python that sleeps."""
    sh = subprocess.Popen(["sh", "-c", f"{PY} -c 'import time; time.sleep(30)'; true"])
    deadline = time.monotonic() + 10
    found: list[int] = []
    while not found and time.monotonic() < deadline:
        found = stackdump.python_processes(sh.pid)
        time.sleep(0.01)
    try:
        assert len(found) == 1
        yield sh, found[0]
    finally:
        for pid in found:
            os.kill(pid, signal.SIGKILL)
        sh.kill()
        sh.wait(timeout=10)


def test_the_python_processes_of_a_wrapped_instance_are_found(
    wrapped: tuple[subprocess.Popen[bytes], int],
) -> None:
    sh, python = wrapped
    assert python != sh.pid and stackdump.python_processes(sh.pid) == [python]
    assert stackdump.python_processes(os.getpid())[0] == os.getpid()


def test_every_python_process_of_every_instance_is_dumped(
    tmp_path: Path, wrapped: tuple[subprocess.Popen[bytes], int]
) -> None:
    sh, python = wrapped
    sleeper = subprocess.Popen(["sleep", "30"])  # no Python in its tree
    try:
        pyspy = fake_pyspy(tmp_path, 'echo "Process $3: fake"; echo \'Thread 1 (idle): "Main"\'')
        found = stackdump.dump_trees({0: sh.pid, 1: sleeper.pid}, pyspy)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert found == {0: [f"Process {python}: fake".encode(), b'Thread 1 (idle): "Main"'], 1: None}
    assert stackdump.dump_trees({0: sh.pid}, None) == {0: None}


def test_a_failing_or_hanging_py_spy_gives_nothing_and_is_not_left_running(
    tmp_path: Path,
) -> None:
    failing = fake_pyspy(tmp_path, "echo 'Permission denied'; exit 1")
    assert stackdump.pyspy_dump(failing, os.getpid()) is None
    pidfile = tmp_path / "pid"
    hanging = fake_pyspy(tmp_path, f"echo $$ > {pidfile}; echo partial; exec sleep 30")
    started = time.monotonic()
    assert stackdump.pyspy_dump(hanging, os.getpid(), timeout=0.3) is None
    assert time.monotonic() - started < 3
    assert alive({int(pidfile.read_text())}) == set()
    assert stackdump.pyspy_dump(str(tmp_path / "absent"), os.getpid()) is None


def test_py_spy_is_looked_up_on_the_given_path(tmp_path: Path) -> None:
    pyspy = fake_pyspy(tmp_path, "true")
    assert stackdump.find_pyspy(str(tmp_path)) == pyspy
    assert stackdump.find_pyspy(str(tmp_path / "nowhere")) is None
