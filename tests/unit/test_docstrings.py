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


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.requires(*NEEDS.get(m, ()))) for m in MODULES]
)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
