"""Issue 21, item 1: no command declares an option of its own. Every parameter of every command
(``exec``, ``sync``, ``jobs``, ``logs``, ``up``... as well as plan/render/launch/check) is an
entry of the option catalog (``poprun_py.core.options.OPTIONS``), made a typer parameter by
``poprun_py.cli.options.takes``: no cli module writes ``typer.Option(``/``typer.Argument(``
or an ``Annotated`` parameter, and each command's parameters are exactly its entries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from poprun_py.cli import COMMANDS, HIDDEN
from poprun_py.cli.options import OPTIONS, REQUIRED, taken_by
from poprun_py.cli.reference import _commands

CLI = Path(__file__).resolve().parents[2] / "poprun_py" / "cli"
MAKERS = ("options.py",)
"""The one cli module that makes typer parameters (of the catalog's entries)."""
TOP_LEVEL = {"app.py": 1}
"""``poprun-py --version``: the root callback's eager flag, not a command's option."""
DECLARING = re.compile(r"typer\.(Option|Argument)\(|Annotated\[")
ALL = [*COMMANDS, *HIDDEN]


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_no_cli_module_declares_an_option_outside_the_catalog(path: Path) -> None:
    if path.name in MAKERS:
        return
    found = DECLARING.findall(path.read_text(encoding="utf-8"))
    assert len(found) == TOP_LEVEL.get(path.name, 0), (
        f"{path.name} declares a typer option by hand: make it an entry of "
        "poprun_py/core/options.py and take it with @options.takes(command)"
    )


def test_the_top_level_version_flag_is_the_one_exception() -> None:
    text = (CLI / "app.py").read_text(encoding="utf-8")
    assert '"--version"' in text and len(DECLARING.findall(text)) == 1


@pytest.mark.parametrize("command", ALL)
def test_every_parameter_of_every_command_is_its_catalog_entry(command: str) -> None:
    params = _commands()[command].params
    mine = {f.name: f for f in taken_by(command)}
    assert len(mine) == len(taken_by(command)), f"two entries of {command} share a name"
    assert sorted(p.name for p in params) == sorted(mine), command
    for param in params:
        flag = mine[param.name]
        if flag.decls:
            assert param.param_type_name == "option", param.name
            assert [*param.opts, *param.secondary_opts] == _names(flag.decls), param.name
            assert param.help == flag.help
        else:
            assert param.param_type_name == "argument", param.name
        assert param.required == (flag.default is REQUIRED), param.name
        if flag.default is not REQUIRED:
            assert param.default == flag.default, param.name


def _names(decls: tuple[str, ...]) -> list[str]:
    return [*decls[0].split("/")[:1], *decls[1:], *decls[0].split("/")[1:]]


def test_every_entry_is_taken_by_a_command() -> None:
    unused = [k for k, f in OPTIONS.items() if f.commands and not set(f.commands) & set(ALL)]
    assert not unused


def test_a_name_two_commands_mean_differently_is_two_entries_under_two_keys() -> None:
    timeouts = {k: f.commands for k, f in OPTIONS.items() if f.name == "timeout"}
    assert timeouts == {
        "timeout": ("plan", "render", "launch", "check"),
        "exec_timeout": ("exec",),
        "sync_timeout": ("sync",),
    }
    keys = {k for k, f in OPTIONS.items() if f.name == "accept_new_host_keys"}
    assert keys == {"accept_new_host_keys", "static_host_keys"}
    for key, flag in OPTIONS.items():
        assert key == (flag.key or flag.name)
