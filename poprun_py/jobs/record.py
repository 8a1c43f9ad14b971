"""A detached job's record and its state machine (pure: data in, data out).

The supervisor writes the record as ``job.json`` in the job's directory on its host; ``jobs``,
``logs``, ``stop`` and ``wait`` read it back. States::

    starting --(every instance running)--> running --(the job ended)--> succeeded | failed | stopped
    starting | running, and the supervisor gone without a word ------> lost

``stopped`` is an interrupted job (``poprun-py stop``, a signal to the supervisor): exit 130.

Example:

    >>> r = JobRecord("c-20261201-120000-ab12", hosts=("h1", "h2"), backend="ssh", created=0.0)
    >>> r = running(r, attempt=0, now=1.0)
    >>> r.state, r.attempts, r.active
    (<JobState.RUNNING: 'running'>, 1, True)
    >>> ended(r, 7, "instance 1 on h2 failed (exit code 7)", interrupted=False, now=2.0).state
    <JobState.FAILED: 'failed'>
    >>> f"{observed(r, supervisor_alive=False).state}"  # its text, as written in job.json
    'lost'
    >>> check_job_id("c-1;rm")
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: bad job id 'c-1;rm': a job id is letters, digits, '.', '_' and '-'
"""

from __future__ import annotations

import enum
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from poprun_py.errors import EXIT_INTERRUPTED, UsageError


class JobState(enum.StrEnum):
    """A detached job's state; its value is the text in ``job.json`` and printed (as before)."""

    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @classmethod
    def _missing_(cls, value: object) -> JobState | None:
        """A state this version does not know (a newer poprun-py's record) is kept as its
        text, so that ``jobs`` still lists the job, as it did when states were strings."""
        if not isinstance(value, str):
            return None
        member = str.__new__(cls, value)
        member._name_, member._value_ = value.upper(), value
        return member

    def __reduce_ex__(self, protocol: object) -> tuple[type[JobState], tuple[str]]:
        """Copied and pickled by value (``dataclasses.asdict`` deep-copies it), not by name as
        Python 3.11.2's Enum does, which a kept unknown state does not have."""
        return type(self), (self._value_,)


ACTIVE = (JobState.STARTING, JobState.RUNNING)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


@dataclass(frozen=True)
class JobRecord:
    """What is known of one detached job (``job.json``)."""

    id: str
    hosts: tuple[str, ...] = ()
    backend: str = ""
    created: float = 0.0  # wall clock, as every time here
    state: JobState = JobState.STARTING
    supervisor: str = "localhost"  # the host the supervisor runs on (its plan name)
    job_dir: str = ""  # on the supervisor's host
    pid: int | None = None
    pid_start: str | None = None  # /proc/PID/stat field 22: a reused pid is not the supervisor
    instances: tuple[str, ...] = ()  # instance index -> its host
    attempts: int = 0
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str = ""
    hang: dict[str, Any] | None = None  # the last hang's verdict (core/stacks.Hang.to_json)
    options: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:  # job.json holds the state's text
        object.__setattr__(self, "state", JobState(self.state))

    @property
    def active(self) -> bool:
        """True while the job may still run (starting or running)."""
        return self.state in ACTIVE


def new_job_id(cluster: str, now: float | None = None, token: str | None = None) -> str:
    """``CLUSTER-YYYYmmdd-HHMMSS-XXXX``: sortable by time, unique by a random token."""
    import secrets

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    name = re.sub(r"[^A-Za-z0-9._-]", "-", cluster).strip("-.") or "job"
    return check_job_id(f"{name[:64]}-{stamp}-{token or secrets.token_hex(2)}")


def check_job_id(text: str) -> str:
    """``text`` if it can be a job id (it names a directory and travels in commands)."""
    if not _ID.match(text):
        raise UsageError(f"bad job id {text!r}: a job id is letters, digits, '.', '_' and '-'")
    return text


def running(record: JobRecord, attempt: int, now: float | None = None) -> JobRecord:
    """Every instance of attempt ``attempt`` (0 first) is running."""
    at = time.time() if now is None else now
    return replace(
        record, state=JobState.RUNNING, attempts=attempt + 1, started=record.started or at
    )


def ended(
    record: JobRecord, exit_code: int, reason: str, *, interrupted: bool, now: float | None = None
) -> JobRecord:
    """The job is over: succeeded (0), stopped (interrupted) or failed (any other code)."""
    if exit_code == 0:
        state = JobState.SUCCEEDED
    elif interrupted or exit_code == EXIT_INTERRUPTED:
        state = JobState.STOPPED
    else:
        state = JobState.FAILED
    at = time.time() if now is None else now
    return replace(record, state=state, exit_code=exit_code, reason=reason, ended=at)


def observed(record: JobRecord, *, supervisor_alive: bool) -> JobRecord:
    """The record as it stands: an active job whose supervisor is gone is ``lost``."""
    if record.active and not supervisor_alive:
        return replace(
            record, state=JobState.LOST, reason=record.reason or "its supervisor is gone"
        )
    return record


def to_json(record: JobRecord) -> str:
    """The record as ``job.json`` text (``hang`` only when a hang was recorded: a record without
    one is written as before it existed)."""
    data = asdict(record)
    if data["hang"] is None:
        del data["hang"]
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def from_json(text: str | dict[str, Any]) -> JobRecord:
    """A record from ``job.json`` text (or its parsed object); unknown keys are ignored."""
    data = json.loads(text) if isinstance(text, str) else dict(text)
    known = {f.name for f in fields(JobRecord)}
    values = {k: v for k, v in data.items() if k in known}
    for name in ("hosts", "instances"):
        values[name] = tuple(values.get(name) or ())
    return JobRecord(**values)


def summary_row(
    record: JobRecord, fold: Callable[[Sequence[str]], str] = ",".join
) -> tuple[str, ...]:
    """One line of ``poprun-py jobs``: id, state, hosts (``fold``-ed), start, attempts, code."""
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started or record.created))
    code = "" if record.exit_code is None else str(record.exit_code)
    return (record.id, record.state, fold(record.hosts), start, str(record.attempts), code)


def log_locations(record: JobRecord) -> dict[str, str]:
    """Where the job's output is on its supervisor's host: ``output.log`` (everything, tagged
    as an attached launch prints it) and the per-instance logs' directory."""
    logs = record.options.get("output_dir") or f"{record.job_dir}/logs"
    return {
        "job_dir": record.job_dir,
        "output_log": f"{record.job_dir}/output.log",
        "instance_logs": logs,
    }
