"""A detached job's supervisor: it detaches itself from the client, runs the job, records it.

``python -m poprun_py supervise ID`` reads the job's record (:mod:`~poprun_py.jobs.record`)
on stdin, makes the job's directory (``hostops.jobs_root()/ID``, mode 0700, under a job root
checked to be this user's: :mod:`poprun_py.hostside.private`) and forks. The
child starts a session of its own (no terminal, no SIGHUP from the client's end), points its
stdin at /dev/null and its stdout and stderr at ``output.log`` -- so that file holds exactly
what an attached launch prints, tagged the same way -- and runs the job with every rule of an
attached launch (fail-fast, root cause, ``--timeout``, ``--hang-timeout``, ``--max-restarts``).
The parent stays until the child says, through a pipe, that every instance runs (it then
prints :data:`~poprun_py.jobs.place.READY` and exits 0) or that the job could not start (its
one line on stderr, its exit code); then the client's channel closes and the job goes on alone.

SIGTERM (``poprun-py stop``) stops the job as Ctrl-C stops an attached one: TERM to every
instance, KILL after the grace period, state ``stopped``, exit 130.

Example::

    def job(recorder: Recorder) -> None:          # runs in the detached child
        launch(prep, settings_with(on_running=recorder.running))
        recorder.ended(0, "", interrupted=False)

    code = detach_and_run("c-20261201-120000-ab12", job)   # in the parent: 0 once running
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.hostside import hostops, private
from poprun_py.jobs.place import READY
from poprun_py.jobs.record import JobRecord, check_job_id, ended, from_json, running, to_json
from poprun_py.jobs.registry import write_private

if TYPE_CHECKING:
    from poprun_py.prepare.job import LaunchOptions, Prepared

NOT_STARTED = 1


class Recorder:
    """The child's side: keeps ``job.json`` current and answers the waiting parent once."""

    def __init__(self, job_dir: Path, record: JobRecord, answer_fd: int):
        self.job_dir, self.record, self._fd = job_dir, record, answer_fd

    def write(self) -> None:
        """Replace ``job.json`` atomically (mode 0600)."""
        write_private(self.job_dir / "job.json", to_json(self.record))

    def running(self, attempt: int) -> None:
        """Every instance of ``attempt`` runs: record it; the first time, free the client."""
        self.record = running(self.record, attempt)
        self.write()
        self._answer(b"running\n")

    def ended(self, code: int, reason: str, *, interrupted: bool) -> None:
        """The job is over; a client still waiting hears why it did not start. The last
        hang's verdict, if one was written to the logs, goes into the record."""
        self.record = ended(self.record, code, reason, interrupted=interrupted)
        self.record = replace(self.record, hang=self._last_hang())
        self.write()
        self._answer(f"error {code} {reason}".encode())

    def _last_hang(self) -> dict[str, Any] | None:
        """The verdict of the last attempt that hung (``hang*.json`` in the logs), or None."""
        logs = Path(self.record.options.get("output_dir") or self.job_dir / "logs")
        mine = [p for p in logs.glob("hang*.json") if p.stat().st_mtime >= self.record.created]
        found = sorted(mine, key=lambda p: p.stat().st_mtime)  # not an earlier job's, in -o
        if not found:
            return None
        try:
            verdict: dict[str, Any] = json.loads(found[-1].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return verdict

    def _answer(self, message: bytes) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self._fd, message)
            os.close(self._fd)
        self._fd = -1


def detach_and_run(job_id: str, job: Callable[[Recorder], None]) -> int:
    """Read the record on stdin, fork; the child runs ``job`` detached and never returns
    (``os._exit``), the parent returns the exit code for the client (0: running)."""
    check_job_id(job_id)
    record = from_json(sys.stdin.read())
    job_dir = _make_job_dir(job_id)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        return _answer_client(read_fd, job_dir)
    os.close(read_fd)
    _detach(job_dir / "output.log")
    me = os.getpid()
    record = replace(record, pid=me, pid_start=hostops.pid_start(me), job_dir=str(job_dir))
    recorder = Recorder(job_dir, record, write_fd)
    recorder.write()
    code = NOT_STARTED
    try:
        job(recorder)
        code = 0 if recorder.record.exit_code is None else recorder.record.exit_code
    except BaseException:  # a bug: its traceback goes to output.log, the record says failed
        import traceback

        traceback.print_exc()
    finally:
        if recorder.record.active:  # an exception nobody recorded
            recorder.ended(NOT_STARTED, "the supervisor failed", interrupted=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _make_job_dir(job_id: str) -> Path:
    """The job's new directory (a second supervisor for one id fails here); PreflightError
    (exit 3) when another user could tamper with the root."""
    from poprun_py.errors import Fault, PreflightError

    try:
        root = private.private_dir(hostops.jobs_root())
    except private.UnsafePath as exc:
        raise PreflightError([Fault(os.uname().nodename, "job root", str(exc))]) from None
    job_dir = Path(root) / job_id
    job_dir.mkdir(mode=0o700)
    return job_dir


def launch_options(recorder: Recorder) -> LaunchOptions:
    """The launch's options as the client resolved them, for planning the job on this host:
    in the client's working directory (when it exists here), with the cluster spec at its
    path, or else the copy the record carries (written into the job's directory)."""
    from poprun_py.prepare.job import LaunchOptions

    extra = recorder.record.options
    values = dict(extra.get("launch") or {})
    for name in ("program", "inputs", "env"):
        values[name] = tuple(values.get(name) or ())
    values["cluster"] = spec_here(recorder, values.get("cluster"), "cluster")
    workdir = values.get("workdir")
    if workdir and os.path.isdir(workdir):
        os.chdir(workdir)
    return LaunchOptions(**values)


def prepared(recorder: Recorder, logs: str) -> tuple[Prepared, list[str]]:
    """The job planned here from the client's options; with ``--check`` and spares, with the
    client's check's choices made again (:func:`~poprun_py.launch.check.replay`:
    ``plan-check.json`` in ``logs``, a spare checked before a restart uses it, as attached) and
    the summary's lines naming the swaps."""
    from poprun_py.launch.check import replay
    from poprun_py.prepare.job import prepare

    prep = prepare(launch_options(recorder))
    choices = recorder.record.options.get("check")
    if choices is None:
        return prep, []
    swapped = replay(prep, choices)
    return swapped.prep, swapped.keep(logs)


def spec_here(recorder: Recorder, path: str | None, key: str) -> str | None:
    """A cluster spec the client named (``key``: ``cluster`` or ``down``): its path when it
    exists on this host, else the copy of its text the record carries, written into the job's
    directory (mode 0600)."""
    text = recorder.record.options.get(f"{key}_text")
    if not path or os.path.isfile(path) or text is None:
        return path
    copy = recorder.job_dir / f"{key}.yaml"
    if not copy.exists():
        private.write_private(str(copy), text)
    return str(copy)


def _detach(log: Path) -> None:
    """A session of its own; stdin from /dev/null, stdout and stderr to ``log``."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    out = private.open_private(str(log))
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


def _answer_client(read_fd: int, job_dir: Path) -> int:
    """Wait for the child's word; print it for the client; its exit code."""
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    answer = b"".join(chunks).decode("utf-8", "replace")
    if answer.startswith("running"):
        sys.stdout.write(f"{READY} {job_dir}\n")
        sys.stdout.flush()
        return 0
    _, _, rest = answer.partition(" ")
    code_text, _, reason = rest.partition(" ")
    code = int(code_text) if code_text.isdigit() else NOT_STARTED
    sys.stderr.write(f"poprun-py: error: {reason or 'the supervisor ended before the job ran'}\n")
    sys.stderr.flush()
    return code or NOT_STARTED
