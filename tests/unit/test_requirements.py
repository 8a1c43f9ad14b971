"""What a test needs of this machine (tests/requirements.py, the hooks in tests/conftest.py):
a missing program skips its test naming the Debian package; with CI=true every skip fails, by
its reason, whatever the test's markers, except the documented allowed ones (issue 27)."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

from tests import requirements

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
