"""The typer application object shared by every command module, and the console used to print.

Command modules (``plan_cmd``, ``launch_cmd``, ``remote_cmd``, ``provision_cmd``) register their
commands on :data:`app`; ``poprun_py.cli.main`` imports them all and runs the app, turning
``PoprunError`` into one line on stderr and its exit code. Heavy libraries (rich,
paramiko, jinja2, pydantic) are imported inside command functions only, so ``--help`` is fast.

Example:

    >>> from poprun_py.cli.app import app, version_line
    >>> app.info.name
    'poprun-py'
    >>> version_line()  # doctest: +ELLIPSIS
    'poprun-py ...'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

TOP_EXAMPLES = (
    "poprun-py plan --hosts node[01-04] --replicas 8 train.py",
    "poprun-py launch -c clusters/local-2.yaml python examples/train.py",
    "poprun-py exec --hosts node[01-04] --gather -- nvidia-smi -L",
    "poprun-py COMMAND --help",
)
"""The top-level help's examples (each command's are in :mod:`poprun_py.cli.examples`)."""


def examples_section(lines: Sequence[str]) -> str:
    """An ``Examples:`` section for a help's epilog, the lines kept as written (click's ``\\b``:
    no rewrapping)."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"Examples:\n\n\b\n{body}"


app = typer.Typer(
    name="poprun-py",
    help="One-key multi-host launches of distributed training (PopRun-style plans, "
    "FastGPU-style provisioning).",
    epilog=examples_section(TOP_EXAMPLES),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version_line() -> str:
    """``poprun-py X.Y.Z``: the installed distribution's version, else ``poprun_py.__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("poprun-py")
    except PackageNotFoundError:
        from poprun_py import __version__ as number
    return f"poprun-py {number}"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


def root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Show poprun-py's version and exit.",
        is_eager=True,
        callback=_show_version,
    ),
) -> None:
    """The top-level options (``--version``); a command always follows."""


app.callback()(root)

PROGRAM_CONTEXT = {"allow_interspersed_args": False}
"""Context for commands taking ``PROGRAM [ARGS]...``: everything after PROGRAM is the program's."""


def console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); imported lazily."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)
