"""Host expressions: ``h1,h2``, node ranges ``node[01-16,20]``, ``@hostfile``, and Slurm nodelists.

Parsing is pure: :func:`parse_hosts` takes the expression and, for ``@file`` forms, the file's text
through a ``read`` callable, so tests and the planner never touch the disk by accident. Ranges are
expanded with ClusterShell's NodeSet (imported only when a bracket appears).

Example:

    >>> [h.name for h in parse_hosts("node[01-03],gpu7")]
    ['node01', 'node02', 'node03', 'gpu7']
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


def expand_range(part: str) -> list[str]:
    """Expand one node-range term such as ``node[01-16,20]`` with ClusterShell's NodeSet."""
    if "[" not in part:
        return [part]
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    from ClusterShell.RangeSet import RangeSetParseError

    try:
        return [str(n) for n in NodeSet(part)]
    except (NodeSetParseError, RangeSetParseError) as exc:
        raise HostExprError(f"bad node range {part!r}: {exc}") from None


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
