"""What a run gives back -- every instance's outcome, root cause first -- and how it is run.

Example:

    >>> ok = InstanceResult(0, "h1", exit_code=0)
    >>> bad = InstanceResult(1, "h2", exit_code=3, ended=2.0)
    >>> result = LaunchResult((ok, bad))
    >>> result.root_cause.index, result.exit_code
    (1, 3)
    >>> lost = InstanceResult(2, "h3", state=InstanceState.LOST)
    >>> lost.code, lost.state, f"{lost.state}"
    (255, <InstanceState.LOST: 'lost'>, 'lost')
    >>> LaunchResult((ok,), cause=JobCause("timed out after 90 s", 124)).exit_code
    124
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from poprun_py.core.stacks import Hang
from poprun_py.errors import EXIT_INTERRUPTED, EXIT_LOST, EXIT_OK


class InstanceState(enum.StrEnum):
    """How an instance ended; its value is the text printed and written (as before: strings)."""

    EXITED = "exited"  # ran to the end, any code
    STOPPED = "stopped"  # poprun-py stopped it: another instance failed, or the user interrupted
    LOST = "lost"  # its host stopped answering
    NOT_STARTED = "not-started"


@dataclass(frozen=True)
class InstanceResult:
    """How one instance ended (``state``: see :class:`InstanceState`; its text is taken too)."""

    index: int
    host: str
    exit_code: int | None = None
    signal: int | None = None
    state: InstanceState = InstanceState.EXITED
    started: float = 0.0
    ended: float = 0.0
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", InstanceState(self.state))

    @property
    def failed(self) -> bool:
        """True when this instance is a failure in its own right (not merely stopped)."""
        if self.state is InstanceState.LOST:
            return True
        return self.state is InstanceState.EXITED and (
            self.exit_code != 0 or self.signal is not None
        )

    @property
    def code(self) -> int:
        """An exit code for this outcome (128+signal for signals, 255 for a lost host, 1 if
        unknown)."""
        if self.state is InstanceState.LOST:
            return EXIT_LOST
        if self.exit_code is not None:
            return self.exit_code
        if self.signal is not None:
            return 128 + self.signal
        return 1


@dataclass(frozen=True)
class JobCause:
    """Why the launcher stopped a whole attempt by its own clocks (``--timeout``,
    ``--hang-timeout``): the reason shown first, the exit code, the instance when one is named."""

    reason: str
    code: int
    index: int | None = None


@dataclass(frozen=True)
class LaunchResult:
    """Every instance's outcome. ``root_cause`` is the earliest failure; ``cause`` a job-level
    cause (timed out, hung) that comes before it; ``attempts`` the earlier attempts of a
    restarted job (``--max-restarts``), first to last, and ``restart_failed`` why a further
    restart could not be made."""

    instances: tuple[InstanceResult, ...]
    interrupted: bool = False
    duration: float = 0.0
    cause: JobCause | None = None
    attempts: tuple[LaunchResult, ...] = ()
    restart_failed: str = ""
    replaced: tuple[tuple[str, str], ...] = ()  # (lost host, spare) in this attempt's plan
    job_dir: str = ""  # where the job's files were left ("": removed after success, or none)
    hang: Hang | None = None  # the verdict of the stacks dumped when an instance hung
    last_step: int | None = None  # the furthest step an instance reported (dist.heartbeat)
    wrote_progress_file: bool = False  # --progress-file's mtime advanced during the attempt

    @property
    def failures(self) -> tuple[InstanceResult, ...]:
        """Instances that failed in their own right, earliest first."""
        return tuple(sorted((r for r in self.instances if r.failed), key=lambda r: r.ended))

    @property
    def root_cause(self) -> InstanceResult | None:
        """The earliest failure, if any."""
        failures = self.failures
        return failures[0] if failures else None

    @property
    def ok(self) -> bool:
        """True when every instance exited 0, nobody interrupted and no clock ran out."""
        return not self.interrupted and not self.failures and self.cause is None

    @property
    def exit_code(self) -> int:
        """0, the job-level cause's code (124), 130 when interrupted, else the root cause's."""
        if self.cause is not None:
            return self.cause.code
        root = self.root_cause
        if root is not None:
            return root.code
        return EXIT_INTERRUPTED if self.interrupted else EXIT_OK

    @property
    def lost_hosts(self) -> tuple[str, ...]:
        """The hosts lost during this attempt (each once, in instance order)."""
        return tuple(dict.fromkeys(r.host for r in self.instances if r.state is InstanceState.LOST))


HOST_TIMEOUT = 180.0
"""The default ``--host-timeout``: seconds of silence (no heartbeat either way) after which a
host is lost, and after which its agent takes poprun-py to be gone (docs/long-runs.md: "Hosts
that stop answering"). A dead host is usually noticed at once anyway: its connection ends."""


class Watch(Protocol):
    """What output tells of progress (:class:`poprun_py.process.progress.Progress`)."""

    def seen(self, index: int, line: str | bytes, now: float | None = None) -> bool:
        """Note instance ``index``'s output line; True for a marker that is not shown."""


OutputSink = Callable[[int, str, str], None]
"""Called with (instance index, stream name ``stdout``/``stderr``, one line without newline)."""


class LastWords:
    """Each instance's last non-empty stderr line, as output routes it (every backend): the
    failure summary's ``detail`` when the backend has none of its own.

    >>> words = LastWords()
    >>> for stream, line in [("stderr", b"boom"), ("stderr", b"  "), ("stdout", b"x")]:
    ...     words.note(3, stream, line)
    >>> words.lines
    {3: 'boom'}
    """

    def __init__(self) -> None:
        self.lines: dict[int, str] = {}

    def note(self, index: int, stream: str, line: bytes) -> None:
        """Keep ``line`` if it is a non-empty stderr line of an instance (not the launcher's)."""
        if stream == "stderr" and index >= 0 and line.strip():
            self.lines[index] = line.decode("utf-8", "replace")


@dataclass(frozen=True)
class RunOptions:
    """How to run: where logs go, whose output to show, how long to wait before SIGKILL."""

    output_dir: Path | None = None
    only_output_from: int | None = None
    grace_period: float = 5.0
    sink: OutputSink | None = None
    connect_timeout: float = 10.0
    host_timeout: float = HOST_TIMEOUT  # silence after which a host (or poprun-py) is gone
    extra: dict[str, str] = field(default_factory=dict)
    attempt: int = 0  # the restart count: logs of a later attempt are appended to
    progress: Watch | None = None  # told of every instance's output (hang detection)
    last_words: LastWords | None = None  # keeps each instance's last stderr line


@dataclass(frozen=True)
class RunSettings:
    """Run-time settings that do not change the plan."""

    output_dir: str | None = None
    only_output_from: int | None = None
    sink: OutputSink | None = None
    sync: bool = False
    on_running: Callable[[int], None] | None = None  # told when attempt k's instances all run
    keep_job_dir: bool = False  # keep a successful job's directory (else removed)
    last_words: LastWords | None = None  # keeps each instance's last stderr line (summary)
