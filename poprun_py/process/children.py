"""What a supervision (:mod:`poprun_py.process.supervise`) is given and what it reports: a
:class:`Child` to start, each child's :class:`ChildExit`, the whole run's :class:`Supervised`, and
the :class:`Feed` that takes one pipe's bytes.

Example:

    >>> ended = ChildExit(1, "h1", -15, started=0.0, ended=1.0, state="stopped")
    >>> ended.stopped, ended.failed, ended.result().signal
    (True, False, 15)
    >>> Supervised((ended,), interrupted=True, duration=1.0).launch_result().interrupted
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from poprun_py.core.result import InstanceResult, InstanceState, LaunchResult


@dataclass(frozen=True)
class Child:
    """One process to start. ``env`` is added to ``os.environ``. With ``signal_group`` False
    only the process itself gets SIGTERM (mpirun forwards it to its ranks); SIGKILL always
    goes to the whole group."""

    index: int
    host: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    signal_group: bool = True
    cpus: tuple[int, ...] = ()  # bound to these CPUs, and its memory to NUMA nodes ``mems``
    mems: tuple[int, ...] = ()


@dataclass(frozen=True)
class ChildExit:
    """How one child ended. ``returncode`` is negative for a signal (subprocess's convention),
    None when it never started.
    ``state`` is ``exited`` (on its own), ``stopped`` (poprun-py had signalled it and it did not
    exit 0) or ``not-started`` (a stop began before its turn came); its text is taken too."""

    index: int
    host: str
    returncode: int | None
    started: float
    ended: float
    state: InstanceState = InstanceState.EXITED
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", InstanceState(self.state))

    @property
    def stopped(self) -> bool:
        """True when poprun-py stopped it (or never started it)."""
        return self.state is not InstanceState.EXITED

    @property
    def failed(self) -> bool:
        """True when the child failed in its own right (not merely stopped by us)."""
        return self.returncode != 0 and not self.stopped

    def result(self) -> InstanceResult:
        """This exit as an :class:`InstanceResult`."""
        code = self.returncode
        return InstanceResult(
            index=self.index,
            host=self.host,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            state=self.state,
            started=self.started,
            ended=self.ended,
            detail=self.detail,
        )


@dataclass(frozen=True)
class Supervised:
    """What :func:`~poprun_py.process.supervise.supervise` observed: every child's exit, in
    start order."""

    exits: tuple[ChildExit, ...]
    interrupted: bool
    duration: float

    def launch_result(self) -> LaunchResult:
        """One InstanceResult per child (for backends where a child is an instance)."""
        results = tuple(e.result() for e in self.exits)
        return LaunchResult(results, interrupted=self.interrupted, duration=self.duration)


class Feed(Protocol):
    """Receives the raw bytes of one pipe, as they arrive, then ``close()`` at EOF."""

    def feed(self, data: bytes) -> None:
        """Take the next chunk."""

    def close(self) -> None:
        """The pipe reached EOF: flush whatever is pending."""


FeedFactory = Callable[[Child, str], Feed]
"""Makes the Feed for one child's stream (``stdout`` or ``stderr``)."""
