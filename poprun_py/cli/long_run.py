"""The long-run options of ``launch`` (restarts, spares, clocks) and how a restarted job's
attempts are told on stderr: each restart as it happens (:func:`announcing`: ``attempt 0
failed: ROOT CAUSE; restarting (1/2) in 5 s``, then ``attempt 1 running (restart 1/2)``), and
every attempt again in the summary at the end (:func:`attempt_lines`).

Example:

    >>> from poprun_py.core.result import InstanceResult, JobCause, LaunchResult
    >>> first = LaunchResult((InstanceResult(1, "h2", exit_code=7),))
    >>> last = LaunchResult((InstanceResult(1, "h2", exit_code=0),), attempts=(first,))
    >>> attempt_lines(last)
    ['attempt 0: instance 1 on h2 exited with code 7; restarted', 'attempt 1: ok']
    >>> hung = LaunchResult((), cause=JobCause("instance 0 on h1 hung (no progress for 5 s)", 124))
    >>> describe(hung)
    'instance 0 on h1 hung (no progress for 5 s); every instance was stopped'
    >>> import io
    >>> from poprun_py.launch.restarts import ANNOUNCE
    >>> err = io.StringIO()
    >>> with announcing(err):
    ...     ANNOUNCE.info("attempt %d running (restart %d/%d)", 1, 1, 2)
    >>> err.getvalue()
    'poprun-py: attempt 1 running (restart 1/2)\\n'
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Optional, TextIO

import typer

if TYPE_CHECKING:
    from poprun_py.core.result import LaunchResult

H_LONG = "Long runs"

MaxRestarts = Annotated[
    Optional[int],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--max-restarts",
        rich_help_panel=H_LONG,
        help="Restart the whole job up to N times after a failure (an instance failed, a host "
        "was lost, a hang, the time limit); never after Ctrl-C/SIGTERM. Instances see "
        "POPRUN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT (default: spec, else 0).",
    ),
]
RestartDelay = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option("--restart-delay", rich_help_panel=H_LONG, help="Seconds before a restart."),
]
Timeout = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--timeout",
        rich_help_panel=H_LONG,
        help="Stop an attempt running longer than this (90s, 45m, 2h): 'timed out', exit 124.",
    ),
]
HangTimeout = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--hang-timeout",
        rich_help_panel=H_LONG,
        help="An instance without output (or poprun_py.dist.heartbeat()) for S seconds is "
        "hung: its stacks are dumped into the logs, then the job stops (exit 124).",
    ),
]
SpareHosts = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--spare-hosts",
        rich_help_panel=H_LONG,
        help="Hosts held back to replace a lost one on a restart: host syntax, or N (the last "
        "N hosts given). Default: the spec's spares.",
    ),
]


def describe(result: LaunchResult) -> str:
    """One line: why the (last) attempt failed."""
    from poprun_py.launch.restarts import why_failed

    if result.cause is not None:
        return f"{why_failed(result)}; every instance was stopped"
    if result.root_cause is None:
        return why_failed(result)
    return f"{why_failed(result)}; every other instance was stopped"


def _cause(result: LaunchResult) -> str:
    from poprun_py.launch.restarts import why_failed

    if result.interrupted:
        return "interrupted"
    if result.ok:
        return "ok"
    return why_failed(result)


@contextlib.contextmanager
def announcing(stream: TextIO) -> Iterator[None]:
    """Print each restart on ``stream`` as the launcher tells it (the
    :data:`~poprun_py.launch.restarts.ANNOUNCE` logger's INFO records), one plain line each;
    the logging set-up is undone afterwards."""
    from poprun_py.launch.restarts import ANNOUNCE

    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    handler.addFilter(lambda record: record.levelno == logging.INFO)  # warnings: elsewhere
    handler.setFormatter(logging.Formatter("poprun-py: %(message)s"))
    level = ANNOUNCE.level
    ANNOUNCE.setLevel(logging.INFO)
    ANNOUNCE.addHandler(handler)
    try:
        yield
    finally:
        ANNOUNCE.removeHandler(handler)
        ANNOUNCE.setLevel(level)


def attempt_lines(result: LaunchResult) -> list[str]:
    """One line per attempt of a restarted job, with its root cause (none: not restarted)."""
    if not result.attempts and not result.restart_failed:
        return []
    lines = [f"attempt {k}: {_cause(r)}; restarted" for k, r in enumerate(result.attempts)]
    last = len(result.attempts)
    swaps = ", ".join(f"{spare} in place of {lost}" for lost, spare in result.replaced)
    lines.append(f"attempt {last}: {_cause(result)}" + (f" ({swaps})" if swaps else ""))
    if result.restart_failed:
        lines.append(result.restart_failed)
    return lines


Detach = Annotated[
    bool,
    typer.Option(
        "--detach",
        rich_help_panel=H_LONG,
        help="Hand the job to a supervisor on its first host (this machine for --backend "
        "local) and return once every instance runs, printing the job id; the job keeps every "
        "rule without this client. See `jobs`, `logs`, `stop`, `wait`.",
    ),
]
