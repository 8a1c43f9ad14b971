"""The failure summary of an attached launch: the instance table (root cause first, in the one
table style of :mod:`poprun_py.core.look`, ``ROOT CAUSE`` in red on a terminal), its ``detail``
column naming what the instance said last on stderr when the backend gave no detail of its own.

:func:`stderr_tail` watches the instances' stderr lines as the default sink prints them
(``[host:index] line``) and keeps each instance's last one.

Example:

    >>> from poprun_py.core.result import InstanceResult, LaunchResult
    >>> result = LaunchResult((InstanceResult(0, "h1", exit_code=0, ended=2.0),
    ...                        InstanceResult(1, "h2", exit_code=3, ended=1.0)))
    >>> print("\\n".join(summary_lines(result, {1: "boom"})))
    instances
    instance  host  state       code  detail
    1         h2    ROOT CAUSE  3     boom
    0         h1    exited      0
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from poprun_py.core import look

if TYPE_CHECKING:
    from poprun_py.core.result import InstanceResult, LaunchResult
    from poprun_py.errors import Fault

ROW_LIMIT = 64
"""Instances shown in the summary; the rest are counted (``--output-dir`` keeps every log)."""

COLUMNS = ("instance", "host", "state", "code", "detail")

_PREFIXED = re.compile(r"\[([^\]\s]+):(\d+)\] (.*)")


def summary_lines(
    result: LaunchResult,
    tail: Mapping[int, str] | None = None,
    width: int = look.PIPED_WIDTH,
    colour: bool = False,
) -> list[str]:
    """The titled instance table of ``result``: root cause first, then the other failures,
    then the rest, in index order; at most :data:`ROW_LIMIT` rows and ``width`` columns (the
    instance and host whole). ``tail`` maps an instance to its last stderr line."""
    root = result.root_cause
    ordered = sorted(result.instances, key=lambda r: (r is not root, not r.failed, r.index))
    rows = [_row(r, r is root, tail or {}) for r in ordered[:ROW_LIMIT]]
    lines = look.fit_table(COLUMNS, rows, width, keep=2)
    if root is not None:
        at = 1 + ordered.index(root)  # always the first row
        lines[at] = lines[at].replace("ROOT CAUSE", look.paint("ROOT CAUSE", "error", colour), 1)
    lines = ["instances", *look.bold_header(lines, colour)]
    if len(ordered) > ROW_LIMIT:
        lines.append(look.more_line(len(ordered) - ROW_LIMIT, "instances"))
    return lines


def _row(r: InstanceResult, is_root: bool, tail: Mapping[int, str]) -> list[str]:
    state = "ROOT CAUSE" if is_root else str(r.state)
    code = "" if r.exit_code is None and r.signal is None else str(r.code)
    detail = r.detail or (tail.get(r.index, "") if r.failed else "")
    return [str(r.index), r.host, state, code, " ".join(detail.split())]


def print_summary(result: LaunchResult, tail: Mapping[int, str], stream: TextIO) -> None:
    """Write the summary to ``stream``, fitted to its width, in colour on a terminal."""
    width, colour = look.output_width(stream), look.use_colour(stream)
    look.write_lines(stream, summary_lines(result, tail, width, colour))


def fault_lines(
    faults: Sequence[Fault], width: int = look.PIPED_WIDTH, colour: bool = False
) -> list[str]:
    """Preflight's faults, one a row (at most :data:`ROW_LIMIT`), the problem folded to
    ``width`` rather than cut: it is what must be fixed.

    >>> from poprun_py.errors import Fault
    >>> print("\\n".join(fault_lines([Fault("h1", "program", "t.py: not found on PATH")])))
    preflight failed: 1 fault(s), nothing was started
    host  check    problem
    h1    program  t.py: not found on PATH
    """
    title = f"preflight failed: {len(faults)} fault(s), nothing was started"
    rows = [[f.host, f.check, " ".join(f.detail.split())] for f in faults[:ROW_LIMIT]]
    table = look.folded_table(("host", "check", "problem"), rows, width)
    lines = [look.paint(title, "error", colour), *look.bold_header(table, colour)]
    if len(faults) > ROW_LIMIT:
        lines.append(look.more_line(len(faults) - ROW_LIMIT, "faults"))
    return lines


def print_faults(faults: Sequence[Fault], stream: TextIO) -> None:
    """Write :func:`fault_lines` to ``stream``, fitted to its width, in colour on a terminal."""
    width, colour = look.output_width(stream), look.use_colour(stream)
    look.write_lines(stream, fault_lines(faults, width, colour))


class _Tap:
    """A text stream that passes everything to ``inner`` and keeps the last line each
    instance's default-sink prefix (``[host:index] line``) carried."""

    def __init__(self, inner: TextIO, last: dict[int, str]) -> None:
        self._inner = inner
        self._last = last
        self._partial = ""
        self._lock = threading.Lock()  # the instances' reader threads write at once

    def write(self, text: str) -> int:
        self._inner.write(text)
        with self._lock:
            *whole, self._partial = (self._partial + text).split("\n")
        for line in whole:
            match = _PREFIXED.fullmatch(line)
            if match and match.group(3).strip():
                self._last[int(match.group(2))] = match.group(3)
        return len(text)

    def __getattr__(self, name: str) -> object:  # flush, isatty, fileno, encoding, ...
        return getattr(self._inner, name)


@contextlib.contextmanager
def stderr_tail() -> Iterator[dict[int, str]]:
    """While inside, every instance's last non-empty stderr line, by instance index (as the
    default sink prints it on ``sys.stderr``); ``sys.stderr`` is restored afterwards.

    >>> with stderr_tail() as last:
    ...     _ = sys.stderr.write("[h1:3] Traceback (most recent call last):\\n[h1:3] boom\\n")
    >>> last
    {3: 'boom'}
    """
    last: dict[int, str] = {}
    inner = sys.stderr
    sys.stderr = _Tap(inner, last)
    try:
        yield last
    finally:
        if isinstance(sys.stderr, _Tap):
            sys.stderr = inner
