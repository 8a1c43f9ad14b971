"""Running a short command for its output, with a clean one-line error, and reading log tails.

Shared by the test-host and test-Slurm helpers and by the Slurm client wrapper: each runs a
command with stdin closed and text output captured, and on failure reports the last line the
command printed (or its exit status), never a traceback or a whole log.

Example::

    >>> command_output(["echo", "hi"], RuntimeError, timeout=5)
    'hi\\n'
    >>> command_output(["sh", "-c", "echo oops >&2; exit 3"], RuntimeError, timeout=5)
    Traceback (most recent call last):
    ...
    RuntimeError: sh -c 'echo oops >&2; exit 3' failed: oops
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_captured(
    argv: Sequence[str], *, timeout: float | None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to the end with stdin closed and its text output captured.

    ``env`` is the whole environment (None: this process's). Raises OSError or
    subprocess.TimeoutExpired; a non-zero exit is not an error here.
    """
    return subprocess.run(
        list(argv),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=None if env is None else dict(env),
    )


def failure_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line of a finished command's stderr (else stdout), or ``exit N``."""
    lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
    return lines[-1]


def command_output(
    argv: Sequence[str],
    error: type[Exception],
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``argv``; return its stdout, or raise ``error`` naming the command and its last line."""
    try:
        proc = run_captured(argv, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise error(f"{shlex.join(argv)}: {exc}") from exc
    if proc.returncode != 0:
        raise error(f"{shlex.join(argv)} failed: {failure_line(proc)}")
    return proc.stdout


def last_line(path: Path) -> str:
    """The last line of a log file, or ``(no log)``/``(empty log)``."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"
