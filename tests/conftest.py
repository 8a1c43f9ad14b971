"""Shared pytest plugins: real test hosts (network namespaces + sshd), moto as a local server,
and a real Slurm test cluster.

With ``CI=true``, a test marked ``hosts``, ``mpi``, ``slurm`` or ``cloud`` that skips (its set-up
is missing: not root, a package not installed) is reported as a failure instead: CI runs
everything. The exceptions: ``old_pythons`` (interpreters older than any distribution ships,
pyenv builds on the development machines, which no set-up step can install) and ``torch``
(installed by ``scripts/test.sh`` only from a wheel the machine already has: a registry's torch
is several GB).
"""

import os
from collections.abc import Iterator

import pytest

pytest.register_assert_rewrite("tests.integration.helpers")

pytest_plugins = ["tests.hostfixtures", "tests.motofixtures", "tests.slurmfixtures"]

SETUP_MARKERS = ("hosts", "mpi", "slurm", "cloud")


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _ci()) or hasattr(report, "wasxfail"):
        return
    if item.get_closest_marker("old_pythons") or item.get_closest_marker("torch"):
        return
    markers = [name for name in SETUP_MARKERS if item.get_closest_marker(name)]
    if markers:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a test marked {', '.join(markers)} may not skip: {reason}"
