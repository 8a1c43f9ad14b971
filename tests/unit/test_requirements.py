"""What a test needs of this machine (tests/requirements.py, the hooks in tests/conftest.py):
a missing program skips its test naming the Debian package; with CI=true every skip fails, by
its reason, whatever the test's markers, except the documented allowed ones (issue 27).

And what a session leaves and takes (tests/conftest.py, tests/hostfixtures.py; issue 26): a
runner's ignored SIGINT reaches no test's process; a process left running fails the session;
its XDG directories go with it; the hosts' reaper tells a dead session by pid and start time."""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from poprun_py.hostside.identity import identify
from tests import hostfixtures, requirements

ROOT = Path(__file__).resolve().parents[2]

HOOKS = """
from tests.conftest import (
    pytest_collection_modifyitems, pytest_configure, pytest_make_collect_report,
    pytest_runtest_makereport, pytest_terminal_summary,
)
"""

TESTS = """
import pytest

@pytest.mark.requires("pgrep")
def test_needs_pgrep():
    pass

def test_skips_for_want_of_cpus():
    pytest.skip("needs CPUs 0-1 and NUMA node 0")

def test_without_torch():
    pytest.skip("could not import 'torch': No module named 'torch'")

def test_without_an_old_python():
    pytest.skip("no python3.7 build here (pyenv) to stand in for a host's python3")

def test_runs():
    pass
"""


@pytest.fixture
def bare(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An inner test session with the suite's hooks, on a PATH without pgrep."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("CI", raising=False)
    pytester.makeconftest(HOOKS)
    return pytester.makepyfile(test_inner=TESTS)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfEs", *args)


def test_a_missing_program_is_a_skip_naming_its_debian_package(
    pytester: pytest.Pytester, bare: Path
) -> None:
    result = run(pytester)
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(["SKIPPED*needs pgrep (Debian package procps)"])
    result.stdout.fnmatch_lines(["*missing here: pgrep (procps)*apt-get install procps"])


def test_with_ci_every_skip_fails_by_its_reason_but_the_allowed_ones(
    pytester: pytest.Pytester, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = run(pytester)
    result.assert_outcomes(passed=1, skipped=2, failed=1, errors=1)  # a marker's: at set-up
    failed = {line.split()[1] for line in result.outlines if line.startswith(("FAILED", "ERROR"))}
    names = {"test_inner.py::test_needs_pgrep", "test_inner.py::test_skips_for_want_of_cpus"}
    assert failed == names
    result.stdout.fnmatch_lines(["*CI=true: no test may skip*needs pgrep (Debian package procps)"])
    result.stdout.fnmatch_lines(["*CI=true: no test may skip*needs CPUs 0-1 and NUMA node 0"])


def test_a_need_missing_from_the_table_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(
        test_typo="import pytest\n\n@pytest.mark.requires('prgep')\ndef test_x():\n    pass\n"
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_x: requires ['prgep']: not in tests/requirements.py" in result.stderr.str()


def test_markers_imply_what_test_hosts_and_slurm_need() -> None:
    assert {"root", "sshd", "ip"} <= set(requirements.MARKER_NEEDS["hosts"])
    assert set(requirements.HOST_NEEDS) < set(requirements.MARKER_NEEDS["slurm"])
    assert requirements.unknown(requirements.SLURM_NEEDS) == []


def test_install_deps_gets_the_missing_debian_packages_from_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install-deps.sh installs what ``requirements.py --packages`` prints (pip's are not)."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no procps, no Open MPI, ... (sbin daemons stay)
    lacking = requirements.missing(requirements.NEEDS)
    out = subprocess.run(
        ["/usr/bin/python3", "tests/requirements.py", "--packages"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == requirements.debian_packages(lacking)
    assert {"procps", "openmpi-bin", "openssh-client"} <= set(out) and "pip" not in out
    script = (ROOT / "scripts" / "install-deps.sh").read_text()
    assert "tests/requirements.py --packages" in script


def test_the_summary_is_one_line_with_one_apt_get_line() -> None:
    line = requirements.summary(list(requirements.NEEDS.values()))
    assert "\n" not in line and line.count("apt-get install") == 1
    assert line.startswith("missing here: not root (test hosts), pgrep/pkill/ps (procps), ")
    assert requirements.summary([]) == "everything the tests need is here: the whole suite runs"


def test_the_modules_examples_run() -> None:
    assert doctest.testmod(requirements).failed == 0
    assert doctest.testmod(requirements).attempted >= 4


def test_it_runs_on_the_distributions_python_alone() -> None:
    """install-deps.sh runs it before any venv: only the standard library, any python3."""
    done = subprocess.run(
        [sys.executable, "-S", "-I", str(ROOT / "tests" / "requirements.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1


# ---------------------------------------------------------------- ptrace rights (py-spy)

PYSPY_TESTS = (  # every test whose py-spy reads a process it did not start
    "tests/integration/test_long_run_local.py::"
    "test_a_local_hang_is_dumped_by_py_spy_into_the_hung_instances_log_and_stderr",
    "tests/integration/test_long_run_hosts.py::test_a_hang_is_caught_with_every_stack_in_the_logs",
    "tests/integration/test_long_run_hosts.py::test_a_hung_slurm_step_has_every_stack_in_the_logs"
    "[True]",
    "tests/unit/test_slurm_stacks.py::test_the_dump_step_reports_each_ranks_stacks_as_records",
)

NO_PTRACE = """
from tests import requirements

def pytest_configure(config):
    requirements.YAMA = {yama!r}  # Yama's ptrace_scope 3: nobody may ptrace
"""


def test_ptrace_is_refused_by_yama_or_for_want_of_cap_sys_ptrace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    yama = tmp_path / "ptrace_scope"
    monkeypatch.setattr(requirements, "YAMA", str(yama))
    assert requirements.NEEDS["ptrace"].present()  # no Yama: a user may trace its own
    for scope, capable, present in [(1, True, True), (1, False, False), (3, True, False)]:
        yama.write_text(f"{scope}\n")
        monkeypatch.setattr(requirements, "_capable", lambda _: capable)
        assert requirements.NEEDS["ptrace"].present() == present, (scope, capable)
    why = requirements.reason(["ptrace"])
    assert why.startswith("needs ptrace (py-spy reads processes it did not start: here ")
    assert "kernel.yama.ptrace_scope is 3" in why and "sysctl kernel.yama.ptrace_scope=0" in why
    assert "run the tests as root" in why


def setup_plan(tests: Sequence[str], ci: bool, tmp_path: Path, *before: str) -> str:
    """The output of the suite's ``--setup-plan`` of ``tests`` (run with ``before`` in front,
    plugins from ``tmp_path``): no test body runs, and no fixture of a skipped test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("CI", None)
    env.update({"CI": "true"} if ci else {})
    argv = [*before, sys.executable, "-m", "pytest", "-p", "no:randomly", "-rfEs"]
    argv += ["-p", "no:cacheprovider", "--setup-plan", *tests]
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    ).stdout


@pytest.mark.parametrize("ci", [False, True], ids=["skips", "ci-fails"])
def test_the_py_spy_tests_need_ptrace_through_the_table(tmp_path: Path, ci: bool) -> None:
    """Without ptrace rights, each py-spy test skips at set-up (before its fixtures start
    anything) naming the fix; with CI=true each fails. ``--setup-plan`` runs no test body: a
    test that checked by hand, in its body, would show as passed here."""
    (tmp_path / "ptrace_scope").write_text("3\n")
    (tmp_path / "no_ptrace.py").write_text(NO_PTRACE.format(yama=str(tmp_path / "ptrace_scope")))
    out = setup_plan(["-p", "no_ptrace", *PYSPY_TESTS], ci, tmp_path)
    expected = "8 errors" if ci else "8 skipped"
    assert re.search(rf"^=+ {expected} in ", out, re.M), out
    reasons = [line for line in out.splitlines() if line.startswith(("SKIPPED", "ERROR"))]
    # -rs folds the skips of one reason and line ("SKIPPED [3] ..."); what else a skip names
    # (mpirun, root...) depends on the machine, so the tests are counted, not the lines
    counted = [int(m.group(1)) if (m := re.match(r"SKIPPED \[(\d+)\]", r)) else 1 for r in reasons]
    assert sum(counted) == 8, out
    for line in reasons:
        assert "needs " in line and "ptrace (" in line, line
        assert "sysctl kernel.yama.ptrace_scope=0" in line, line


BINDS_TWO_RANKS = (
    "tests/integration/test_mpirun_hosts.py::"
    "test_open_mpi_binds_every_rank_itself_from_the_rankfile"
)


def test_two_usable_cpus_are_missing_under_taskset_with_what_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert not requirements.NEEDS[requirements.TWO_CPUS].present()
    why = requirements.reason([requirements.TWO_CPUS])
    assert why.startswith("needs 2 usable CPUs (") and "taskset -c N" in why
    assert why.endswith("here this process may use CPU 3 only)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5})
    assert requirements.NEEDS[requirements.TWO_CPUS].present()


@pytest.mark.requires("taskset")
@pytest.mark.parametrize("ci", [False, True], ids=["skips", "ci-fails"])
def test_the_rankfile_test_on_one_cpu_skips_naming_it_and_fails_with_ci(
    tmp_path: Path, ci: bool
) -> None:
    """Under ``taskset -c CPU`` (the second CI profile's one CPU) Open MPI's rankfile test
    skips through the table, naming the CPU it has; with CI=true it fails (no hidden skip)."""
    cpu = str(min(os.sched_getaffinity(0)))
    out = setup_plan([BINDS_TWO_RANKS], ci, tmp_path, "taskset", "-c", cpu)
    assert re.search(rf"^=+ 1 {'error' if ci else 'skipped'} in ", out, re.M), out
    assert "needs 2 usable CPUs (" in out and f"may use CPU {cpu} only)" in out, out


# ---------------------------------------------------------------- what a session leaves and takes

SESSION_HOOKS = """
from tests.conftest import (
    pytest_configure, pytest_sessionfinish, pytest_sessionstart, pytest_terminal_summary,
)
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """An inner session that owns its session (no outer marker), with a short leak grace."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("POPRUN_TEST_SESSION")
    monkeypatch.setenv("POPRUN_TEST_LEAK_GRACE", "1")
    return pytester


def sigign(pid: int) -> int:
    """The mask of the signals process ``pid`` ignores (/proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


IGNORING = """
import signal, subprocess, sys
from tests.unit.test_requirements import sigign

def test_children_start_with_the_default_sigint():
    child = subprocess.Popen(["sleep", "30"])
    try:
        mask = sigign(child.pid)
    finally:
        child.kill()
        child.wait()
    assert mask & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)) == 0, hex(mask)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
"""


@pytest.mark.parametrize("hooks", [True, False], ids=["suite-hooks", "without-them"])
def test_a_runner_that_ignores_sigint_passes_it_on_to_no_test(
    inner: pytest.Pytester, hooks: bool
) -> None:
    """``cmd &`` in a shell script starts pytest with SIGINT and SIGQUIT ignored; every process
    a test started would inherit that. The suite's hooks restore the defaults (and the same
    inner test fails without them: the check can fail)."""
    inner.makeconftest(SESSION_HOOKS if hooks else "")
    inner.makepyfile(test_inner=IGNORING)
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly"]
    trap = ["sh", "-c", 'trap "" INT QUIT; exec "$@"', "sh", *pytest_argv]
    result = inner.run(*trap, "test_inner.py", timeout=120)
    result.assert_outcomes(passed=1) if hooks else result.assert_outcomes(failed=1)


LEAKING = """
import os, subprocess
from pathlib import Path

def test_leaves_a_sleeper():
    Path("xdg").write_text(os.environ["XDG_CACHE_HOME"] + "\\n" + os.environ["XDG_STATE_HOME"])
    sleeper = subprocess.Popen(["sleep", "61.7"], start_new_session=True)
    Path("pid").write_text(str(sleeper.pid))
"""

TIDY = """
import os, subprocess
from pathlib import Path

def test_waits_for_its_child():
    Path("xdg").write_text(os.environ["XDG_CACHE_HOME"] + "\\n" + os.environ["XDG_STATE_HOME"])
    subprocess.run(["sleep", "0.1"], check=True)
"""


@pytest.mark.parametrize("leak", [True, False], ids=["leaves-a-process", "tidy"])
def test_a_process_left_running_fails_the_session_and_is_removed(
    inner: pytest.Pytester, leak: bool
) -> None:
    inner.makeconftest(SESSION_HOOKS)
    inner.makepyfile(test_inner=LEAKING if leak else TIDY)
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    xdg = (inner.path / "xdg").read_text().split("\n")
    assert all(path.startswith("/") and not Path(path).exists() for path in xdg), xdg
    if not leak:
        assert result.ret == pytest.ExitCode.OK
        assert "left these behind" not in result.stdout.str()
        return
    pid = int((inner.path / "pid").read_text())
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*the session left these behind (now removed):", f"  process {pid}: sleep 61.7"]
    )
    assert identify(pid) is None or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_session_is_dead_when_its_pid_is_gone_or_names_a_later_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostfixtures, "SESSIONS_DIR", tmp_path)
    me = identify(os.getpid())
    assert me is not None
    assert hostfixtures.session_alive(os.getpid())  # no record: its pid alone
    (tmp_path / str(os.getpid())).write_text(json.dumps({"start": me[1], "routes": []}))
    assert hostfixtures.session_alive(os.getpid())
    (tmp_path / str(os.getpid())).write_text(json.dumps({"start": me[1] - 1, "routes": []}))
    assert not hostfixtures.session_alive(os.getpid())  # this pid was another's, earlier
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    assert not hostfixtures.session_alive(int(gone.stdout))


ROUTE = ("blackhole", "198.19.255.254")  # a test net's address no cluster of netns.py gets


@pytest.mark.requires("root", "ip")
def test_the_reaper_removes_a_dead_sessions_routes_and_keeps_a_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostfixtures, "SESSIONS_DIR", tmp_path)
    # ROUTE's /24 counts as a cluster's (the records alone decide), and so do the real ones:
    # without them, this reaper would take the routes of sessions running meanwhile
    in_use = hostfixtures._subnets_in_use
    monkeypatch.setattr(hostfixtures, "_subnets_in_use", lambda: {*in_use(), "198.19.255"})
    monkeypatch.setattr(hostfixtures, "_routes", set())
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    try:
        hostfixtures.add_route(*ROUTE)  # recorded as this (live) session's
        hostfixtures._reap_stale_routes()
        assert ROUTE in hostfixtures._test_routes()
        routes = [i for i in hostfixtures.session_leftovers() if i.startswith("route ")]
        assert routes == [f"route {ROUTE[0]} {ROUTE[1]}"]  # (the session's hosts may be up)
        (tmp_path / str(os.getpid())).unlink()
        record = {"start": 1, "routes": [list(ROUTE)]}
        (tmp_path / dead.stdout.strip()).write_text(json.dumps(record))  # the dead one's
        hostfixtures._reap_stale_routes()
        assert ROUTE not in hostfixtures._test_routes()
    finally:
        subprocess.run(["ip", "route", "del", ROUTE[0], f"{ROUTE[1]}/32"], check=False)


@pytest.mark.requires("root", "ip")
def test_the_reaper_removes_a_test_route_whose_subnet_no_cluster_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostfixtures, "SESSIONS_DIR", tmp_path)
    subprocess.run(["ip", "route", "add", ROUTE[0], f"{ROUTE[1]}/32"], check=True)  # unrecorded
    try:
        assert ROUTE in hostfixtures._test_routes()
        hostfixtures._reap_stale_routes()
        assert ROUTE not in hostfixtures._test_routes()
    finally:
        subprocess.run(["ip", "route", "del", ROUTE[0], f"{ROUTE[1]}/32"], check=False)
