"""A hang's verdict: every rank's stacks (``py-spy dump``'s or faulthandler's text) grouped by
where the rank is, and one line that names the odd ones out.

Each rank's output after the dump request is read for stacks in either format, its main thread
is picked (py-spy's ``"MainThread"``, else the thread whose outermost frame is ``<module>``,
else the first), and its frames are normalised to ``function (file:line)`` with the file's
base name, so thread ids, addresses and install paths do not split a group. Ranks in the same
place form a group; the verdict names the largest group first and then the others, smallest
first, each with its hosts.

Example:

    >>> waiting = ['Thread 7 (idle): "MainThread"', "    all_reduce (train.py:42)",
    ...            "    <module> (train.py:60)"]
    >>> odd = ["Thread 0x00007f01 (most recent call first):",
    ...        '  File "/w/data.py", line 88 in load_batch',
    ...        '  File "/w/train.py", line 60 in <module>']
    >>> hosts = {0: "h1", 1: "h1", 2: "h2", 3: "h2"}
    >>> hang = verdict({0: waiting, 1: waiting, 2: odd, 3: []}, hosts)
    >>> print(*hang.text.split("; "), sep=";\\n")
    2 of 4 ranks wait in all_reduce (train.py:42);
    rank 2 on h2 is in load_batch (data.py:88);
    no stacks from rank 3 (h2)
    >>> [g.ranks for g in hang.groups], hang.groups[0].frames
    ([(2,), (0, 1)], ('load_batch (data.py:88)', '<module> (train.py:60)'))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_PYSPY_THREAD = re.compile(r'^Thread (\d+) \((\w+)\)(?:: "(.*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((.+):(\d+)\)\s*$")
_FAULT_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):")
_FAULT_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+?)\s*$')
SHOWN_GROUPS = 3
"""Odd groups named in the verdict line; the rest are counted."""


@dataclass(frozen=True)
class Thread:
    """One thread's stack, innermost frame first, each ``function (file:line)``."""

    name: str
    frames: tuple[str, ...]


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads are in the same place."""

    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    frames: tuple[str, ...]

    @property
    def where(self) -> str:
        """The innermost frame, or ``?`` for a stack without frames."""
        return self.frames[0] if self.frames else "?"


@dataclass(frozen=True)
class Hang:
    """The verdict line, the groups (smallest first) and the ranks that gave no stacks."""

    text: str
    groups: tuple[Group, ...]
    no_stacks: tuple[int, ...]
    ranks: int

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON (``hang.json`` in the job's output directory)."""
        return {
            "verdict": self.text,
            "ranks": self.ranks,
            "groups": [
                {
                    "ranks": list(g.ranks),
                    "hosts": list(g.hosts),
                    "where": g.where,
                    "frames": list(g.frames),
                }
                for g in self.groups
            ],
            "no_stacks": list(self.no_stacks),
        }


def _frame(function: str, path: str, line: str) -> str:
    return f"{function} ({path.rsplit('/', 1)[-1]}:{line})"


def threads(lines: Iterable[str]) -> list[Thread]:
    """Every thread stack in ``lines``, py-spy's and faulthandler's; other lines are skipped."""
    found: list[Thread] = []
    name: str | None = None
    frames: list[str] = []
    for line in lines:
        head = _PYSPY_THREAD.match(line) or _FAULT_THREAD.match(line)
        frame = _PYSPY_FRAME.match(line) or _FAULT_FRAME.match(line)
        if head is not None:
            if name is not None:
                found.append(Thread(name, tuple(frames)))
            name, frames = _thread_name(head), []
        elif frame is not None and name is not None:
            frames.append(_frame_of(frame))
        elif name is not None and line.strip():
            found.append(Thread(name, tuple(frames)))
            name, frames = None, []
    if name is not None:
        found.append(Thread(name, tuple(frames)))
    return found


def _thread_name(head: re.Match[str]) -> str:
    if head.re is _PYSPY_THREAD:
        return head.group(3) or head.group(1)
    return "current" if head.group(1) == "Current thread" else "thread"


def _frame_of(frame: re.Match[str]) -> str:
    if frame.re is _PYSPY_FRAME:
        return _frame(frame.group(1), frame.group(2), frame.group(3))
    return _frame(frame.group(3), frame.group(1), frame.group(2))


def main_thread(found: Sequence[Thread]) -> Thread | None:
    """py-spy's MainThread, else the thread whose outermost frame is ``<module>``, else the
    first one (faulthandler names none: its "current" thread is whichever got the signal)."""
    for thread in found:
        if thread.name == "MainThread":
            return thread
    for thread in found:
        if thread.frames and thread.frames[-1].startswith("<module> "):
            return thread
    return found[0] if found else None


def verdict(dumps: Mapping[int, Sequence[str]], hosts: Mapping[int, str]) -> Hang:
    """Group the ranks of ``dumps`` (rank -> its output lines since the dump) by their main
    thread's stack; the verdict line names the largest group, then the others."""
    places: dict[tuple[str, ...], list[int]] = {}
    no_stacks: list[int] = []
    for rank in sorted(dumps):
        main = main_thread(threads(dumps[rank]))
        if main is None:
            no_stacks.append(rank)
        else:
            places.setdefault(main.frames, []).append(rank)
    groups = sorted(
        (Group(tuple(r), _hosts_of(r, hosts), frames) for frames, r in places.items()),
        key=lambda g: (len(g.ranks), g.ranks),
    )
    text = _text(groups, tuple(no_stacks), hosts, len(dumps))
    return Hang(text, tuple(groups), tuple(no_stacks), len(dumps))


def _hosts_of(ranks: Iterable[int], hosts: Mapping[int, str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(hosts.get(r, "?") for r in ranks))


def _text(groups: Sequence[Group], none: tuple[int, ...], hosts: Mapping[int, str], n: int) -> str:
    if not groups:
        return f"no stacks from {_ranks(none)} ({', '.join(_hosts_of(none, hosts))})"
    *odd, most = groups
    parts = [
        f"all {n} ranks are in {most.where}"
        if len(most.ranks) == n
        else f"{len(most.ranks)} of {n} ranks wait in {most.where}"
    ]
    parts += [
        f"{_ranks(g.ranks)} on {', '.join(g.hosts)} {_is(g)} in {g.where}"
        for g in odd[:SHOWN_GROUPS]
    ]
    if len(odd) > SHOWN_GROUPS:
        parts.append(f"{len(odd) - SHOWN_GROUPS} more groups")
    if none:
        parts.append(f"no stacks from {_ranks(none)} ({', '.join(_hosts_of(none, hosts))})")
    return "; ".join(parts)


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (
        f" (+{len(ranks) - 8})" if len(ranks) > 8 else ""
    )
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _is(group: Group) -> str:
    return "is" if len(group.ranks) == 1 else "are"


def describe(hang: Hang) -> list[str]:
    """The verdict, then each group (smallest first): its ranks, hosts and frames."""
    out = [f"hang verdict: {hang.text}"]
    for group in hang.groups:
        out.append(f"  {_ranks(group.ranks)} on {', '.join(group.hosts)}:")
        out += [f"    {frame}" for frame in group.frames]
    return out
