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
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def pytest_configure(config: pytest.Config) -> None:
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
    """One line for the tests that skipped for want of something, and how to add it."""
    if _lacking:
        lacking = requirements.missing(_lacking)
        count = len(_skipped_for_want)
        effect = f"{count} tests that need them skipped" if not _ci() else f"{count} tests failed"
        line = "tests.requirements: " + requirements.summary(lacking, effect)
        terminalreporter.write_line(line, yellow=True)
