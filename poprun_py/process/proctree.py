"""The process-tree edge of local supervision: find what children left, reap. (Starting them
is :class:`~poprun_py.hostside.supervision.Spawner`'s, in the core the agent shares.)

- :func:`subreaper` makes this process a child subreaper, so orphans of its descendants are
  re-parented to it rather than to init; :func:`no_children` then proves, with one syscall,
  that nothing is left.
- What belongs to a set of started processes is found by the rule the agent uses too
  (:func:`~poprun_py.hostside.identity.belonging`); :func:`alive`, :func:`reap_adopted` finish
  the job.

Example:

    >>> import os
    >>> alive({os.getpid()}) == {os.getpid()} <= with_descendants({os.getpid()})
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping

from poprun_py.hostside.identity import proc_table, read_stat, signal_same, subtree

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def signal_found(found: Mapping[int, ProcStat], sig: int) -> None:
    """``sig`` to each process found, only if its pid still names it (the same start time:
    :func:`~poprun_py.hostside.identity.signal_same`)."""
    for pid, stat in found.items():
        signal_same((pid, stat[3]), sig)


ProcStat = tuple[int, int, int, int, str]
"""(ppid, pgid, sid, starttime, state) from /proc/<pid>/stat (see :mod:`.identity`)."""


def with_descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process descending from one of them, zombies included."""
    return set(subtree(roots, proc_table()))


def alive(pids: set[int]) -> set[int]:
    """The processes among ``pids`` that exist and are not zombies."""
    alive = set()
    for pid in pids:
        stat = read_stat(pid)
        if stat is not None and stat[4] not in ("Z", "X"):
            alive.add(pid)
    return alive


def adopted_zombies(pids: set[int]) -> set[int]:
    """The processes among ``pids`` that are zombie children of this process."""
    me = os.getpid()
    return {p for p in pids if (s := read_stat(p)) is not None and s[0] == me and s[4] == "Z"}


def reap_adopted(pids: set[int]) -> None:
    """Reap the processes among ``pids`` that are our zombies (orphans we adopted)."""
    for pid in adopted_zombies(pids):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Make this process a child subreaper for the duration (Linux; best effort).

    Yields True when it is one: then every descendant stays in our subtree, orphans included.
    """
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    previous = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
    active = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield active
    finally:
        if active and not previous.value:
            prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl: Callable[..., int] | None = getattr(libc, "prctl", None)
    return prctl


def no_children() -> bool:
    """True when this process has no child at all (not even a zombie)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False
