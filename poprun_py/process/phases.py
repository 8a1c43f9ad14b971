"""What a launch is waiting for, host by host: each phase (connecting, preflight, sync,
staging, starting, the restart delay) with the hosts done out of the total, and the slowest
host named once it has kept the others waiting a few seconds.

The phases tell one :class:`Tracker`, installed by the command line around a launch with
:func:`tracking` (without one, every call here does nothing): :func:`phase` starts a phase on
some hosts and ends it, :func:`done` says that a host finished a step of it or all of it (the
SSH pool says so as each host's worker finishes: :meth:`~poprun_py.ssh.pool.ConnectionPool.each`),
and :func:`countdown` is a wait without hosts. Only phases begun on the thread that installed
the tracker are shown (the spares' preflight, beside the hosts', is not). The tracker keeps
every host's steps and hands its :class:`View` a :class:`Phase`: a frozen snapshot whose text
is a pure function of the time. The views are the command line's (:mod:`poprun_py.cli.status`):
a live line on a terminal, plain lines otherwise.

Example:

    >>> p = Phase.of(("connecting", "preflight"), ("n1", "n2", "n3"), started=0.0)
    >>> p.text(now=0.5)
    'connecting 0/3 hosts'
    >>> p = p.reached("n1", 2).reached("n2", 1).reached("n3", 1)
    >>> p.text(now=1.0)
    'preflight 1/3 hosts'
    >>> p.reached("n3", 2).text(now=4.2)
    'preflight 2/3 hosts … waiting for n2 (4 s)'
    >>> p.lasting(now=4.2)
    'connecting, preflight: 1/3 hosts done after 4.2 s; waiting for n2 and 1 more'
    >>> Phase.waiting("restart 1 of 3", seconds=5.0, started=0.0).text(now=0.7)
    'restart 1 of 3 in 5 s'
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

CONNECTING = "connecting"
"""The step the SSH pool reports once a host's connection is open."""

SLOW_AFTER = 3.0
"""Seconds into a phase after which the hosts it still waits for are named."""


@dataclass(frozen=True)
class Phase:
    """One phase as it stands: its steps in order, its hosts, and how many steps each host
    finished (``len(steps)``: all of them). A countdown has no hosts and an end (``until``)."""

    steps: tuple[str, ...]
    hosts: tuple[str, ...]
    started: float
    progress: Mapping[str, int] = field(default_factory=dict)
    until: float | None = None

    @classmethod
    def of(cls, steps: tuple[str, ...], hosts: Iterable[str], started: float) -> Phase:
        """A phase that has just begun on ``hosts``: no host has done anything yet."""
        names = tuple(dict.fromkeys(hosts))
        return cls(steps, names, started, dict.fromkeys(names, 0))

    @classmethod
    def waiting(cls, label: str, seconds: float, started: float) -> Phase:
        """A wait of ``seconds`` without hosts (the restart delay)."""
        return cls((label,), (), started, until=started + seconds)

    @property
    def label(self) -> str:
        """The phase's name: its steps, in order."""
        return ", ".join(self.steps)

    def reached(self, host: str, steps: int) -> Phase:
        """This phase once ``host`` finished ``steps`` steps (a host of another phase, or a
        step it already finished, changes nothing)."""
        if host not in self.progress or steps <= self.progress[host]:
            return self
        return replace(self, progress={**self.progress, host: min(steps, len(self.steps))})

    def step(self) -> int:
        """The step the phase is at: the first one some host has not finished."""
        least = min(self.progress.values(), default=len(self.steps))
        return min(least, len(self.steps) - 1)

    def pending(self) -> list[str]:
        """The hosts that have not finished the current step, in the phase's order."""
        k = self.step()
        return [host for host in self.hosts if self.progress[host] <= k]

    def text(self, now: float) -> str:
        """One line for a live status: ``preflight 14/16 hosts … waiting for n07 (4 s)``."""
        if self.until is not None:
            return f"{self.steps[0]} in {math.ceil(max(0.0, self.until - now))} s"
        if not self.hosts:  # a wait on no host in particular (a Slurm allocation)
            slow = now - self.started >= SLOW_AFTER
            return f"{self.steps[0]} ({int(now - self.started)} s)" if slow else self.steps[0]
        pending = self.pending()
        line = f"{self.steps[self.step()]} {len(self.hosts) - len(pending)}/{len(self.hosts)} hosts"
        if pending and now - self.started >= SLOW_AFTER:
            line += f" … waiting for {_named(pending)} ({int(now - self.started)} s)"
        return line

    def summary(self, now: float, ok: bool) -> str:
        """One plain line: how the phase stands (``ok``: it ended well) after ``now``."""
        took = f"{now - self.started:.1f} s"
        if self.until is not None or not self.hosts:
            return f"{self.label}: {'done in' if ok else 'stopped after'} {took}"
        total = len(self.hosts)
        if ok:
            return f"{self.label}: {total}/{total} hosts done in {took}"
        return self.lasting(now)

    def lasting(self, now: float) -> str:
        """One plain line: how the phase stands ``now``, while it lasts."""
        took = f"{now - self.started:.1f} s"
        if self.until is not None or not self.hosts:
            return f"{self.label}: under way for {took}"
        total, pending = len(self.hosts), self.pending()
        done = f"{self.label}: {total - len(pending)}/{total} hosts done after {took}"
        return f"{done}; waiting for {_named(pending)}" if pending else done


def _named(hosts: list[str]) -> str:
    """``n07`` or ``n07 and 2 more``."""
    more = f" and {len(hosts) - 1} more" if len(hosts) > 1 else ""
    return f"{hosts[0]}{more}"


class View(Protocol):
    """How phases are shown (the command line's, :mod:`poprun_py.cli.status`)."""

    def begin(self, tracker: Tracker) -> None:
        """A phase began; :meth:`Tracker.snapshot` tells how it stands from now on."""
        ...

    def end(self, phase: Phase, ok: bool, now: float) -> None:
        """The phase ended at ``now`` (``ok``: not by an error); ``phase`` as it stood."""
        ...


class Tracker:
    """The one phase under way and every host's steps in it, told to ``view``."""

    def __init__(self, view: View, clock: Callable[[], float] = time.monotonic):
        self.view, self.clock = view, clock
        self.owner = threading.get_ident()
        self._phase: Phase | None = None
        self._progress: dict[str, int] = {}  # kept here: a host's step costs no copy
        self._lock = threading.Lock()

    def begin(self, phase: Phase) -> bool:
        """Begin ``phase``; False (nothing shown) on another thread or inside another phase."""
        with self._lock:
            if self._phase is not None or threading.get_ident() != self.owner:
                return False
            self._phase, self._progress = phase, dict(phase.progress)
        self.view.begin(self)
        return True

    def done(self, host: str, step: str | None = None) -> None:
        """``host`` finished ``step`` of the phase (None: all of it)."""
        with self._lock:
            phase = self._phase
            if phase is None or host not in self._progress:
                return
            if step is None:
                self._progress[host] = len(phase.steps)
            elif step in phase.steps:
                count = phase.steps.index(step) + 1
                self._progress[host] = max(self._progress[host], count)

    def snapshot(self) -> Phase | None:
        """The phase under way, as it stands (None: none)."""
        with self._lock:
            if self._phase is None:
                return None
            return replace(self._phase, progress=dict(self._progress))

    def end(self, ok: bool) -> None:
        """End the phase under way."""
        phase = self.snapshot()
        with self._lock:
            self._phase = None
        if phase is not None:
            self.view.end(phase, ok, self.clock())


_installed: list[Tracker] = []  # the innermost last


def _current() -> Tracker | None:
    return _installed[-1] if _installed else None


@contextlib.contextmanager
def tracking(view: View, clock: Callable[[], float] = time.monotonic) -> Iterator[Tracker]:
    """Show the phases begun on this thread through ``view`` until the block ends."""
    tracker = Tracker(view, clock)
    _installed.append(tracker)
    try:
        yield tracker
    finally:
        _installed.remove(tracker)


@contextlib.contextmanager
def phase(steps: str | tuple[str, ...], hosts: Iterable[str]) -> Iterator[None]:
    """The block is a phase of ``steps`` (one name, or several in order) on ``hosts``."""
    tracker = _current()
    if tracker is None:
        yield
        return
    names = (steps,) if isinstance(steps, str) else steps
    with _shown(tracker, Phase.of(names, hosts, tracker.clock())):
        yield


@contextlib.contextmanager
def countdown(label: str, seconds: float) -> Iterator[None]:
    """The block waits ``seconds`` (``restart 1 of 3 in 4 s``)."""
    tracker = _current()
    if tracker is None or seconds <= 0:
        yield
        return
    with _shown(tracker, Phase.waiting(label, seconds, tracker.clock())):
        yield


@contextlib.contextmanager
def _shown(tracker: Tracker, begun: Phase) -> Iterator[None]:
    if not tracker.begin(begun):
        yield
        return
    ok = False
    try:
        yield
        ok = True
    finally:
        tracker.end(ok)


def done(host: str, step: str | None = None) -> None:
    """``host`` finished ``step`` of the phase under way (None: all of it); nothing when no
    phase is under way or ``host`` is not one of its hosts."""
    tracker = _current()
    if tracker is not None:
        tracker.done(host, step)
