"""The process-tree edge of supervision: start children cheaply, find what they left, reap.

- :class:`Spawner` starts a process from an argv list in a process group of its own (and a
  session of its own when there is a terminal to keep it from), stdin closed, stdout/stderr
  piped: with ``posix_spawn`` (no Python runs between fork and exec, and the
  environment is encoded in C), or ``Popen`` when a working directory is needed; bound to
  CPUs and NUMA nodes when asked, without numactl (:mod:`poprun_py.hostside.binding`: the
  spawning thread binds itself around the spawn, and the child inherits the binding).
- :func:`subreaper` makes this process a child subreaper, so orphans of its descendants are
  re-parented to it rather than to init; :func:`no_children` then proves, with one syscall,
  that nothing is left.
- :func:`descendants` walks ``/proc`` for everything that belongs to a set of started processes
  -- those still running, and those reaped, whose process groups and sessions count only while
  they are still the ones they led (:func:`~poprun_py.hostside.identity.ours`: a pid, once
  reaped, may be anyone's); :func:`alive`, :func:`reap_adopted` finish the job.

Example:

    >>> import os
    >>> spawner = Spawner({"RUN": "1"})
    >>> proc = spawner.start(("sh", "-c", "echo $RUN"), {}, None)
    >>> proc.out.read(), proc.wait()
    (b'1\\n', 0)
    >>> proc.close(); spawner.close()
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from poprun_py.hostside.binding import bound
from poprun_py.hostside.identity import (
    boot_ticks,
    has_token,
    owned,
    proc_table,
    read_stat,
    signal_same,
)

__all__ = [
    "Launched",
    "ProcStat",
    "Spawner",
    "adopted_zombies",
    "alive",
    "boot_ticks",
    "descendants",
    "no_children",
    "open_pidfd",
    "proc_table",
    "read_stat",
    "reap_adopted",
    "send_signal",
    "signal_found",
    "starttime",
    "subreaper",
    "with_descendants",
]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


class Launched:
    """A started process: its pid, its stdout/stderr pipes, and how to collect its exit."""

    def __init__(
        self, pid: int, out: IO[bytes], err: IO[bytes], popen: subprocess.Popen[bytes] | None = None
    ):
        self.pid, self.out, self.err, self.popen = pid, out, err, popen
        self.code: int | None = None

    @property
    def reaped(self) -> bool:
        """True once its exit was collected: its pid may then be another process's."""
        if self.popen is not None:
            return self.popen.returncode is not None
        return self.code is not None

    def poll(self) -> int | None:
        """Its exit code (negative: a signal) once it has ended, else None."""
        if self.popen is not None:
            return self.popen.poll()
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self) -> int:
        """Wait for its end; its exit code."""
        if self.popen is not None:
            return self.popen.wait()
        if self.code is None:
            self.code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.code

    def close(self) -> None:
        """Close both pipes."""
        self.out.close()
        self.err.close()


class Spawner:
    """Starts children: ``posix_spawn`` (cheapest: no Python between fork and exec), or
    ``subprocess.Popen`` when a child needs a working directory (posix_spawn cannot chdir).

    Every child leads a process group of its own. It also leads a session of its own when this
    process has a controlling terminal (``new_session=None``, the default, decides so): then
    a child cannot read the terminal (a password prompt fails instead of stopping the child on
    SIGTTIN). Without a terminal -- scripts, CI, schedulers -- a session adds nothing but cost:
    with scheduler autogroups, each ``setsid`` creates a scheduling group (about 1 ms per child
    on a loaded 2-core machine, as much as the rest of the start).
    """

    def __init__(self, extra_env: Mapping[str, str], new_session: bool | None = None):
        self.new_session = has_controlling_tty() if new_session is None else new_session
        self.extra = dict(extra_env)
        self.env = {**os.environ, **self.extra}
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        # posix_spawn keeps inheritable descriptors open; close them as close_fds would.
        self.closes = [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds()]
        self.exe: dict[tuple[str, str | None], str | None] = {}
        self.fast = hasattr(os, "posix_spawn")

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        cpus: Sequence[int] = (),
        mems: Sequence[int] = (),
    ) -> Launched:
        """Start ``argv`` with ``os.environ + env`` (+ the extra env), stdin closed,
        stdout/stderr piped, in a process group (and maybe session) of its own, bound to
        ``cpus`` and its memory to NUMA nodes ``mems`` when given. OSError when it cannot be
        started (or bound)."""
        if cpus or mems:
            with bound(cpus, mems):  # this thread's binding, inherited by the child
                return self._start(argv, env, cwd)
        return self._start(argv, env, cwd)

    def _start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> Launched:
        env = {**self.env, **env, **self.extra}
        exe = self._resolve(argv[0], env.get("PATH"))
        if cwd is not None or not self.fast or exe is None:
            return self._popen(argv, env, cwd)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        actions = [
            (os.POSIX_SPAWN_DUP2, self.devnull, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
            *self.closes,
        ]
        own: dict[str, Any] = {"setsid": True} if self.new_session else {"setpgroup": 0}
        try:
            pid = os.posix_spawn(
                exe, list(argv), env, file_actions=actions, setsigdef=_SIGDEF, **own
            )
        except OSError:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return Launched(pid, open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0))

    def _resolve(self, name: str, path: str | None) -> str | None:
        if "/" in name:
            return name
        key = (name, path)
        if key not in self.exe:
            self.exe[key] = shutil.which(name, path=path)
        return self.exe[key]

    def _popen(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> Launched:
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=self.new_session,
            process_group=None if self.new_session else 0,
        )
        assert popen.stdout is not None and popen.stderr is not None
        return Launched(popen.pid, popen.stdout, popen.stderr, popen)

    def close(self) -> None:
        """Release /dev/null."""
        os.close(self.devnull)


def has_controlling_tty() -> bool:
    """True when this process has a controlling terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


# Python ignores SIGPIPE (and SIGXFSZ); children get the defaults back, as Popen gives them.
_SIGDEF = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n))


def _inheritable_fds() -> list[int]:
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    fds = []
    for name in names:
        fd = int(name)
        with contextlib.suppress(OSError):
            if fd > 2 and os.get_inheritable(fd):
                fds.append(fd)
    return fds


def signal_found(found: Mapping[int, ProcStat], sig: int) -> None:
    """``sig`` to each process found, only if its pid still names it (the same start time:
    :func:`~poprun_py.hostside.identity.signal_same`)."""
    for pid, stat in found.items():
        signal_same((pid, stat[3]), sig)


def send_signal(pid: int, sig: int, *, group: bool) -> None:
    """Send ``sig`` to ``pid`` (or its process group); gone or foreign processes are skipped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None where pidfds do not exist."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


ProcStat = tuple[int, int, int, int, str]
"""(ppid, pgid, sid, starttime, state) from /proc/<pid>/stat (see :mod:`.identity`)."""


def starttime(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (0 if unknown)."""
    stat = read_stat(pid)
    return stat[3] if stat else 0


def descendants(
    roots: set[int],
    token: str,
    since: int,
    reaped: Mapping[int, int] | None = None,
    table: Mapping[int, ProcStat] | None = None,
) -> dict[int, ProcStat]:
    """Processes started by ``roots`` (or since ``since``, in clock ticks) that belong to them.

    ``roots`` are running (not yet reaped) children; ``reaped`` maps the pid of each root
    already reaped to the clock tick of its reaping. A process belongs when it is in a root's
    session or process group -- a reaped root's only while that group is still the one it led
    (:func:`~poprun_py.hostside.identity.ours`); a reaped pid itself is never a root again --,
    descends from a root, was adopted by this process (subreaper) or has ``token``
    (``NAME=value``) in its environment; and then every descendant of those. Zombies are
    included (they may need reaping). ``table`` is the process table to look in (default: now).
    """
    table = proc_table() if table is None else table
    groups, sessions = owned(roots, reaped or {}, table)
    me = os.getpid()
    mark = token.encode()
    marked = {
        pid
        for pid, (ppid, pgid, sid, start, _) in table.items()
        if start >= since
        and pid != me
        and (
            pid in roots or pgid in groups or sid in sessions or ppid == me or has_token(pid, mark)
        )
    }
    found = _close_under_children(marked, table) - roots - _ancestors(me, table)
    return {pid: table[pid] for pid in found}


def with_descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process descending from one of them, zombies included."""
    return _close_under_children(roots, proc_table())


def _close_under_children(marked: set[int], table: Mapping[int, ProcStat]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, stat in table.items():
        children.setdefault(stat[0], []).append(pid)
    todo, seen = list(marked), set(marked)
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in seen:
                seen.add(kid)
                todo.append(kid)
    return seen


def _ancestors(pid: int, table: Mapping[int, ProcStat]) -> set[int]:
    found = {pid}
    while pid in table and table[pid][0] not in found and table[pid][0] > 0:
        pid = table[pid][0]
        found.add(pid)
    return found


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
