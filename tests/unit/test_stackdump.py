"""Stack dumps with py-spy at their seam (poprun_py/hostside/stackdump.py): which processes of an
instance's tree are dumped, what a failing or hanging py-spy gives (nothing, and nothing left
running), and the agent source that ships the module. A stand-in ``py-spy`` script plays py-spy
here; the real one is used by the integration tests (test_long_run_local, test_long_run_hosts).
An MPI daemon's ranks are dumped each under its rank, read from its environment (the agent's
``dump-ranks``: test_ssh_backend)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.hostside import stackdump
from poprun_py.hostside.identity import identify
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
    # given up at its 0.3 s timeout, not when the fake's 30 s sleep ends: "< 15" is generous
    # for a loaded 2-core machine (or one CPU)
    assert time.monotonic() - started < 15
    assert alive({int(pidfile.read_text())}) == set()
    assert stackdump.pyspy_dump(str(tmp_path / "absent"), os.getpid()) is None


def test_py_spy_is_looked_up_on_the_given_path(tmp_path: Path) -> None:
    pyspy = fake_pyspy(tmp_path, "true")
    assert stackdump.find_pyspy(str(tmp_path)) == pyspy
    assert stackdump.find_pyspy(str(tmp_path / "nowhere")) is None


RANKED = (
    "OMPI_COMM_WORLD_RANK=5 {py} -c 'import time; time.sleep(30)' & "
    "PMI_RANK=7 {py} -c 'import time; time.sleep(30)' & "
    "{py} -c 'import time; time.sleep(30)' & wait"
)
"""A daemon's tree: an Open MPI rank, an MPICH rank, and a Python process of no rank."""


def ranked_pythons(root: int, count: int, ranked: int = 2) -> dict[int, int | None]:
    """The ``count`` Python processes of ``root``'s tree and their ranks, once ``ranked`` of
    them show one (a process just exec'd may not show its environment yet)."""
    deadline = time.monotonic() + 10
    while True:
        found = stackdump.python_processes(root)
        ranks = {pid: stackdump.rank_of(pid) for pid in found}
        settled = sum(rank is not None for rank in ranks.values()) >= ranked
        if (len(found) == count and settled) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(found) == count
    return ranks


def test_ranks_are_read_from_the_mpi_launchers_variables_then_poprun_pys() -> None:
    assert stackdump.rank_of(0, {"OMPI_COMM_WORLD_RANK": "4", "PMI_RANK": "1", "RANK": "2"}) == 4
    assert stackdump.rank_of(0, {"PMI_RANK": "1", "RANK": "2"}) == 1
    assert stackdump.rank_of(0, {"RANK": "2"}) == 2
    assert stackdump.rank_of(0, {"RANK": "x"}) is None and stackdump.rank_of(0, {}) is None
    assert stackdump.rank_of(-1) is None  # no such process


def test_a_daemons_ranks_are_dumped_each_under_its_rank(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in stackdump.RANK_VARS}
    daemon = subprocess.Popen(["sh", "-c", RANKED.format(py=PY)], env=env, start_new_session=True)
    try:
        ranks = ranked_pythons(daemon.pid, 3)
        assert sorted(ranks.values(), key=str) == [5, 7, None]
        by_rank = {rank: pid for pid, rank in ranks.items()}
        pyspy = fake_pyspy(tmp_path, f'[ "$3" = {by_rank[7]} ] && exit 1; echo "Process $3"')
        found = stackdump.dump_ranks({0: daemon.pid}, pyspy)
        assert found == {5: [f"Process {by_rank[5]}".encode()], 7: None}  # 7 found, not dumped
        assert stackdump.dump_ranks({0: daemon.pid}, None) == {}
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)


RANK_RECORDS_USR2 = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR2, lambda *a: out.write_text("usr2"))
out.with_suffix(".ready").write_text("")
time.sleep(30)
"""

DAEMON = """
import subprocess, sys
trap, rank = 'trap : USR1 USR2; "$@"', ["poprun-rank", sys.executable, "-c", sys.argv[1]]
untrapped = "sleep 30; : poprun-untrapped"  # a wrapper that has not run its trap yet
subprocess.Popen(["/bin/sh", "-c", trap, *rank, sys.argv[2] + "/lead"], start_new_session=True)
subprocess.Popen(["/bin/sh", "-c", trap, *rank, sys.argv[2] + "/member"])  # the daemon's group
subprocess.Popen(["/bin/sh", "-c", untrapped, "poprun-rank"], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]).wait()
"""
"""Like hydra's proxy: ranks under wrappers, one leading its own session, one in the daemon's
group, one wrapper not trapping yet; the daemon itself dies of SIGUSR2 (the default)."""


def test_signal_ranks_reaches_every_rank_and_neither_the_daemon_nor_an_untrapped_wrapper(
    tmp_path: Path,
) -> None:
    daemon = subprocess.Popen([PY, "-c", DAEMON, RANK_RECORDS_USR2, str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        ready = [tmp_path / "lead.ready", tmp_path / "member.ready"]
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        wrappers: list[int] = []
        while len(wrappers) < 3:  # the third (untrapped) wrapper may start after the others
            assert time.monotonic() < deadline, wrappers
            wrappers = [p for p in stackdump.tree(daemon.pid) if stackdump._is_rank_wrapper(p)]
            time.sleep(0.01)
        while sum(stackdump.catches(p, signal.SIGUSR2) for p in wrappers) < 2:
            assert time.monotonic() < deadline  # the two trapping wrappers have run their trap
            time.sleep(0.01)
        assert stackdump.signal_ranks([daemon.pid], signal.SIGUSR2) == 2
        got = [tmp_path / "lead", tmp_path / "member"]
        while not all(p.exists() for p in got) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [p.read_text() for p in got] == ["usr2", "usr2"]
        assert daemon.poll() is None  # not signalled: it would have died
        assert alive(set(wrappers)) == set(wrappers)  # the untrapped one too: left alone
        assert stackdump.signal_ranks([wrappers[0]], signal.SIGUSR2) == 0  # a root is no rank
    finally:
        for pid in stackdump.tree(daemon.pid)[1:]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        daemon.kill()
        daemon.wait(timeout=10)


LATE_TRAP = 'sleep 0.5; trap "echo usr2 > $1" USR2; : > "$1.trapped"; sleep 30'
"""A rank wrapper whose shell runs its trap late (a loaded host): it writes ``$1`` when SIGUSR2
arrives once trapped, and would die of one that came before."""
DAEMON_OF_ONE = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"


def test_a_signal_for_a_wrapper_not_trapping_yet_reaches_it_once_it_traps(tmp_path: Path) -> None:
    """The signal arriving right at a rank's start: its wrapper is found (by its argv) before
    its shell has run ``trap``; it is neither killed nor dropped but signalled once it traps."""
    out = tmp_path / "got"
    wrapper = ["/bin/sh", "-c", LATE_TRAP, "poprun-rank", str(out)]
    daemon = subprocess.Popen([PY, "-c", DAEMON_OF_ONE, *wrapper], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        wrappers: list[int] = []
        while not wrappers:
            assert time.monotonic() < deadline
            wrappers = [p for p in stackdump.tree(daemon.pid) if stackdump._is_rank_wrapper(p)]
        assert not stackdump.catches(wrappers[0], signal.SIGUSR2)  # the trap is 0.5 s away
        assert stackdump.signal_ranks([daemon.pid], signal.SIGUSR2) == 0  # not at once
        while not out.exists():
            assert time.monotonic() < deadline, "the signal was lost"
            time.sleep(0.01)
        assert out.read_text() == "usr2\n"  # its trap ran: it was signalled once trapping
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)


TRAPPED_NOT_STARTED = (
    'trap "echo usr2 >> $1" USR2; : > "$1.trapped"; while [ ! -e "$1.go" ]; do :; done; sleep 30'
)
"""A rank wrapper that has run its trap but not started its rank (builtins only, no fork) until
``$1.go`` exists: a signal then would reach the shell alone, never the rank."""


def test_a_wrapper_whose_rank_has_not_started_is_signalled_once_it_has(tmp_path: Path) -> None:
    """A wrapper that traps but has not forked its rank yet is not signalled at once (the
    signal would stop at the shell); it is signalled once its rank runs, and only then."""
    out = tmp_path / "got"
    wrapper = ["/bin/sh", "-c", TRAPPED_NOT_STARTED, "poprun-rank", str(out)]
    daemon = subprocess.Popen([PY, "-c", DAEMON_OF_ONE, *wrapper], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "got.trapped").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert stackdump.signal_ranks([daemon.pid], signal.SIGUSR2) == 0  # trapping, no rank
        time.sleep(0.2)  # the thread's polls meanwhile must not signal it
        assert not out.exists()
        (tmp_path / "got.go").touch()
        while not out.exists():
            assert time.monotonic() < deadline, "the signal was lost"
            time.sleep(0.01)
        assert out.read_text() == "usr2\n"  # once: its rank started, then it was signalled
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)


def test_a_wrapper_that_never_traps_or_ends_is_given_up() -> None:
    """A wrapper still not trapping after the wait is left alone (not killed); one gone is
    dropped at once."""
    wrapper = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 30; :", "poprun-rank"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while not stackdump._is_rank_wrapper(wrapper.pid):
            assert time.monotonic() < deadline
        started = identify(wrapper.pid)
        assert started is not None
        t0 = time.monotonic()
        assert stackdump.signal_when_trapped([started], signal.SIGUSR2, 0.2) == 0
        assert 0.2 <= time.monotonic() - t0 < 5 and wrapper.poll() is None
        assert stackdump.signal_when_trapped([(wrapper.pid, 0)], signal.SIGUSR2, 30) == 0
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=10)
    assert identify(wrapper.pid) is None
