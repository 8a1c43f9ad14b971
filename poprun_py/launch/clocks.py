"""The clocks of one attempt, for every backend: ``--timeout`` (the attempt ran too long) and
``--hang-timeout`` (an instance made no progress), on a thread of their own beside the running
job's ``wait``.

Progress is any output line of an instance, or :func:`poprun_py.dist.heartbeat` (see
:mod:`poprun_py.process.progress`). When an instance has been silent for the hang timeout the
clock first asks for every instance's stacks through the job's
:class:`~poprun_py.process.signals.Control` (a
:class:`~poprun_py.process.signals.DumpRequest`, the same for every backend): the runner dumps
each running instance with ``py-spy dump`` where py-spy is on the PATH of the host that runs it
(this machine, or the host's agent), and sends SIGUSR1 to the others that registered
faulthandler (any program importing ``poprun_py.dist``), so the stacks land in each instance's
log and on the terminal; the clock keeps them too, and prints the hang's verdict (which ranks
are where, the odd ones named first: :mod:`poprun_py.core.stacks`). The clock waits for the
runner's answer (at most :data:`DUMP_LIMIT` seconds; py-spy runs in parallel, each killed after
:data:`~poprun_py.hostside.stackdump.PYSPY_TIMEOUT`), and up to :data:`DUMP_WAIT` more when
SIGUSR1 was sent, then stops the job with a job-level cause
(:class:`~poprun_py.core.result.JobCause`, exit 124) -- unless something else stopped it
first (an instance failed meanwhile: its failure stays the root cause). An instance that ended,
in any way, is never hung: the attempt tells the progress of every end
(:meth:`~poprun_py.process.progress.Progress.ended`). The thread never touches the backend
itself: only the Control, which is thread-safe.

Example:

    >>> from poprun_py.process.progress import Progress
    >>> from poprun_py.process.signals import Control, DumpRequest
    >>> control, progress = Control(), Progress([0])
    >>> with Clocks(control, progress, {0: "h1"}, hang_timeout=0.05) as clocks:
    ...     _ = control.drain(), __import__("time").sleep(0.3)
    >>> clocks.cause.reason, clocks.cause.code, control.stop_reason == clocks.cause.reason
    ('instance 0 on h1 hung (no progress for 0.05 s)', 124, True)
    >>> control.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType

from poprun_py.core import stacks
from poprun_py.core.result import JobCause
from poprun_py.errors import EXIT_TIMEOUT
from poprun_py.process.progress import Progress
from poprun_py.process.signals import Control, DumpRequest

log = logging.getLogger("poprun_py.launch")

DUMP_LIMIT = 1.5
"""Seconds at most between asking a hung job for its stacks and the runner's answer."""
DUMP_WAIT = 0.5
"""Seconds more for faulthandler's output to arrive, when SIGUSR1 was sent (cut down to what is
left of :data:`DUMP_LIMIT`, but at least :data:`MIN_DUMP_WAIT`): the whole dump stays within
TICK + DUMP_LIMIT + MIN_DUMP_WAIT < 2 s of the hang being due."""
MIN_DUMP_WAIT = 0.2
TICK = 0.25
"""The clocks' resolution: a limit is seen at most this late."""


def describe(seconds: float) -> str:
    """``90 s``, ``45 min``, ``2 h`` -- a limit as the user wrote it, roughly."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def dumping_stacks(faulthandlers: int) -> str:
    """What a hang's stack dump does, for ``faulthandlers`` instances that registered one.

    >>> print(dumping_stacks(0))  # doctest: +NORMALIZE_WHITESPACE
    dumping every instance's stacks with py-spy where it is installed (no instance registered
    faulthandler for SIGUSR1: import poprun_py.dist)
    >>> dumping_stacks(8).split(", ")[1]
    'else with SIGUSR1 to the 8 instances that registered faulthandler'
    """
    how = "dumping every instance's stacks with py-spy where it is installed"
    if not faulthandlers:
        return f"{how} (no instance registered faulthandler for SIGUSR1: import poprun_py.dist)"
    which = "1 instance that" if faulthandlers == 1 else f"{faulthandlers} instances that"
    return f"{how}, else with SIGUSR1 to the {which} registered faulthandler"


class Clocks:
    """Watches one attempt; ``cause`` says why it stopped the job (None: it did not)."""

    def __init__(
        self,
        control: Control,
        progress: Progress,
        hosts: Mapping[int, str],
        *,
        timeout: float | None = None,
        hang_timeout: float | None = None,
    ):
        self.control, self.progress, self.hosts = control, progress, hosts
        self.timeout, self.hang_timeout = timeout, hang_timeout
        self.cause: JobCause | None = None
        self.hang: stacks.Hang | None = None  # the verdict of the stacks dumped for a hang
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="poprun-clocks")

    def __enter__(self) -> Clocks:
        if self.timeout is not None or self.hang_timeout is not None:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        start = time.monotonic()
        while not self._done.wait(TICK):
            if self.control.stopping:
                return  # stopped for another reason: that reason is the cause
            now = time.monotonic()
            if self.timeout is not None and now - start >= self.timeout:
                self._fire(JobCause(f"timed out after {describe(self.timeout)}", EXIT_TIMEOUT))
                return
            stalest = self.progress.stalest(now) if self.hang_timeout is not None else None
            if stalest is not None and self.hang_timeout is not None:
                index, silent = stalest
                if silent >= self.hang_timeout and self._hung(index):
                    return

    def _hung(self, index: int) -> bool:
        """Dump every stack, then stop the job for instance ``index``'s hang, unless it ended
        meanwhile (then the clock goes on watching the others); True when it stopped it."""
        host = self.hosts.get(index, "?")
        assert self.hang_timeout is not None
        reason = f"instance {index} on {host} hung (no progress for {self.hang_timeout:g} s)"
        self._dump_stacks(reason)
        if index not in self.progress.running:
            log.warning("instance %d on %s ended meanwhile: it was not hung", index, host)
            return False
        self._fire(JobCause(reason, EXIT_TIMEOUT, index))
        return True

    def _dump_stacks(self, reason: str) -> None:
        """Ask the runner for every instance's stacks (py-spy where installed, else SIGUSR1
        to those that registered faulthandler) and wait, bounded, for them to arrive."""
        faulthandler = self.progress.faulthandler
        log.warning("%s; %s", reason, dumping_stacks(len(faulthandler)))
        running = sorted(self.progress.running)
        self.progress.record()
        self.control.dump(DumpRequest(faulthandler, every=self.progress.dumpable))
        self._wait_for_dumps()
        dumps = self.progress.recorded()
        self.hang = stacks.verdict({i: dumps.get(i, []) for i in running}, self.hosts)
        log.warning("%s", "\n".join(stacks.describe(self.hang)))  # the groups under it

    def _wait_for_dumps(self) -> None:
        """Until the runner says the stacks were dumped (at most :data:`DUMP_LIMIT` seconds),
        then a moment more for faulthandler's output when SIGUSR1 was sent."""
        deadline = time.monotonic() + DUMP_LIMIT
        while not self.control.wait_dumped(min(TICK, max(0.0, deadline - time.monotonic()))):
            if self._done.is_set() or time.monotonic() >= deadline:
                return
        if self.control.dump_signalled:  # within the limit, but faulthandler gets a moment
            self._done.wait(min(DUMP_WAIT, max(MIN_DUMP_WAIT, deadline - time.monotonic())))

    def _fire(self, cause: JobCause) -> None:
        """Stop the job for ``cause``, which is the cause only when this stop came first: an
        instance's failure (or the user's interrupt) that stopped the job meanwhile, even
        between a check and the stop, stays the job's root cause. One atomic step
        (:meth:`Control.stop`), never check-then-stop."""
        if self.control.stop(cause.reason):
            self.cause = cause
