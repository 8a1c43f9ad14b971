"""One look for every table and message poprun-py prints: the width to fit, colour only on a
terminal (never with ``NO_COLOR``, never when piped), and the one table style -- plain columns
two spaces apart under a header, bold on a terminal -- that ``plan``, the failure summary,
``check``, ``jobs``, ``status`` and the preflight faults share. Standard library only, so
importing it costs nothing at start-up.

Example:

    >>> print("\\n".join(table_lines(("host", "state"), [["h1", "ok"], ["node02", "lost"]])))
    host    state
    h1      ok
    node02  lost
    >>> fit_table(("host", "detail"), [["h1", "Traceback: boom"]], width=14)
    ['host  detail', 'h1    Traceba…']
    >>> folded_table(("host", "problem"), [["h1", "no address in 10.0.0.0/8"]], 20)[1:]
    ['h1    no address in', '      10.0.0.0/8']
    >>> more_line(1984, "hosts")
    '… 1,984 more hosts'
    >>> paint("ROOT CAUSE", "error", colour=True)
    '\\x1b[1;31mROOT CAUSE\\x1b[0m'
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TextIO

PIPED_WIDTH = 80
"""The width of output that does not go to a terminal (a pipe, a file, a CI log)."""

STYLES = {"error": "1;31", "bold": "1", "warning": "33"}
"""Style name → SGR parameters."""


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def output_width(stream: TextIO | None) -> int:
    """The width ``stream`` shows: the terminal's (``COLUMNS`` first), else 80 when piped.

    >>> import io
    >>> output_width(io.StringIO())
    80
    """
    if not _isatty(stream):
        return PIPED_WIDTH
    return max(shutil.get_terminal_size((PIPED_WIDTH, 24)).columns, 20)


def use_colour(stream: TextIO | None, environ: Mapping[str, str] | None = None) -> bool:
    """True when ``stream`` is a terminal that takes colour: not piped, ``NO_COLOR`` unset or
    empty (https://no-color.org), and ``TERM`` not ``dumb``."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    return _isatty(stream)


def paint(text: str, style: str, colour: bool) -> str:
    """``text`` in ``style`` (a key of :data:`STYLES`) when ``colour``, else unchanged."""
    return f"\x1b[{STYLES[style]}m{text}\x1b[0m" if colour and text else text


def table_lines(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The table style: aligned columns two spaces apart, header first, no trailing spaces."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(columns), *rows]
    ]


def fit_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    keep: int = 1,
) -> list[str]:
    """:func:`table_lines` at most ``width`` wide: the widest column past the first ``keep``
    (those stay whole: an id must be copied as it is) gives way first, its cells cut to end
    in "…", never below its header's width. Lines are wider only when the kept columns and
    the headers alone are."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    floor = [
        len(c) if k >= keep else w for k, (c, w) in enumerate(zip(columns, widths, strict=True))
    ]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    while over > 0:
        k = max(range(len(widths)), key=lambda j: (widths[j] - floor[j], j))
        give = min(over, widths[k] - floor[k])
        if give <= 0:
            break
        widths[k] -= give
        over -= give
    cut = [[clip(cell, w) for cell, w in zip(row, widths, strict=True)] for row in rows]
    return table_lines(columns, cut)


def folded_table(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """:func:`table_lines` at most ``width`` wide by folding the last column's text onto
    lines of its own (at spaces), the other columns whole: for text that must be read to
    its end, such as what went wrong on a host.

    >>> folded_table(("host", "problem"), [["h1", "program: x: not found on PATH"]], 24)
    ['host  problem', 'h1    program: x: not', '      found on PATH']
    """
    import textwrap

    head = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns[:-1])]
    indent = sum(head) + 2 * len(head)
    room = max(width - indent, len(columns[-1]), 1)
    lines = table_lines(columns, [[*r[:-1], ""] for r in rows])
    out = [lines[0]]
    for line, row in zip(lines[1:], rows, strict=True):
        parts = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
        out.append((line.ljust(indent) + parts[0]).rstrip())
        out += [" " * indent + part for part in parts[1:]]
    return out


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in "…" when cut.

    >>> clip("0,1,2,3,4,5", 6), clip("0-7", 6)
    ('0,1,2…', '0-7')
    """
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…" if width > 0 else ""


def more_line(count: int, noun: str, hint: str = "") -> str:
    """The line that stands for what was left out: ``… 1,984 more hosts``."""
    return f"… {count:,} more {noun}" + (f" ({hint})" if hint else "")


def bold_header(lines: Sequence[str], colour: bool) -> list[str]:
    """A table's lines with its header in bold when ``colour``."""
    return [paint(lines[0], "bold", colour), *lines[1:]] if lines else []


def write_lines(stream: TextIO, lines: Sequence[str]) -> None:
    """Write ``lines`` to ``stream``, one a line, and flush."""
    if lines:
        stream.write("\n".join(lines) + "\n")
    stream.flush()
