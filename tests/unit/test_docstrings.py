"""Every module's usage example runs as written (doctest); the CLI's are shell examples."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import poprun_py

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(poprun_py.__path__, "poprun_py.")
    if not m.name.startswith(("poprun_py.cli", "poprun_py.__main__"))
)


NEEDS = {"poprun_py.prepare.discover": ("ip",)}  # its example finds `lo` with `ip -o addr`

NO_DOCTEST = {  # modules whose examples cannot run here, each with the reason
    "poprun_py.jobs": "a package overview: its example is the CLI's (launch --detach, logs, "
    "wait), run for real by tests/integration/test_detached.py",
    "poprun_py.jobs.finder": "every function reaches a supervisor's host (the registry's, or "
    "a cluster's over SSH): tests/integration/test_detached.py",
    "poprun_py.jobs.supervisor": "its functions fork and detach the process running them: "
    "tests/integration/test_detached_local.py",
    "poprun_py.providers.aws": "needs an EC2 endpoint (moto server): "
    "tests/integration/test_provision_aws.py",
}
"""Exempt from running at least one docstring example; every other module must run one."""


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.requires(*NEEDS.get(m, ()))) for m in MODULES]
)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
    if name in NO_DOCTEST:
        assert result.attempted == 0, f"{name} runs examples now: drop it from NO_DOCTEST"
    else:  # an example written as a literal block (no >>>) would never run
        assert result.attempted > 0, f"no docstring example of {name} ran (add a doctest)"


def test_every_exemption_names_a_module_and_a_reason() -> None:
    assert set(NO_DOCTEST) <= set(MODULES)
    assert all(len(why) > 20 for why in NO_DOCTEST.values())
