"""What runs on a detached job's supervisor host for ``jobs``, ``logs``, ``stop`` and ``wait``.

Standard library only: for a remote job this module's source is run there by the host's
``python3 -S`` over one SSH channel (:func:`poprun_py.jobs.place.host_script`), as the agent
is; for a job on this machine its functions are called in-process. Every job lives in
``jobs_root()/ID`` (``job.json``, ``output.log``, ``logs/instance-N.log``); a job is alive
while its supervisor's pid exists with the start time the record names (a reused pid is not it).

Operations (``python3 -S hostops.py OP ARGS``; JSON on stdout, exit 3 for an unknown job):

- ``list``: every job's record, each with ``alive``;
- ``show ID``: one job's record;
- ``follow ID FILE 0|1``: the file's bytes; with 1, until the job has ended and all is read;
- ``wait ID``: block until the supervisor is gone, then the record;
- ``stop ID GRACE``: SIGTERM to the supervisor (which stops every instance: TERM, KILL after
  the grace period), wait for it to end, then the record. Stopping an ended job does nothing;
- ``prune AGE``: remove the directory of every ended job that ended at least AGE seconds ago;
  the ids removed.

The root is this user's job root (:func:`poprun_py.hostside.private.job_root`, inlined when
this module ships): one that another user could tamper with is refused (exit
:data:`UNSAFE_ROOT`, one line on stderr), and a ``job.json`` that is not this user's is no job.

Example:

    >>> import tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> list_jobs(root)
    []
    >>> show(root, "nope") is None
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, BinaryIO

from poprun_py.hostside.identity import read_stat  # inlined (hostops ships alone): bundle
from poprun_py.hostside.private import (  # inlined (hostops ships alone): bundle
    UnsafePath,
    job_root,
    private_dir,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    Record = dict[str, Any]
    Write = Callable[[bytes], None]
NO_SUCH_JOB = 3
UNSAFE_ROOT = 4
POLL = 0.1
STOP_MARGIN = 15.0  # beyond the grace period, before the supervisor itself is killed


def jobs_root() -> str:
    """Where this user's detached jobs live on this host (under the job root: never
    ``$XDG_RUNTIME_DIR``, which goes at logout while a detached job goes on)."""
    return os.path.join(job_root(), "jobs", "detached")


def checked_root(root: str) -> str:
    """``root``, checked: UnsafePath when another user could tamper with it or with the part of
    the way to it that exists (nothing is made)."""
    there = root
    while not os.path.lexists(there) and os.path.dirname(there) != there:
        there = os.path.dirname(there)
    private_dir(there)
    return root


def pid_start(pid: int) -> str | None:
    """Process ``pid``'s start time (:func:`~poprun_py.hostside.identity.read_stat`), as text;
    None when the process is gone or a zombie."""
    stat = read_stat(pid)
    if stat is None or stat[4] in ("Z", "X"):
        return None  # a zombie has ended: it only waits to be reaped
    return str(stat[3])


def alive(record: Record) -> bool:
    """True while the record's supervisor runs."""
    pid = record.get("pid")
    if not pid:
        return record.get("state") == "starting" and _young(record)
    start = pid_start(pid)
    return start is not None and start == record.get("pid_start")


def _young(record: Record) -> bool:
    """A record without a pid yet: its supervisor is starting (for at most a minute)."""
    return time.time() - float(record.get("created") or 0) < 60


def load(root: str, job_id: str) -> Record | None:
    """The job's record (a dict with ``alive``), or None."""
    path = os.path.join(root, job_id, "job.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, encoding="utf-8") as handle:
            if os.fstat(fd).st_uid != os.geteuid():
                return None  # not written by this user's supervisor: no job of ours
            record: Record = json.load(handle)
    except (OSError, ValueError):
        return None
    record["alive"] = alive(record)
    return record


def list_jobs(root: str) -> list[Record]:
    """Every job's record under ``root``, oldest first."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = (load(root, name) for name in names)
    return sorted((r for r in found if r is not None), key=lambda r: r.get("created") or 0)


def show(root: str, job_id: str) -> Record | None:
    """One job's record, or None."""
    return load(root, job_id)


def follow(root: str, job_id: str, name: str, keep_following: bool, write: Write) -> bool:
    """``write`` the job file ``name``'s bytes; with ``keep_following``, until the job has
    ended and everything it wrote is read. False for an unknown job."""
    if load(root, job_id) is None:
        return False
    path = os.path.join(root, job_id, name)
    handle: BinaryIO | None = None
    try:
        while True:
            handle = handle or _open(path)
            chunk = handle.read(65536) if handle else b""
            if chunk:
                write(chunk)
                continue
            if not keep_following or _abandoned():
                return True
            record = load(root, job_id)
            if record is None or not record["alive"]:
                rest = handle.read() if handle else b""
                if rest:
                    write(rest)
                return True
            time.sleep(POLL)
    finally:
        if handle:
            handle.close()


def _open(path: str) -> BinaryIO | None:
    try:
        return open(path, "rb")
    except OSError:
        return None


def wait(root: str, job_id: str) -> Record | None:
    """Block until the job's supervisor is gone; its record (None: no such job)."""
    record = load(root, job_id)
    while record is not None and record["alive"] and not _abandoned():
        time.sleep(POLL)
        record = load(root, job_id)
    return record


_PARENT = os.getppid()


def _abandoned() -> bool:
    """True once whoever started this process is gone (the SSH session of a client that was
    interrupted): a follow or a wait then ends instead of lingering until the job does."""
    return __name__ == "__main__" and os.getppid() != _PARENT


def stop(root: str, job_id: str, grace: float) -> Record | None:
    """Stop the job (see the module docstring); its record afterwards (None: no such job)."""
    record = load(root, job_id)
    if record is None or not record["alive"] or not record.get("pid"):
        return record
    _signal(record["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace + STOP_MARGIN
    while record is not None and record["alive"] and time.monotonic() < deadline:
        time.sleep(POLL)
        record = load(root, job_id)
    if record is not None and record["alive"]:
        _signal(record["pid"], signal.SIGKILL)  # last resort: it ignored SIGTERM too long
        record = wait(root, job_id)
    return record


def prune(root: str, age: float, now: float | None = None) -> list[str]:
    """Remove the directory of every job that has ended (its supervisor gone) at least
    ``age`` seconds ago; the ids removed, oldest first."""
    import shutil

    at = time.time() if now is None else now
    removed = []
    for record in list_jobs(root):
        name = str(record.get("id"))
        path = os.path.join(root, name)
        if record["alive"] or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            last = float(record.get("ended") or os.stat(os.path.join(path, "job.json")).st_mtime)
        except (OSError, TypeError, ValueError):
            continue
        if at - last >= age:
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(name)
    return removed


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def main(argv: list[str]) -> int:
    """Run one operation (see the module docstring); the process's exit code."""
    op, args, root = argv[0], argv[1:], jobs_root()
    out = sys.stdout.buffer
    result: Any
    try:
        checked_root(root)
    except UnsafePath as exc:
        sys.stderr.write(f"poprun-py: {exc}\n")
        return UNSAFE_ROOT
    if op == "list":
        result = list_jobs(root)
    elif op == "follow":
        found = follow(root, args[0], args[1], args[2] == "1", _writer(out))
        return 0 if found else NO_SUCH_JOB
    elif op == "show":
        result = show(root, args[0])
    elif op == "wait":
        result = wait(root, args[0])
    elif op == "stop":
        result = stop(root, args[0], float(args[1]))
    elif op == "prune":
        result = prune(root, float(args[0]))
    else:
        sys.stderr.write(f"poprun-py hostops: unknown operation {op!r}\n")
        return 2
    if result is None:
        return NO_SUCH_JOB
    out.write(json.dumps(result).encode() + b"\n")
    out.flush()
    return 0


def _writer(out: BinaryIO) -> Write:
    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    return write


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
