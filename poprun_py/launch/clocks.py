"""The clocks of one attempt, for every backend: ``--timeout`` (the attempt ran too long) and
``--hang-timeout`` (an instance made no progress), on a thread of their own beside the running
job's ``wait``.

Progress is any output line of an instance, or :func:`poprun_py.dist.heartbeat` (see
:mod:`poprun_py.process.progress`). When an instance has been silent for the hang timeout the
clock first asks for every instance's stacks -- SIGUSR1 through the job's
:class:`~poprun_py.process.signals.Control` when every instance registered faulthandler (any
program importing ``poprun_py.dist``), so the stacks land in each instance's log and on the
terminal -- waits :data:`DUMP_WAIT` seconds for them, then stops the job with a job-level cause
(:class:`~poprun_py.backends.result.JobCause`, exit 124). The thread never touches the backend
itself: only the Control, which is thread-safe.

Example:

    >>> from poprun_py.process.progress import Progress
    >>> from poprun_py.process.signals import Control
    >>> control, progress = Control(), Progress([0])
    >>> with Clocks(control, progress, {0: "h1"}, hang_timeout=0.05) as clocks:
    ...     _ = control.drain(), __import__("time").sleep(0.3)
    >>> clocks.cause.reason, clocks.cause.code, control.stop_reason == clocks.cause.reason
    ('instance 0 on h1 hung (no progress for 0.05 s)', 124, True)
    >>> control.close()
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from types import TracebackType

from poprun_py.backends.result import JobCause
from poprun_py.errors import EXIT_TIMEOUT
from poprun_py.process.progress import Progress
from poprun_py.process.signals import Control

log = logging.getLogger("poprun_py.launch")

DUMP_WAIT = 1.0
"""Seconds between asking a hung job for its stacks and stopping it."""
TICK = 0.25
"""The clocks' resolution: a limit is seen at most this late."""


def describe(seconds: float) -> str:
    """``90 s``, ``45 min``, ``2 h`` -- a limit as the user wrote it, roughly."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


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
                if silent >= self.hang_timeout:
                    self._hung(index)
                    return

    def _hung(self, index: int) -> None:
        host = self.hosts.get(index, "?")
        assert self.hang_timeout is not None
        reason = f"instance {index} on {host} hung (no progress for {self.hang_timeout:g} s)"
        self._dump_stacks(reason)
        self._fire(JobCause(reason, EXIT_TIMEOUT, index))

    def _dump_stacks(self, reason: str) -> None:
        """SIGUSR1 to every instance when all registered faulthandler; then a moment for the
        stacks to arrive in the logs."""
        if not self.progress.dumpable:
            log.warning(
                "%s; no stacks dumped: not every instance imported poprun_py.dist "
                "(which registers faulthandler for SIGUSR1)",
                reason,
            )
            return
        log.warning("%s; dumping every instance's stacks (SIGUSR1, faulthandler)", reason)
        self.control.forward(signal.SIGUSR1)
        self._done.wait(DUMP_WAIT)

    def _fire(self, cause: JobCause) -> None:
        if self.control.stopping:
            return
        self.cause = cause
        self.control.stop(cause.reason)
