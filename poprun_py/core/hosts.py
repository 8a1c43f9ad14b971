"""Host expressions: ``h1,h2``, node ranges ``node[01-16,20]``, ``@hostfile``, and Slurm nodelists.

Parsing is pure: :func:`parse_hosts` takes the expression and, for ``@file`` forms, the file's text
through a ``read`` callable, so tests and the planner never touch the disk by accident. Ranges
expand in the order written (ClusterShell's syntax, without its sorting): ``node[07,03]`` is
node07 then node03, so the first host -- MASTER_ADDR's -- is the one the user put first; a host
a range names twice is refused as ``node1,node1`` is.

Example:

    >>> [h.name for h in parse_hosts("node[01-03],gpu7")]
    ['node01', 'node02', 'node03', 'gpu7']
    >>> expand_range("rack[2,1]-n[9-10]")
    ['rack2-n9', 'rack2-n10', 'rack1-n9', 'rack1-n10']
    >>> parse_hostfile_text("a slots=4  # first\\n\\nb slots=4\\n")[1]
    HostEntry(name='b', slots=4)
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from poprun_py.errors import HostExprError

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class HostEntry:
    """One host from an expression, with the slot count a hostfile gave it (if any)."""

    name: str
    slots: int | None = None


def validate_host_name(name: str, context: str = "host") -> str:
    """Return ``name`` if it is a valid host name or IP address; raise HostExprError otherwise."""
    if _NAME.match(name):
        return name
    try:
        ipaddress.ip_address(name)
    except ValueError:
        raise HostExprError(
            f"bad {context} name {name!r}: use letters, digits, '.', '-' and '_' only"
        ) from None
    return name


def split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside ``[...]`` brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostExprError(f"bad host expression {expr!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise HostExprError(f"bad host expression {expr!r}: unbalanced '['")
    parts.append("".join(current))
    return [p.strip() for p in parts]


_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_SPAN = re.compile(r"(\d+)(?:-(\d+)(?:/(\d+))?)?")


def expand_range(part: str) -> list[str]:
    """Expand one node-range term such as ``node[01-16,20]`` in the order written: the
    leftmost bracket varies slowest, a span ``a-b`` counts up (``/step`` allowed), padded to
    the width of ``a`` when ``a`` has a leading zero. HostExprError (one line) otherwise."""
    if "[" not in part and "]" not in part:
        return [part]
    pieces = _BRACKETS.split(part)  # text, ranges, text, ranges, ..., text
    if any("[" in text or "]" in text for text in pieces[::2]):
        raise HostExprError(f"bad node range {part!r}: brackets must pair up, unnested")
    names = [pieces[0]]
    for ranges, text in zip(pieces[1::2], pieces[2::2], strict=True):
        values = _range_values(part, ranges)
        names = [f"{name}{value}{text}" for name in names for value in values]
    return names


def _range_values(part: str, ranges: str) -> list[str]:
    """The values of one bracket's comma-separated spans, in the order written."""
    values: list[str] = []
    for span in ranges.split(","):
        match = _SPAN.fullmatch(span.strip())
        if match is None:
            raise HostExprError(
                f"bad node range {part!r}: {span.strip()!r} is not N, N-M or N-M/STEP"
            )
        first, last, step = match.group(1), match.group(2), match.group(3)
        start, stop = int(first), int(last if last is not None else first)
        if stop < start:
            raise HostExprError(
                f"bad node range {part!r}: {first}-{last} counts down; write [{last}-{first}]"
            )
        if step is not None and int(step) < 1:
            raise HostExprError(f"bad node range {part!r}: step {step} must be at least 1")
        width = len(first) if first.startswith("0") and len(first) > 1 else 1
        values += [str(n).zfill(width) for n in range(start, stop + 1, int(step or 1))]
    return values


def expand_names(expr: str, context: str = "host") -> list[str]:
    """Expand a comma-separated list of names and ranges, keeping the order given."""
    if not expr.strip():
        raise HostExprError(f"empty {context} list")
    names: list[str] = []
    for part in split_top_level(expr):
        if not part:
            raise HostExprError(f"bad {context} list {expr!r}: empty element")
        names.extend(validate_host_name(n, context) for n in expand_range(part))
    return names


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[HostEntry]:
    """Parse the Open MPI / DeepSpeed hostfile format: ``host [slots=N]``, ``#`` comments."""
    entries: list[HostEntry] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        slots = None
        for extra in fields[1:]:
            key, _, value = extra.partition("=")
            if key not in ("slots", "max_slots", "max-slots"):
                raise HostExprError(f"{source}:{lineno}: unknown field {extra!r} in {line!r}")
            if not value.isdigit() or int(value) < 1:
                raise HostExprError(f"{source}:{lineno}: {key} must be a positive integer")
            if key == "slots":
                slots = int(value)
        for name in expand_names(fields[0], "host"):
            entries.append(HostEntry(name, slots))
    if not entries:
        raise HostExprError(f"{source}: no hosts listed")
    return entries


def read_hostfile(path: str) -> str:
    """The text of a hostfile; HostExprError (one line) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise HostExprError(f"hostfile {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HostExprError(f"cannot read hostfile {path!r}: {exc}") from None


def parse_hosts(expr: str, read: Callable[[str], str] | None = None) -> list[HostEntry]:
    """Parse ``--hosts``: a list with ranges, or ``@file`` (a hostfile, read through ``read``)."""
    expr = expr.strip()
    if expr.startswith("@"):
        path = expr[1:]
        if not path:
            raise HostExprError("'@' must be followed by a hostfile path")
        if read is None:
            raise HostExprError(f"cannot read hostfile {path!r} here")
        entries = parse_hostfile_text(read(path), source=path)
    else:
        entries = [HostEntry(n) for n in expand_names(expr)]
    check_unique([e.name for e in entries])
    return entries


def check_unique(names: list[str]) -> None:
    """Raise HostExprError naming the first host listed twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise HostExprError(f"host {name!r} is listed twice")
        seen.add(name)


def slurm_hosts(environ: Mapping[str, str]) -> list[HostEntry] | None:
    """Hosts of the current Slurm allocation (``SLURM_JOB_NODELIST``), or None outside one."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    return [HostEntry(n) for n in expand_names(nodelist, "Slurm node")]
