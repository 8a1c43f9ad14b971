"""The first hour (issue 22): what a new user reads -- ``--version``, ``jobs`` piped, a bad host
range, a directory of inputs, eval padding, ranges instead of lists, the hang message's wording
and the instance table's detail -- asserted as the printed text."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import poprun_py
from poprun_py.cli import run


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"poprun-py {version('poprun-py')}\n"
    assert version("poprun-py") == poprun_py.__version__


def test_version_is_listed_in_the_top_level_help_without_importing_commands() -> None:
    code = (
        "import sys; from poprun_py.cli import run; run(['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('rich', 'poprun_py.cli.')) "
        "or m == 'importlib.metadata'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "  --version   Show poprun-py's version and exit.\n" in out
    assert out.splitlines()[-1] == "['poprun_py.cli.app']"
