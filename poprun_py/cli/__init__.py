"""The ``poprun-py`` command line: runs the typer app, turning poprun-py's typed errors into one
line on stderr and the documented exit code.

Command modules are imported lazily: only the module of the command being run is imported, and
the top-level ``--help`` is built from the :data:`COMMANDS` index alone, so it stays fast.

Example:

    >>> main(["plan", "--hosts", "localhost", "--replicas", "2", "--format", "json", "t.py"])
    ... # doctest: +ELLIPSIS
    {"num_replicas":2,...}
    0
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from poprun_py.cli.app import app, root
from poprun_py.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Interrupted,
    PoprunError,
    PreflightError,
)

PROG = "poprun-py"

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("launch_cmd", "Show the launch plan: hosts, instances, replicas, binding, shards."),
    "render": ("launch_cmd", "Show the commands a backend would run (secrets masked)."),
    "launch": ("launch_cmd", "Launch PROGRAM on every instance of the plan; wait for all."),
    "check": ("launch_cmd", "Check the planned instances: network, all-reduce, devices."),
    "exec": ("remote_cmd", "Run a command on every host in parallel."),
    "sync": ("remote_cmd", "Push files to every host at the same path."),
    "up": ("provision_cmd", "Create the cluster's nodes, wait for SSH, run its setup script."),
    "down": ("provision_cmd", "Remove everything poprun-py created for the cluster."),
    "status": ("provision_cmd", "List provisioned clusters and their nodes."),
    "jobs": ("jobs_cmd", "List detached jobs (launch --detach) and their states."),
    "logs": ("jobs_cmd", "Print (or --follow) a detached job's output."),
    "stop": ("jobs_cmd", "Stop a detached job on every host."),
    "wait": ("jobs_cmd", "Wait for a detached job to end; exit with its code."),
}
"""Command name → (module under ``poprun_py.cli`` that registers it, one-line help)."""
HIDDEN = {"supervise": "jobs_cmd"}
"""Commands not listed in the help: the detached job's supervisor (``launch --detach``)."""


def _subcommand(args: list[str]) -> str | None:
    return next((a for a in args if not a.startswith("-")), None)


def _index_app() -> Any:
    """An app listing every command by name and help, without importing command modules."""
    import typer

    index = typer.Typer(
        name=PROG,
        help=app.info.help,
        epilog=app.info.epilog,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    index.callback()(root)
    for name, (_, text) in COMMANDS.items():
        index.command(name, help=text, add_help_option=False)(_unavailable)
    return index


def _unavailable() -> None:  # pragma: no cover - never reached: real commands are loaded first
    raise RuntimeError("command index entry called")


def _target(args: list[str]) -> Any:
    name = _subcommand(args)
    if name in HIDDEN:
        importlib.import_module(f"poprun_py.cli.{HIDDEN[name]}")
        return app
    if name not in COMMANDS:
        return _index_app()
    importlib.import_module(f"poprun_py.cli.{COMMANDS[name][0]}")
    return app


_BASELINE = [0]
"""How many stop signals had come when this run began (the CLI also runs in-process)."""


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the exit code (no ``sys.exit``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    signals = sys.modules.get("poprun_py.process.signals")  # not imported yet: none came
    _BASELINE[0] = signals.stops_so_far() if signals is not None else 0
    try:
        result = _target(args)(args=args, prog_name=PROG, standalone_mode=False)
    except (Exception, KeyboardInterrupt) as exc:
        return _exit_code(exc)
    return int(result) if isinstance(result, int) else 0


def report_error(exc: BaseException) -> int:
    """Print ``exc`` as the CLI does (one line on stderr) and return its exit code; for code
    that runs a command's work outside the CLI's own handler (a detached job's supervisor)."""
    return _exit_code(exc)


def _exit_code(exc: BaseException) -> int:
    """Turn an error into one line on stderr and its exit code; re-raise what is not ours."""
    from typer import Abort, Exit
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    if isinstance(exc, Exit):
        return int(exc.exit_code)
    if isinstance(exc, NoArgsIsHelpError):
        exc.show()
        return EXIT_USAGE
    if isinstance(exc, ClickException):
        _error(_click_message(exc))
        return EXIT_USAGE
    if isinstance(exc, Abort | KeyboardInterrupt):
        _error(interrupted_by("interrupted"))
        return EXIT_INTERRUPTED
    if isinstance(exc, Interrupted):
        _error(interrupted_by(str(exc)))
        return exc.exit_code
    if isinstance(exc, PreflightError):
        _show_faults(exc)
    if isinstance(exc, PoprunError):
        _error(str(exc))
        return exc.exit_code
    raise exc


def interrupted_by(message: str) -> str:
    """``message`` (``interrupted: ...``) naming the signal that stopped poprun-py when it was
    not Ctrl-C: ``interrupted by SIGTERM: ...``."""
    signals = sys.modules.get("poprun_py.process.signals")
    signum = signals.stopped_by(_BASELINE[0]) if signals is not None else None
    if signum is None or "interrupted by" in message:
        return message
    from poprun_py.core.exit_codes import signal_name

    name = signal_name(signum) or f"signal {signum}"
    if name == "SIGINT":
        return message
    return message.replace("interrupted", f"interrupted by {name}", 1)


def _click_message(exc: Exception) -> str:
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return " ".join(message.split())


def _show_faults(exc: PreflightError) -> None:
    """Every host's faults in one table on stderr (before the one-line summary)."""
    if len(exc.faults) < 2:
        return
    from poprun_py.launch.summary import print_faults

    print_faults(exc.faults, sys.stderr)


def _error(message: str) -> None:
    from poprun_py.core.look import paint, use_colour

    sys.stderr.write(f"{PROG}: {paint('error:', 'error', use_colour(sys.stderr))} {message}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    code = run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: every command has finished its work (pools closed,
    # children reaped, files written), and freeing large plans object by object is slow.
    os._exit(code)
