"""The failure summary of an attached launch: the instance table (root cause first, in the one
table style of :mod:`poprun_py.core.look`, ``ROOT CAUSE`` in red on a terminal), its ``detail``
column naming what the instance said last on stderr when the backend gave no detail of its own.

The last stderr lines come from :class:`~poprun_py.core.result.LastWords`, which output
routing fills on every backend (``RunSettings.last_words``).

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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from poprun_py.core import look

if TYPE_CHECKING:
    from poprun_py.core.result import InstanceResult, LaunchResult
    from poprun_py.errors import Fault

ROW_LIMIT = 64
"""Instances shown in the summary; the rest are counted (``--output-dir`` keeps every log)."""

COLUMNS = ("instance", "host", "state", "code", "detail")


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
