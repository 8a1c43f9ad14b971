"""Processes known by identity -- a pid and its start time -- so that no signal reaches a
process that merely got a pid (or a process group id) poprun-py once knew.

A pid is recycled once its process is reaped and no process group or session bears its number
any more; in a run of days on a busy host, a new process can then have it. So a process that is
not our unreaped child is signalled only after checking that the pid still names the process
we saw (:func:`signal_same`: through a pidfd where the kernel and Python have one -- nothing can
come between the check and the signal -- else the start time checked just before ``kill``).
A process group whose leader was reaped at ``tick`` is ours only while some member started by
then (:func:`ours`): a group that took its number afterwards began after the reap, and so did
every process in it.

Stdlib only, Python 3.7: the host agent ships it inlined (:mod:`poprun_py.hostside.bundle`);
the local supervisor (:mod:`poprun_py.process.supervise`) uses the same functions.

Example:

    >>> import os
    >>> me = identify(os.getpid())
    >>> same(me), same((me[0], me[1] + 1)), signal_same((me[0], me[1] + 1), 0)
    (True, False, False)
"""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False  # not typing's: the agent does without importing typing
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    Stat = tuple[int, int, int, int, str]  # (ppid, pgid, sid, starttime, state)
    Identity = tuple[int, int]  # (pid, starttime)


def read_stat(pid: int) -> Stat | None:
    """(ppid, pgid, sid, starttime, state) of ``pid`` from ``/proc/PID/stat`` (starttime is
    field 22: clock ticks since boot), or None once it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except (OSError, ValueError):  # ValueError: a pid (from a record) with a NUL in it
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0].decode()
    except (IndexError, ValueError):
        return None


def proc_table() -> dict[int, Stat]:
    """Every process of the machine (of this PID namespace), zombies included."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                table[int(name)] = stat
    return table


def boot_ticks() -> int | None:
    """Now, in the clock ticks since boot that /proc's starttime counts (None if unknown): a
    process started after this call has ``starttime >= boot_ticks()``."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return int(time.clock_gettime(clock) * os.sysconf("SC_CLK_TCK"))


def identify(pid: int) -> Identity | None:
    """``(pid, starttime)`` of the process ``pid`` names now (a zombie too), or None."""
    stat = read_stat(pid)
    return None if stat is None else (pid, stat[3])


def same(ident: Identity) -> bool:
    """True while ``ident``'s pid still names the process identified (not yet reaped)."""
    stat = read_stat(ident[0])
    return stat is not None and stat[3] == ident[1]


def signal_same(ident: Identity, sig: int) -> bool:
    """Send ``sig`` to the process ``ident``, only if its pid still names it; True if sent."""
    fd = open_pidfd(ident[0]) if hasattr(signal, "pidfd_send_signal") else None
    try:  # with a pidfd, the process checked is the one signalled, whatever happens meanwhile
        if not same(ident):
            return False
        if fd is None:
            os.kill(ident[0], sig)  # checked just before: no pidfds here (Python < 3.9, old kernel)
        else:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
    return True


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None (gone, or no pidfds here)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def ours(group: int, reaped_at: int, table: Mapping[int, Stat], session: bool = False) -> bool:
    """True when process group (``session``: session) ``group``, whose leader we reaped at clock
    tick ``reaped_at``, is still the one it led: a member started by then (a group that reused
    the number only began after the reap, and so did each of its members)."""
    slot = 2 if session else 1
    return any(s[slot] == group and s[3] <= reaped_at for s in table.values())


def leads(leader: int, reaped_at: int, table: Mapping[int, Stat]) -> bool:
    """True while ``leader``, reaped at tick ``reaped_at``, still leads its process group or
    session (:func:`ours`); once it does not, it never will again."""
    return ours(leader, reaped_at, table) or ours(leader, reaped_at, table, session=True)


def owned(
    live: Iterable[int], reaped: Mapping[int, int], table: Mapping[int, Stat]
) -> tuple[set[int], set[int]]:
    """(process groups, sessions) that are ours: those of the ``live`` roots (unreaped
    children: their pids are theirs), and those still led by a ``reaped`` one (pid -> the tick
    of its reaping; see :func:`ours`)."""
    groups, sessions = set(live), set(live)
    for pid, at in reaped.items():
        if ours(pid, at, table):
            groups.add(pid)
        if ours(pid, at, table, session=True):
            sessions.add(pid)
    return groups, sessions


def belonging(
    live: Iterable[int],
    reaped: Mapping[int, int],
    token: bytes,
    *,
    table: Mapping[int, Stat] | None = None,
    since: int = 0,
    adopted: bool = False,
) -> dict[int, Stat]:
    """The one rule for what a run's children left: every process started at tick ``since`` or
    later (not this one, nor its ancestors) in a process group or session of ours
    (:func:`owned`), or with ``token`` in its environment, or (``adopted``: a subreaper's
    orphans) a child of this process; and every descendant of those. Zombies are included
    (they may need reaping). ``table`` is the process table to look in (default: now)."""
    table = proc_table() if table is None else table
    groups, sessions = owned(live, reaped, table)
    me = os.getpid()
    marked = [
        pid
        for pid, (ppid, pgid, sid, start, _) in table.items()
        if start >= since
        and pid != me
        and (pgid in groups or sid in sessions or (adopted and ppid == me) or has_token(pid, token))
    ]
    found = set(subtree(marked, table)) - ancestors(me, table)
    return {pid: table[pid] for pid in found}


def subtree(roots: Iterable[int], table: Mapping[int, Stat]) -> list[int]:
    """``roots`` and their descendants in ``table``, each once: roots first, then breadth
    first, each process's children in pid order."""
    children: dict[int, list[int]] = {}
    for pid, stat in sorted(table.items()):
        children.setdefault(stat[0], []).append(pid)
    order = list(dict.fromkeys(roots))
    seen = set(order)
    for pid in order:  # grows as it goes
        for kid in children.get(pid, ()):
            if kid not in seen:
                seen.add(kid)
                order.append(kid)
    return order


def ancestors(pid: int, table: Mapping[int, Stat]) -> set[int]:
    """``pid`` and its ancestors in ``table``."""
    found = {pid}
    while pid in table and table[pid][0] not in found and table[pid][0] > 0:
        pid = table[pid][0]
        found.add(pid)
    return found


def signal_left(leader: int, reaped_at: int, sig: int) -> None:
    """``sig`` to what is left in the process group of ``leader`` (reaped at tick
    ``reaped_at``), if that group is still the one it led."""
    table = proc_table()
    if ours(leader, reaped_at, table):
        for pid, stat in table.items():
            if stat[1] == leader:
                signal_same((pid, stat[3]), sig)


def has_token(pid: int, token: bytes) -> bool:
    """True when ``token`` (``NAME=value``) is in ``pid``'s environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return token in handle.read().split(b"\0")
    except OSError:
        return False
