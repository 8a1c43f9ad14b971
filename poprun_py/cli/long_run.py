"""How a restarted job's attempts are told on stderr: each restart as it happens
(:func:`announcing`: ``attempt 0 failed: ROOT CAUSE; restarting (1/2) in 5 s``, then ``attempt 1
running (restart 1/2)``), and every attempt again in the summary at the end
(:func:`attempt_lines`). Its options (restarts, spares, clocks) are in
:data:`poprun_py.cli.options.OPTIONS`.

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
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from poprun_py.core.result import LaunchResult


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
    :data:`~poprun_py.launch.restarts.ANNOUNCE` logger's INFO records), one plain line each,
    and the launch's phases as they go (:func:`poprun_py.cli.status.showing`); the logging
    set-up is undone afterwards."""
    from poprun_py.cli.status import showing
    from poprun_py.launch.restarts import ANNOUNCE

    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    handler.addFilter(lambda record: record.levelno == logging.INFO)  # warnings: elsewhere
    handler.setFormatter(logging.Formatter("poprun-py: %(message)s"))
    level = ANNOUNCE.level
    ANNOUNCE.setLevel(logging.INFO)
    ANNOUNCE.addHandler(handler)
    try:
        with showing(stream):
            yield
    finally:
        ANNOUNCE.removeHandler(handler)
        ANNOUNCE.setLevel(level)


def _step(result: LaunchResult) -> str:
    """`` (last step N)`` when an instance reported steps (``dist.heartbeat(step=N)``)."""
    return f" (last step {result.last_step})" if result.last_step is not None else ""


def attempt_lines(result: LaunchResult) -> list[str]:
    """One line per attempt of a restarted job, with its root cause (none: not restarted)."""
    if not result.attempts and not result.restart_failed:
        return []
    lines = [
        f"attempt {k}: {_cause(r)}; restarted{_step(r)}" for k, r in enumerate(result.attempts)
    ]
    last = len(result.attempts)
    swaps = ", ".join(f"{spare} in place of {lost}" for lost, spare in result.replaced)
    lines.append(
        f"attempt {last}: {_cause(result)}" + (f" ({swaps})" if swaps else "") + _step(result)
    )
    if result.restart_failed:
        lines.append(result.restart_failed)
    return lines
