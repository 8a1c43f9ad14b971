"""Shared pytest plugins: real test hosts (network namespaces + sshd), moto as a local server,
and a real Slurm test cluster; and what a test needs of this machine (tests/requirements.py).

A test that needs a program, a Python module or root says so with ``@pytest.mark.requires(...)``
(tests marked ``hosts`` or ``slurm`` need what test hosts and a test Slurm need besides). When
this machine lacks one, the test skips, and its reason names what is missing and the Debian
package that brings it.

With ``CI=true`` every skip is a failure instead, whatever the test's markers: CI runs
everything. Only the skips of ``tests.requirements.ALLOWED_SKIPS`` may stay skips, recognised
by their reason: torch missing (scripts/test.sh installs it only from a wheel the machine
already has: a registry's torch is several GB) and old Pythons (pyenv's 3.6/3.7 builds on the
development machines, older than any distribution ships, which no set-up step can install).

A session leaves nothing behind and depends on nothing its runner left (issue 26):

- signals: a runner that ignored SIGINT/SIGQUIT (``cmd &`` in a shell script) or blocked signals
  would pass that on to every process a test starts; the session restores the defaults first;
- its own ``XDG_CACHE_HOME`` and ``XDG_STATE_HOME`` (a fresh temporary directory, removed at the
  end), so nothing goes to the runner's home (``~/.cache/poprun-py/templates``, job records);
- ``POPRUN_TEST_SESSION=<uuid4>`` in its environment, which every process it starts inherits;
  at the end (after a grace period for processes still exiting: ``POPRUN_TEST_LEAK_GRACE``,
  10 s) any such process still running, any network namespace or route of the session's test
  hosts (tests/hostfixtures.py), and the file an injection test's payload would create
  (``/tmp/pwned-poprun*``) fail the session, named, and are removed. (Processes in test hosts
  are started by their sshd and inherit nothing: each cluster's teardown checks those.)

A session started by a test of another (an inner pytest) leaves all this to the outer one. The
random order's seed (pytest-randomly) is printed at the end, to replay an order.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.hostside.identity import identify, read_stat, signal_same
from tests import requirements

pytest.register_assert_rewrite("tests.integration.helpers")

pytest_plugins = [
    "pytester",  # tests/unit/test_requirements.py runs these hooks in inner sessions
    "tests.hostfixtures",
    "tests.motofixtures",
    "tests.slurmfixtures",
]

_lacking: dict[str, None] = {}  # what this session's tests lack (an ordered set)
_skipped_for_want: list[str] = []  # their node ids

SESSION_VAR = "POPRUN_TEST_SESSION"
LEAK_GRACE_VAR = "POPRUN_TEST_LEAK_GRACE"
LEAK_GRACE = 10.0  # seconds for processes to finish exiting before they count as left behind
SCRATCH_PREFIX = "poprun-tests-"  # + "<pid>-<start time>-": a session's XDG directories
PWNED = "/tmp/pwned-poprun*"  # what the injection tests' payloads would create
_XDG = ("XDG_CACHE_HOME", "XDG_STATE_HOME")
_CHILD_DEFAULTS = (  # ignored by the runner: kept away from pytest, default again in children
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
)
_session: dict[str, object] = {}  # the outer session's marker, scratch dir, saved environment
_left: list[str] = []  # what the session left behind (reported in the summary)


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def pytest_configure(config: pytest.Config) -> None:
    default_signals()
    config.addinivalue_line(
        "markers",
        "requires(*needs): needs these programs, Python modules or root (tests/requirements.py);"
        " skips naming what is missing and its Debian package, fails with CI=true",
    )


def needs_of(item: pytest.Item) -> list[str]:
    """What ``item`` needs: its ``requires`` markers' names and its markers' implied needs."""
    names: list[str] = []
    for marker in item.iter_markers("requires"):
        names.extend(marker.args)
    for marker, implied in requirements.MARKER_NEEDS.items():
        if item.get_closest_marker(marker):
            names.extend(implied)
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = needs_of(item)
        bad = requirements.unknown(names)
        if bad:
            raise pytest.UsageError(f"{item.nodeid}: requires {bad}: not in tests/requirements.py")
        lacking = requirements.missing(names)
        if lacking:
            _lacking.update(dict.fromkeys(n.name for n in lacking))
            _skipped_for_want.append(item.nodeid)
            reason = requirements.reason(n.name for n in lacking)
            item.add_marker(pytest.mark.skip(reason=reason))


# ---------------------------------------------------------------- signals, session, leftovers


def _ignore(signum: int, frame: object) -> None:
    """What an ignored signal does to pytest still, as a handler: children start with SIG_DFL."""


def default_signals() -> None:
    """Undo what a runner passed on: SIGINT ignored (``cmd &`` in a shell script: Python then
    keeps it ignored, and so does every process a test starts), other signals ignored, a
    blocked signal mask. SIGINT raises KeyboardInterrupt again, as in an interactive run; the
    others stay without effect on pytest, through a handler that exec resets to SIG_DFL."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _CHILD_DEFAULTS:
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, _ignore)
    if signal.pthread_sigmask(signal.SIG_BLOCK, []):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])


def pytest_sessionstart(session: pytest.Session) -> None:
    """The outer session: a marker every process of the suite inherits, its own XDG dirs. The
    random order's seed first (also with -q, which hides the header: a killed run has it too)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    line = _seed_line(session.config)
    if reporter is not None and line:
        reporter.write_line(line)
    if SESSION_VAR in os.environ:
        return  # an inner pytest, run by a test of the session that owns the marker
    _left.clear()  # pytest.main run again in one process (mutmut) imports this module once
    _remove_stale_scratch()
    for path in glob.glob(PWNED):  # a killed session's (it would fail the injection tests)
        os.unlink(path)
    me = identify(os.getpid())
    assert me is not None
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{me[0]}-{me[1]}-"))
    _session.update(marker=uuid.uuid4().hex, scratch=scratch)
    _session["saved"] = {name: os.environ.get(name) for name in (SESSION_VAR, *_XDG)}
    os.environ[SESSION_VAR] = str(_session["marker"])
    for name in _XDG:
        directory = scratch / name.lower()
        directory.mkdir(mode=0o700)
        os.environ[name] = str(directory)


def _remove_stale_scratch() -> None:
    """The XDG directories of sessions that are gone (killed before they removed their own)."""
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid, start = path.name[len(SCRATCH_PREFIX) :].split("-")[:2]
        if pid.isdigit() and start.isdigit() and identify(int(pid)) != (int(pid), int(start)):
            shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after the runner's own teardown of what -x left set up
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session if it left anything behind (after a grace period), and remove it."""
    if "marker" not in _session:
        return
    from tests import hostfixtures  # a plugin (pytest_plugins): imported by pytest first

    try:
        grace = float(os.environ.get(LEAK_GRACE_VAR, LEAK_GRACE))
        _left.extend(_wait_for_leftovers(str(_session["marker"]).encode(), grace))
        if _left and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        hostfixtures.forget_session()
    finally:
        _end_session()


def _wait_for_leftovers(marker: bytes, grace: float) -> list[str]:
    """What the session left: polled until nothing is, or until ``grace`` seconds have passed
    (processes may still be exiting); then it is removed (processes killed)."""
    from tests import hostfixtures

    deadline = time.monotonic() + grace
    while True:
        processes = marked_processes(marker)
        left = [f"process {pid}: {command}" for (pid, _), command in processes.items()]
        left += hostfixtures.session_leftovers()
        left += [f"file {path}" for path in sorted(glob.glob(PWNED))]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    for ident in processes:
        signal_same(ident, signal.SIGKILL)
    if any(not item.startswith(("process", "file")) for item in left):
        hostfixtures.remove_session_leftovers()
    for path in glob.glob(PWNED):
        os.unlink(path)
    return left


def marked_processes(marker: bytes) -> dict[tuple[int, int], str]:
    """The processes (pid, start time) whose environment has ``POPRUN_TEST_SESSION=marker``,
    but this one and its ancestors, with their command lines."""
    needle = f"{SESSION_VAR}=".encode() + marker
    skip = _ancestors()
    found: dict[tuple[int, int], str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            command = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        ident = identify(int(name))
        if ident is not None and needle in environ.split(b"\0"):
            found[ident] = command.replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        stat = read_stat(pid)
        pid = stat[0] if stat else 0
    return pids


def _end_session() -> None:
    shutil.rmtree(str(_session["scratch"]), ignore_errors=True)
    saved = _session["saved"]
    assert isinstance(saved, dict)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _session.clear()


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _ci()) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if requirements.allowed_skip(reason) is None:
        report.outcome = "failed"
        report.longrepr = f"CI=true: no test may skip (but {_allowed()}): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A module that skips as a whole (``allow_module_level``) is held to the same rule."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and _ci():
        reason = _skip_reason(report)  # type: ignore[arg-type]
        if requirements.allowed_skip(reason) is None:
            report.outcome = "failed"
            report.longrepr = f"CI=true: no module may skip (but {_allowed()}): {reason}"


def _allowed() -> str:
    return " and ".join(a.name for a in requirements.ALLOWED_SKIPS)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line for the tests that skipped for want of something, and how to add it; what the
    session left behind; the seed of the random order."""
    if _lacking:
        lacking = requirements.missing(_lacking)
        count = len(_skipped_for_want)
        effect = f"{count} tests that need them skipped" if not _ci() else f"{count} tests failed"
        line = "tests.requirements: " + requirements.summary(lacking, effect)
        terminalreporter.write_line(line, yellow=True)
    if _left:
        terminalreporter.write_line(
            "tests/conftest.py: the session left these behind (now removed):",
            red=True,
        )
        for item in _left:
            terminalreporter.write_line(f"  {item}", red=True)
    line = _seed_line(terminalreporter.config)
    if line:
        terminalreporter.write_line(line)


def _seed_line(config: pytest.Config) -> str:
    seed = getattr(config.option, "randomly_seed", None)  # absent with -p no:randomly
    if not isinstance(seed, int):
        return ""
    return f"random order: -p randomly --randomly-seed={seed} replays it"
