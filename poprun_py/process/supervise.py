"""Process supervision shared by every backend: start, read, stop, sweep, reap.

:func:`supervise` starts each :class:`Child` from an argv list (never a shell) in a process
group of its own (and a session of its own when poprun-py has a terminal; see
:class:`~poprun_py.hostside.supervision.Spawner`), with stdin closed, one after another (each
start waits only for its exec).
One selector loop on the calling thread reads every stdout/stderr pipe and learns of exits
through pidfds. Output goes through a :class:`Feed` per pipe: by default :class:`LineFeed`,
which splits lines for an :class:`Output` (per-instance logs, ``only_output_from``, the sink).

Every child's end is reported to the run's :class:`~poprun_py.process.signals.Control`, whose
policy (fail-fast by default) asks for a stop when a child fails (non-zero exit, death by a
signal, or a program that cannot be started): then every other child's process group gets
SIGTERM, and SIGKILL after the grace period. SIGINT, SIGTERM and SIGHUP to poprun-py reach the
same Control through :mod:`poprun_py.process.signals` and stop everything the same way; a
second one sends SIGKILL at once. SIGUSR1/SIGUSR2 forwarded through the Control go to every
live child (:meth:`Supervision.signal`) and the run goes on. A hung job's stack dump
(:meth:`Supervision.dump_stacks`) runs ``py-spy dump`` on every live child's Python processes
from a thread (the loop goes on reading), emits the dumps as those children's stderr lines, and
sends SIGUSR1 to the others that registered faulthandler.

Nothing is left behind: poprun-py makes itself a child subreaper (Linux), so every descendant
stays in its subtree, and once its children are gone (or at a stop) it sweeps ``/proc`` for
what they left -- processes in their sessions or groups, their descendants, orphans it adopted,
anything carrying this run's ``POPRUN_RUN_ID`` -- then TERM, grace, KILL, and reaps the
adopted ones. A child that called ``setsid`` or double-forked is stopped too; no zombie stays.
The sweep is skipped when the subreaper has no child left at all (the usual, fast case).
No signal goes by a pid that may have been reused (:mod:`poprun_py.hostside.identity`): a child
gets one only until it is reaped, a leftover only while its pid still names the process found
(the same start time), and a reaped child's group or session counts only while it is still the
one it led; a reaped child whose group and session are empty is forgotten.

Beside it: what it is given and reports (:class:`Child`, :class:`ChildExit`, :class:`Supervised`,
:class:`Feed`: :mod:`~poprun_py.process.children`, re-exported here), the supervision core it
shares with the host agent (:mod:`poprun_py.hostside.supervision`: spawning and binding,
descriptor readiness, pipes and line splitting, the grace period), the process tree
(:mod:`~poprun_py.process.proctree`), the output lines (:mod:`~poprun_py.process.output`).

Example:

    >>> from poprun_py.backends.base import RunOptions
    >>> lines = []
    >>> out = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {0: "h1"})
    >>> run = supervise([Child(0, "h1", ("sh", "-c", "echo hi; exit 3"))], out, grace_period=1)
    >>> lines, run.exits[0].returncode, run.interrupted
    ([(0, 'stdout', 'hi')], 3, False)
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from poprun_py.core.result import InstanceState
from poprun_py.hostside.identity import (
    belonging,
    boot_ticks,
    identify,
    leads,
    open_pidfd,
    proc_table,
)
from poprun_py.hostside.stackdump import dump_in_background, find_pyspy
from poprun_py.hostside.supervision import RUN_ID_VAR, Grace, Launched, Pipe, Poller, Spawner
from poprun_py.process.children import Child, ChildExit, Feed, FeedFactory, Supervised
from poprun_py.process.output import LineFeed, Output
from poprun_py.process.proctree import (
    ProcStat,
    adopted_zombies,
    alive,
    no_children,
    reap_adopted,
    signal_found,
    subreaper,
)
from poprun_py.process.signals import Control, DumpRequest, handling_signals

__all__ = [
    "RUN_ID_VAR",
    "Child",
    "ChildExit",
    "Feed",
    "FeedFactory",
    "Supervised",
    "Supervision",
    "supervise",
]

log = logging.getLogger("poprun_py.launch")

_POLL_FALLBACK = 0.05
_DRAIN_TIMEOUT = 1.0


def supervise(
    children: Sequence[Child],
    output: Output,
    *,
    grace_period: float = 5.0,
    feeds: FeedFactory | None = None,
    new_session: bool | None = None,
    control: Control | None = None,
) -> Supervised:
    """Run ``children`` to the end; stop them all on the first failure or on SIGINT/SIGTERM.

    ``feeds`` makes each pipe's Feed (default: a :class:`LineFeed` into ``output``);
    ``new_session`` forces (or forbids) a session per child (default: when there is a
    terminal). ``control`` carries the stop requests (default: a fresh one, fail-fast, with
    the signal handlers of :mod:`poprun_py.process.signals` installed for this call).
    ``output`` is closed when this returns. Nothing started here outlives the call.
    """
    with contextlib.ExitStack() as stack:
        if control is None:
            control = Control()
            stack.callback(control.close)
            stack.enter_context(handling_signals(control))
            control.arm()
        run = Supervision(output, grace_period, feeds, new_session, control)
        run.start(children)
        return run.wait()
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack re-raises


_Spawned = tuple[Child, Launched | OSError | None, float]
"""A child, what starting it gave (None: not started, a stop had begun), and when."""


def no_stacks(index: int, pyspy_here: bool) -> str:
    """Why instance ``index`` gave no stacks: py-spy is missing here, or could not dump it.

    >>> print(no_stacks(3, pyspy_here=False))  # doctest: +NORMALIZE_WHITESPACE
    no stacks of instance 3: py-spy is not installed here and it did not register faulthandler
    (import poprun_py.dist)
    """
    pyspy = "py-spy could not dump it" if pyspy_here else "py-spy is not installed here"
    return (
        f"no stacks of instance {index}: {pyspy} and it did not register faulthandler "
        "(import poprun_py.dist)"
    )


@dataclass
class _Proc:
    """A started child and what we know of it."""

    child: Child
    launched: Launched
    started: float
    pidfd: int | None
    signalled: bool = False


class Supervision:
    """One supervision: :meth:`start` spawns every child, :meth:`wait` runs the poll loop and
    the stop sequence to the end (on the calling thread) and cleans up. Stop requests arrive
    through the :class:`~poprun_py.process.signals.Control`; every child's end is reported to
    it, and its policy decides whether the rest are stopped."""

    def __init__(
        self,
        output: Output,
        grace: float,
        feeds: FeedFactory | None,
        new_session: bool | None,
        control: Control,
    ):
        def line_feed(child: Child, stream: str) -> Feed:
            return LineFeed(output, child.index, stream)

        self.output, self.stop, self.feeds = output, Grace(grace), feeds or line_feed
        self.control = control
        self.sel = Poller()
        self.sel.register(control.wake_fd, None)
        self.run_id = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.spawner = Spawner({RUN_ID_VAR: self.run_id}, new_session)
        self.subreaper = False
        self.start_failed = False
        self.live: dict[int, _Proc] = {}
        self.exits: list[ChildExit] = []
        self.roots: set[int] = set()  # children not yet reaped: their pids are still theirs
        self.reaped: dict[int, int] = {}  # a reaped child's pid -> the clock tick of its reaping
        self.spawned = False
        boot = boot_ticks()  # every child starts at or after this tick
        self.since, self.since_unknown = boot or 0, boot is None
        self.pipes = 0
        self.t0 = time.time()
        self.order: dict[int, int] = {}
        self.forward: Callable[[int], None] = self.signal  # what a forwarded signal does
        self.dumper: Callable[[DumpRequest], None] = self.dump_stacks  # what a dump request does
        self._dumper_thread: threading.Thread | None = None
        self._dumps: list[tuple[DumpRequest, dict[int, list[bytes] | None]]] = []
        self._posted: list[Callable[[], None]] = []
        self._stack = contextlib.ExitStack()

    def start(self, children: Sequence[Child]) -> None:
        """Start every child, in order (a failed start or a stop request leaves the rest
        unstarted). Raises only on a bug; then everything started is killed."""
        self.order = {c.index: n for n, c in enumerate(children)}
        try:
            self.subreaper = self._stack.enter_context(subreaper())
            for child, outcome, when in self._spawn_all(children):
                if isinstance(outcome, Launched):
                    self._track(child, outcome, when)
                elif outcome is None:
                    self._not_started(child)
                else:
                    self._failed_start(child, outcome, when)
        except BaseException:
            self._finish()
            raise

    def wait(self) -> Supervised:
        """Loop until every child and pipe is done, clean up, return what was observed."""
        try:
            self._loop()
        finally:
            self._finish()
        exits = tuple(sorted(self.exits, key=lambda e: self.order[e.index]))
        return Supervised(exits, self.control.interrupted, time.time() - self.t0)

    def _finish(self) -> None:
        try:
            self._join_dumper()
            self._abort()
        finally:
            self._stack.close()
            self.output.close()

    def _spawn_all(self, children: Sequence[Child]) -> Iterator[_Spawned]:
        """Start the children in order, one after another: each start holds this thread only
        until the child has exec'd (posix_spawn), and spawning from several threads measured
        slower (16 x ``true``: 14.4 ms from two threads, 13.5 ms from one)."""
        yield from map(self._spawn_one, children)

    def _spawn_one(self, child: Child) -> _Spawned:
        now = time.time()
        if self.control.stopping or self.stop.kill_at is not None or self.start_failed:
            return child, None, now
        try:
            launched = self.spawner.start(child.argv, child.env, child.cwd, child.cpus, child.mems)
            return child, launched, now
        except OSError as err:
            self.start_failed = True
            return child, err, now

    def _failed_start(self, child: Child, err: OSError, when: float) -> None:
        code = 127 if isinstance(err, FileNotFoundError) else 126
        detail = f"cannot start {child.argv[0]!r}: {err.strerror or err}"
        exit_ = ChildExit(
            child.index, child.host, code, when, time.time(), InstanceState.EXITED, detail
        )
        self._record(exit_)
        self.control.ended(exit_.result())

    def _track(self, child: Child, launched: Launched, now: float) -> None:
        pid = launched.pid
        pidfd = open_pidfd(pid)
        self.live[pid] = _Proc(child, launched, now, pidfd)
        self.roots.add(pid)
        self.spawned = True
        if self.since_unknown:
            start = (identify(pid) or (pid, 0))[1]
            self.since = min(self.since or start, start)
        if pidfd is not None:
            self.sel.register(pidfd, pid)
        for stream, pipe in (("stdout", launched.stdout), ("stderr", launched.stderr)):
            self.sel.register(pipe.fileno(), Pipe(pipe, self.feeds(child, stream)))
            self.pipes += 1

    def _not_started(self, child: Child) -> None:
        now = time.time()
        self._record(
            ChildExit(
                child.index, child.host, None, now, now, InstanceState.NOT_STARTED, "not started"
            )
        )

    def _record(self, exit_: ChildExit) -> None:
        self.exits.append(exit_)

    def _loop(self) -> None:
        drain_until: float | None = None
        while self.live or (self.pipes and time.monotonic() < (drain_until or 0.0)):
            for data in self.sel.ready(self._timeout(drain_until)):
                self._dispatch(data)
            self._poll_exits()
            self._check_stop()
            if not self.live and drain_until is None:
                self._sweep_leftovers()
                drain_until = time.monotonic() + _DRAIN_TIMEOUT

    def _timeout(self, drain_until: float | None) -> float | None:
        now = time.monotonic()
        waits = [_POLL_FALLBACK] if any(p.pidfd is None for p in self.live.values()) else []
        waits += self.stop.waits(now)
        if drain_until is not None:
            waits.append(max(0.0, drain_until - now))
        return min(waits) if waits else None

    def _dispatch(self, data: Pipe | int | None) -> None:
        if isinstance(data, Pipe):
            self._read(data)
        elif isinstance(data, int):
            proc = self.live.get(data)  # None: already reaped earlier in this batch
            if proc is not None:
                self._reap(proc)
        else:
            self.control.drain()
            for signum in self.control.take_forwards():
                self.forward(signum)
            for request in self.control.take_dumps():
                self.dumper(request)
            while self._dumps:
                self._dumped(*self._dumps.pop(0))
            while self._posted:
                self._posted.pop(0)()

    def post(self, call: Callable[[], None]) -> None:
        """Have the loop run ``call`` soon (any thread may ask: Output is not thread-safe)."""
        self._posted.append(call)
        self.control.wake()

    def dump_stacks(self, request: DumpRequest) -> None:
        """Every live child's Python stacks with ``py-spy dump`` (on a thread, bounded by its
        timeout), else SIGUSR1 to those that registered faulthandler (see :meth:`_dumped`)."""
        roots = {proc.child.index: pid for pid, proc in self.live.items()}

        def done(found: dict[int, list[bytes] | None]) -> None:
            self._dumps.append((request, found))
            self.control.wake()  # the loop emits the dumps (Output is not thread-safe)

        self._join_dumper()
        self._dumper_thread = dump_in_background(roots, done)

    def _dumped(self, request: DumpRequest, found: Mapping[int, list[bytes] | None]) -> None:
        """Emit each dump as its child's stderr; SIGUSR1 where there is none and the child
        registered faulthandler; tell the Control."""
        live = {proc.child.index: proc for proc in self.live.values()}
        signalled = False
        for index, lines in sorted(found.items()):
            proc = live.get(index)
            if lines is not None:
                for line in lines:
                    self.output.emit(index, "stderr", line)
            elif proc is not None and index in request.faulthandler:
                proc.launched.signal(signal.SIGUSR1, proc.child.signal_group)
                signalled = True
            elif proc is not None:
                log.warning("%s", no_stacks(index, find_pyspy() is not None))
        self.control.dumped(signalled)

    def _join_dumper(self) -> None:
        """Wait for a stack dump under way (its py-spy runs are bounded by their timeout)."""
        if self._dumper_thread is not None:
            self._dumper_thread.join()
            self._dumper_thread = None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every live child: its process group, or only itself when it
        forwards signals to what it started (``signal_group`` False: mpirun, srun)."""
        for proc in list(self.live.values()):
            proc.launched.signal(signum, proc.child.signal_group)

    def _read(self, pipe: Pipe) -> None:
        if pipe.read():
            return
        self.sel.unregister(pipe.fd)
        pipe.close()
        self.pipes -= 1

    def _poll_exits(self) -> None:
        for proc in list(self.live.values()):
            if proc.pidfd is None and proc.launched.poll() is not None:
                self._reap(proc)

    def _reap(self, proc: _Proc) -> None:
        code = proc.launched.wait()
        pid = proc.launched.pid
        del self.live[pid]
        self.roots.discard(pid)  # its pid may be anyone's from now on: never signalled again
        self.reaped[pid] = proc.launched.reaped_at or 0
        if proc.pidfd is not None:
            self.sel.unregister(proc.pidfd)
            os.close(proc.pidfd)
        stopped = proc.signalled and code != 0
        child, state = proc.child, InstanceState.STOPPED if stopped else InstanceState.EXITED
        exit_ = ChildExit(child.index, child.host, code, proc.started, time.time(), state)
        self._record(exit_)
        self.control.ended(exit_.result())

    def _check_stop(self) -> None:
        if self.control.stopping and self.stop.kill_at is None:
            self._begin_stop()
        if self.control.kill_now or self.stop.due(time.monotonic()):
            self._kill_all()

    def _begin_stop(self) -> None:
        """SIGTERM every live child (its group, or itself) and every escaped descendant."""
        if not self.stop.begin(time.monotonic()):
            return
        for proc in list(self.live.values()):  # those that already ended did so on their own
            if proc.launched.poll() is not None:
                self._reap(proc)
        for proc in self.live.values():
            proc.signalled = True
            proc.launched.signal(signal.SIGTERM, proc.child.signal_group)
        found = self._leftovers()
        signal_found({pid: found[pid] for pid in self._escaped(found)}, signal.SIGTERM)

    def _escaped(self, found: Mapping[int, ProcStat]) -> list[int]:
        """Leftovers no group signal reaches (they left their child's group), except those
        under a child that forwards signals itself (mpirun: ``signal_group`` False)."""
        forwarders = {pid for pid, proc in self.live.items() if not proc.child.signal_group}
        escaped = []
        for pid, stat in found.items():
            if stat[1] in self.live and stat[1] not in forwarders:
                continue  # its group got the SIGTERM
            top = pid
            while top in found and found[top][0] not in self.roots:
                top = found[top][0]
            if top not in found or found[top][0] not in forwarders:
                escaped.append(pid)
        return escaped

    def _kill_all(self) -> None:
        if not self.stop.kill():
            return
        for proc in self.live.values():
            proc.signalled = True
            proc.launched.signal(signal.SIGKILL)
        signal_found(self._leftovers(), signal.SIGKILL)

    def _leftovers(self) -> dict[int, ProcStat]:
        """What the children left (:func:`~poprun_py.hostside.identity.belonging`, with the
        orphans this subreaper adopted); a reaped child whose process group and session it no
        longer leads is forgotten: they are over for good."""
        table = proc_table()
        self.reaped = {p: at for p, at in self.reaped.items() if leads(p, at, table)}
        token = f"{RUN_ID_VAR}={self.run_id}".encode()
        found = belonging(
            self.roots, self.reaped, token, table=table, since=self.since, adopted=True
        )
        return {pid: stat for pid, stat in found.items() if pid not in self.live}

    def _sweep_leftovers(self) -> None:
        """All children are gone: stop what they left behind (TERM, grace, KILL) and reap it."""
        self._join_dumper()  # py-spy runs are our children, not leftovers
        if not self.spawned or (self.subreaper and no_children()):
            return  # a subreaper without children has no descendants left: skip the /proc walk
        found = self._leftovers()
        if not found:
            return
        running = alive(set(found))
        if running and not self.stop.killed:
            signal_found({pid: found[pid] for pid in running}, signal.SIGTERM)
            deadline = self.stop.kill_at or time.monotonic() + self.stop.grace
            while alive(running) and time.monotonic() < deadline:
                time.sleep(0.01)
                reap_adopted(set(found))
        self._kill_until_gone()

    def _kill_until_gone(self) -> None:
        deadline = time.monotonic() + max(2.0, self.stop.grace)
        while time.monotonic() < deadline:
            found = self._leftovers()
            reap_adopted(set(found))
            running = alive(set(found))
            if not running and not adopted_zombies(set(found)):
                return
            signal_found({pid: found[pid] for pid in running}, signal.SIGKILL)
            time.sleep(0.005)

    def _abort(self) -> None:
        """Last resort on the way out (also on exceptions): kill and reap what remains."""
        if self.live:
            self._kill_all()
            for proc in list(self.live.values()):
                self._reap(proc)
            self._kill_until_gone()
        for data in list(self.sel.data.values()):
            if isinstance(data, Pipe):
                data.close()
        self.sel.close()
        self.spawner.close()
