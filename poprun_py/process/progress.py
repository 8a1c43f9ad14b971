"""Progress of every running instance, for hang detection: the time of its last output line,
and whether it registered :mod:`faulthandler` for SIGUSR1 (so a stack dump can be asked for).

The channel works through every backend because it is the instance's own output, which every
backend already carries line by line to :class:`~poprun_py.process.output.Output`: any line
counts as progress, and :func:`poprun_py.dist.heartbeat` writes :data:`HEARTBEAT` -- a line on
stderr that poprun-py swallows (never logged nor shown) -- for programs that print rarely.
``poprun_py.dist`` writes :data:`FAULTHANDLER` once on import (only when started by poprun-py)
after registering ``faulthandler`` for SIGUSR1; that line is swallowed too.

An ended instance is never hung: :meth:`Progress.ended` stops watching it. The launcher calls it
from :meth:`~poprun_py.process.signals.Control.ended`, where every runner reports an instance's
end (the local and ssh backends, and the launchers' own exit); under mpirun, mpiexec and srun,
whose ranks may end long before the launcher does, each rank's wrapper writes :data:`ENDED` on
its stderr once the program exited (whatever its code), which :meth:`Progress.seen` takes the
same way (and poprun-py swallows). While a hang's stacks are gathered, :meth:`Progress.record`
keeps every running instance's lines for the hang's verdict (:mod:`poprun_py.core.stacks`).

Example:

    >>> p = Progress([0, 1], now=100.0)
    >>> p.seen(1, FAULTHANDLER.decode(), now=105.0)
    True
    >>> p.stalest(now=110.0), p.dumpable, p.faulthandler
    ((0, 10.0), False, frozenset({1}))
    >>> p.seen(0, "step 3", now=111.0), p.stalest(now=112.0)
    (False, (1, 7.0))
    >>> p.ended(1); p.stalest(now=130.0), p.dumpable
    ((0, 19.0), False)
    >>> p.record(); p.seen(0, "  File \\"t.py\\", line 3 in f", now=112.5)
    False
    >>> p.recorded(), p.recorded()
    ({0: ['  File "t.py", line 3 in f']}, {})
    >>> p.seen(0, STEP + b"41]"), p.seen(3, STEP + b"9]"), p.last_step
    (True, True, 41)
    >>> p.seen(0, ENDED), p.stalest(now=500.0), p.running
    (True, None, frozenset())
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

HEARTBEAT = b"\x1b[poprun-py:heartbeat]"
"""The line :func:`poprun_py.dist.heartbeat` writes on stderr (swallowed by poprun-py)."""
FAULTHANDLER = b"\x1b[poprun-py:faulthandler]"
"""The line ``poprun_py.dist`` writes on stderr once faulthandler dumps stacks on SIGUSR1."""
ENDED = b"\x1b[poprun-py:ended]"
"""The line each rank's wrapper (mpirun, mpiexec, srun) writes on stderr once its program
ended, whatever its code: the rank is no longer watched (swallowed by poprun-py)."""
MARKERS = (HEARTBEAT, FAULTHANDLER, ENDED)
STEP = b"\x1b[poprun-py:step "
"""How :func:`poprun_py.dist.heartbeat` with ``step=N`` starts its line (``...step N]``): progress
that says how far the instance got (``--min-progress``; swallowed by poprun-py)."""


def step_of(line: bytes) -> int | None:
    """N of a step marker line, else None."""
    if not line.startswith(STEP) or not line.endswith(b"]"):
        return None
    digits = line[len(STEP) : -1]
    return int(digits) if digits.isdigit() else None


def is_marker(line: bytes) -> bool:
    """``line`` (without its newline) is one of poprun-py's markers, which are swallowed."""
    if line[:2] != b"\x1b[":  # most lines: one comparison
        return False
    text = line.rstrip(b"\r")
    return text in MARKERS or step_of(text) is not None


RECORDED_LINES = 2000
"""Lines kept per instance while a hang's stacks are gathered (for its verdict)."""


class Progress:
    """Thread-safe: backends' output loops call :meth:`seen` (and :meth:`ended`), the
    launcher's clock thread reads :meth:`stalest`."""

    def __init__(self, indexes: Iterable[int], now: float | None = None):
        start = time.monotonic() if now is None else now
        self._last = dict.fromkeys(indexes, start)
        self._faulthandler: set[int] = set()
        self._recording: dict[int, list[str]] | None = None
        self._steps: dict[int, int] = {}  # the last step each instance reported
        self._lock = threading.Lock()

    def seen(self, index: int, line: str | bytes, now: float | None = None) -> bool:
        """Instance ``index`` wrote ``line``; True when it is one of poprun-py's markers (the
        caller then swallows it)."""
        raw = line.encode("utf-8", "replace") if isinstance(line, str) else line
        text = raw.rstrip(b"\r")
        marker = is_marker(text)
        with self._lock:
            if text == ENDED:
                self._drop(index)
            elif index in self._last:
                self._last[index] = time.monotonic() if now is None else now
                if text == FAULTHANDLER:
                    self._faulthandler.add(index)
            step = step_of(text) if marker else None
            if step is not None:
                self._steps[index] = max(step, self._steps.get(index, step))
            kept = self._recording.get(index) if self._recording is not None else None
            if kept is not None and not marker and len(kept) < RECORDED_LINES:
                kept.append(text.decode("utf-8", "replace"))
        return marker

    def record(self) -> None:
        """From now on keep the running instances' lines (a stack dump's), up to
        :data:`RECORDED_LINES` each, until :meth:`recorded`."""
        with self._lock:
            self._recording = {index: [] for index in self._last}

    def recorded(self) -> dict[int, list[str]]:
        """The lines kept since :meth:`record`, per instance running then; stops keeping."""
        with self._lock:
            kept, self._recording = self._recording or {}, None
            return kept

    @property
    def last_step(self) -> int | None:
        """The furthest step any instance reported (``heartbeat(step=N)``), None if none did."""
        with self._lock:
            return max(self._steps.values(), default=None)

    def ended(self, index: int) -> None:
        """Instance ``index`` ended (any way): it is no longer watched, so never hung."""
        with self._lock:
            self._drop(index)

    def _drop(self, index: int) -> None:
        self._last.pop(index, None)
        self._faulthandler.discard(index)

    def stalest(self, now: float | None = None) -> tuple[int, float] | None:
        """The running instance silent the longest, and for how many seconds (None: none
        runs)."""
        at = time.monotonic() if now is None else now
        with self._lock:
            if not self._last:
                return None
            index = min(self._last, key=lambda i: (self._last[i], i))
            return index, at - self._last[index]

    def last(self, index: int) -> float:
        """When running instance ``index`` was last heard (monotonic)."""
        with self._lock:
            return self._last[index]

    @property
    def running(self) -> frozenset[int]:
        """The instances still watched (not known to have ended)."""
        with self._lock:
            return frozenset(self._last)

    @property
    def faulthandler(self) -> frozenset[int]:
        """The running instances that registered faulthandler for SIGUSR1."""
        with self._lock:
            return frozenset(self._faulthandler)

    @property
    def dumpable(self) -> bool:
        """True when every running instance registered faulthandler for SIGUSR1."""
        with self._lock:
            return bool(self._last) and self._faulthandler >= set(self._last)
