"""The long-run options of ``launch`` (restarts, spares, clocks) and how a restarted job's
attempts are told on stderr.

Example:

    >>> from poprun_py.backends.result import InstanceResult, JobCause, LaunchResult
    >>> first = LaunchResult((InstanceResult(1, "h2", exit_code=3),))
    >>> last = LaunchResult((InstanceResult(1, "h2", exit_code=0),), attempts=(first,))
    >>> attempt_lines(last)
    ['attempt 0: instance 1 on h2 exited with code 3; restarted', 'attempt 1: ok']
    >>> hung = LaunchResult((), cause=JobCause("instance 0 on h1 hung (no progress for 5 s)", 124))
    >>> describe(hung)
    'instance 0 on h1 hung (no progress for 5 s); every instance was stopped'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from poprun_py.errors import OWN_CODES

if TYPE_CHECKING:
    from poprun_py.backends.result import LaunchResult

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
    if result.cause is not None:
        return f"{result.cause.reason}; every instance was stopped"
    root = result.root_cause
    if root is None:
        return "the launch failed"
    if root.state == "lost":
        what = f"lost contact with host {root.host}"
    elif root.signal is not None:
        what = f"was killed by signal {root.signal}"
    else:
        what = f"exited with code {root.exit_code}"
    detail = f" ({root.detail})" if root.detail else ""
    own = ""
    if root.state != "lost" and root.code in OWN_CODES:
        own = f" (exit code {root.code} is the instance's own, not poprun-py's)"
    return (
        f"instance {root.index} on {root.host} {what}{detail}{own}; "
        "every other instance was stopped"
    )


def _cause(result: LaunchResult) -> str:
    if result.interrupted:
        return "interrupted"
    if result.ok:
        return "ok"
    return describe(result).split("; every")[0]


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
