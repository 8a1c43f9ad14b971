"""The one supervision core of the local backend and the per-host agent: spawn, bind, read and
tag output, cap lines, stop with a grace period, find what was left behind.

- :class:`Spawner` starts a child from an argv list (never a shell) in a process group of its
  own (and a session of its own when asked), stdin closed, stdout/stderr piped, with the run's
  ``POPRUN_RUN_ID`` (:data:`RUN_ID_VAR`) over its environment: ``posix_spawn`` where it can (no
  Python runs between fork and exec), else ``Popen``; bound to CPUs and NUMA nodes when asked
  (:func:`poprun_py.hostside.binding.bound`). :class:`Launched` is the started child: its exit
  code (negative: a signal), the clock tick of its reaping, and signals that never reach it once
  it was reaped (its pid may be anyone's by then).
- :class:`Poller` gives back the data of every ready descriptor (epoll, else poll);
  :class:`Pipe` reads one child pipe into a feed; :class:`LineFeed` splits those bytes into
  lines for a sink; a "line" longer than :data:`MAX_LINE` (1 MiB, for both) without a newline
  is passed on in pieces.
- :class:`Grace` is the stop rule: SIGTERM now, SIGKILL once the grace period is over;
  :func:`left_behind` and :func:`signal_left_behind` find and stop what the children left in
  their process groups and sessions, or carrying the run's id
  (:mod:`poprun_py.hostside.identity`: no pid is signalled that may be another process's).

Standard library only, Python 3.7+: the agent ships it (:mod:`poprun_py.hostside.bundle`).

Example:

    >>> lines = []
    >>> spawner = Spawner({RUN_ID_VAR: "r1"}, new_session=True)
    >>> child = spawner.start(("sh", "-c", "echo $POPRUN_RUN_ID; printf tail"), {}, None)
    >>> pipe = Pipe(child.stdout, LineFeed(lines.extend))
    >>> while pipe.read():
    ...     pass
    >>> pipe.close(); child.wait(), lines, child.reaped_at is not None
    (0, [b'r1', b'tail'], True)
    >>> child.stderr.close(); spawner.close()
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess

from poprun_py.hostside.binding import bound  # inlined with this module: bundle
from poprun_py.hostside.identity import (  # inlined with this module: bundle
    belonging,
    boot_ticks,
    signal_left,
    signal_same,
)

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start ~6 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import IO, Any, Protocol

    class Feed(Protocol):
        """Takes the raw bytes of one pipe as they arrive, then ``close()`` at its end."""

        def feed(self, data: bytes) -> None:
            """Take the next chunk."""

        def close(self) -> None:
            """The pipe ended: pass on whatever is pending."""


RUN_ID_VAR = "POPRUN_RUN_ID"
"""Set in every child's environment; the sweep uses it to find descendants that escaped."""

MAX_LINE = 1 << 20
"""A "line" this long without a newline is passed on in pieces (locally and by the agent)."""

READ_SIZE = 65536  # bytes read from a pipe at a time


# ---------------------------------------------------------------- output


class LineFeed:
    """Splits one pipe's bytes into lines (without their newline) for ``sink``, a list at a
    time; a tail longer than ``cap`` without a newline goes on as a line of its own."""

    def __init__(self, sink: Callable[[list[bytes]], object], cap: int = MAX_LINE) -> None:
        self.sink, self.cap = sink, cap
        self.pending = b""

    def feed(self, data: bytes) -> None:
        """Pass on every complete line; keep the tail (passed on once it grows too long)."""
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        if len(self.pending) > self.cap:
            lines.append(self.pending)
            self.pending = b""
        if lines:
            self.sink(lines)

    def close(self) -> None:
        """Pass on a last line that had no newline."""
        if self.pending:
            self.sink([self.pending])
            self.pending = b""


class Pipe:
    """One open pipe of a child and the feed its bytes go to."""

    def __init__(self, file: IO[bytes], feed: Feed) -> None:
        self.file, self.feed = file, feed
        self.fd = file.fileno()

    def read(self) -> bool:
        """Feed what the pipe holds now; False at its end (then :meth:`close` it)."""
        try:
            data = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if data:
            self.feed.feed(data)
        return bool(data)

    def close(self) -> None:
        """Close the pipe and flush the feed."""
        self.file.close()
        self.feed.close()


class Poller:
    """Readiness of many descriptors, each with its data: epoll (else poll) used directly, as
    the selectors module's own bookkeeping cost ~60 us a child (three descriptors each
    registered and unregistered; 16 x ``true``: ~1 ms of a 14 ms launch)."""

    def __init__(self) -> None:
        self.epoll = hasattr(select, "epoll")
        self.poll: Any = select.epoll() if self.epoll else select.poll()
        self.data: dict[int, Any] = {}

    def register(self, fd: int, data: Any, write: bool = False) -> None:
        """Watch ``fd`` for input or its end (``write``: for room to write); :meth:`ready`
        gives ``data`` back for it."""
        if self.epoll:
            self.poll.register(fd, select.EPOLLOUT if write else select.EPOLLIN)
        else:
            self.poll.register(fd, select.POLLOUT if write else select.POLLIN)
        self.data[fd] = data

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed)."""
        self.poll.unregister(fd)
        del self.data[fd]

    def ready(self, timeout: float | None) -> list[Any]:
        """The data of every descriptor ready within ``timeout`` seconds (None: no limit)."""
        if self.epoll:
            events = self.poll.poll(-1 if timeout is None else timeout)
        else:
            events = self.poll.poll(None if timeout is None else timeout * 1000)
        return [self.data[fd] for fd, _ in events if fd in self.data]

    def close(self) -> None:
        """Release the epoll descriptor."""
        if self.epoll:
            self.poll.close()


def readable(watched: Sequence[Any], timeout: float | None) -> list[Any]:
    """The objects of ``watched`` (descriptors, or objects with ``fileno()``) readable, or at
    their end, within ``timeout`` seconds (None: no limit): ``select``'s answer without its
    limit of descriptor numbers below 1024, which a launch to a thousand hosts passes."""
    poll, by_fd = select.poll(), {}
    for obj in watched:
        fd = obj if isinstance(obj, int) else obj.fileno()
        by_fd[fd] = obj
        poll.register(fd, select.POLLIN)
    events = poll.poll(None if timeout is None else max(0.0, timeout) * 1000)
    return [by_fd[fd] for fd, _ in events if fd in by_fd]


# ---------------------------------------------------------------- starting


class Launched:
    """A started child: its pid, its stdout/stderr pipes, its exit once collected."""

    def __init__(
        self,
        pid: int,
        stdout: IO[bytes],
        stderr: IO[bytes],
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.pid, self.stdout, self.stderr, self.popen = pid, stdout, stderr, popen
        self.code: int | None = None
        self.reaped_at: int | None = None  # the clock tick (/proc's) at which it was reaped

    @property
    def reaped(self) -> bool:
        """True once its exit was collected: its pid may then be another process's."""
        return self.code is not None

    def poll(self) -> int | None:
        """Its exit code (negative: a signal) once it has ended, else None."""
        if self.code is None:
            if self.popen is not None:
                self._ended(self.popen.poll())
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                self._ended(exit_code(status) if pid else None)
        return self.code

    def wait(self) -> int:
        """Wait for its end; its exit code."""
        if self.code is None:
            if self.popen is not None:
                self._ended(self.popen.wait())
            else:
                self._ended(exit_code(os.waitpid(self.pid, 0)[1]))
        assert self.code is not None
        return self.code

    def _ended(self, code: int | None) -> None:
        if code is not None:
            self.code, self.reaped_at = code, boot_ticks() or 0

    def signal(self, sig: int, group: bool = True) -> None:
        """``sig`` to its process group (or only itself), unless it was reaped."""
        if not self.reaped:
            send_signal(self.pid, sig, group)

    def close(self) -> None:
        """Close both pipes."""
        self.stdout.close()
        self.stderr.close()


def exit_code(status: int) -> int:
    """A wait status as an exit code, negative for a signal (``os.waitstatus_to_exitcode``,
    which Python 3.7/3.8 lack)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Spawner:
    """Starts children: ``posix_spawn`` (no Python between fork and exec), or ``Popen`` for a
    working directory (posix_spawn cannot chdir) or on Python 3.7. Every child leads a process
    group, and a session when ``new_session`` (default: when there is a terminal, which the
    child then cannot read; else Popen needs Python 3.11). Without a terminal a session only
    costs: each ``setsid`` makes a scheduler autogroup, ~1 ms a child on a loaded 2-core host.
    """

    def __init__(self, extra_env: Mapping[str, str], new_session: bool | None = None) -> None:
        self.new_session = has_controlling_tty() if new_session is None else new_session
        self.extra = dict(extra_env)
        self.env = dict(os.environ, **self.extra)
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        self.fast = hasattr(os, "posix_spawn")  # Python 3.8+
        self.closes = [(os.POSIX_SPAWN_CLOSE, fd) for fd in inheritable_fds()] if self.fast else []
        self.exe: dict[tuple[str, str | None], str | None] = {}

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
        env = dict(self.env, **env)
        env.update(self.extra)
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
                exe, list(argv), env, file_actions=actions, setsigdef=SIGDEF, **own
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
        own: dict[str, Any] = {"start_new_session": True}
        if not self.new_session:
            own = {"process_group": 0}  # Python 3.11+
        popen = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **own,
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
SIGDEF = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, n))


def inheritable_fds() -> list[int]:
    """This process's inheritable descriptors above 2 (posix_spawn would keep them open in a
    child; the spawner closes them, as ``close_fds`` does)."""
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


# ---------------------------------------------------------------- stopping


def send_signal(pid: int, sig: int, group: bool = True) -> None:
    """Send ``sig`` to ``pid`` (or its process group); gone or foreign processes are skipped
    (callers make sure that the pid is still theirs: :meth:`Launched.signal`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


class Grace:
    """The stop rule: SIGTERM at :meth:`begin`, SIGKILL once ``grace`` seconds have passed
    (:meth:`due`; :meth:`kill` marks it sent)."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.kill_at: float | None = None
        self.killed = False

    def begin(self, now: float) -> bool:
        """Start the grace period; False if it had begun already."""
        if self.kill_at is not None:
            return False
        self.kill_at = now + self.grace
        return True

    def due(self, now: float) -> bool:
        """True when SIGKILL is due (the grace period is over) and was not sent yet."""
        return self.kill_at is not None and not self.killed and now >= self.kill_at

    def kill(self) -> bool:
        """Mark SIGKILL as sent; False if it had been already."""
        first, self.killed = not self.killed, True
        return first

    def waits(self, now: float) -> list[float]:
        """How long until SIGKILL is due, while it is ahead (for a poll's timeout)."""
        if self.kill_at is None or self.killed:
            return []
        return [max(0.0, self.kill_at - now)]


def left_behind(children: Iterable[Launched], token: str) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live process in a child's process group or session -- a
    reaped child's only while it still leads it -- or carrying ``token`` (``NAME=value``) in
    its environment, and of their descendants (:func:`~poprun_py.hostside.identity.belonging`,
    the local backend's rule too)."""
    live, reaped = [], {}
    for child in children:
        if child.reaped_at is None:
            live.append(child.pid)
        else:
            reaped[child.pid] = child.reaped_at
    found = belonging(live, reaped, token.encode())
    return [(pid, stat[3]) for pid, stat in found.items() if stat[4] not in ("Z", "X")]


def signal_left_behind(found: Iterable[tuple[int, int]], sig: int) -> None:
    """``sig`` to each process found, only while its pid still names it."""
    for ident in found:
        signal_same(ident, sig)


def kill_group_left(pid: int) -> None:
    """SIGKILL what is left in the process group of ``pid``, a child just reaped (while that
    group is still the one it led)."""
    signal_left(pid, boot_ticks() or 0, signal.SIGKILL)
