"""Where a detached job's supervisor lives, and the one way to talk to it: a :class:`JobHost`.

:class:`LocalJobHost` is this machine: :mod:`~poprun_py.hostside.hostops`'s functions are called
in-process and the supervisor is this same interpreter, started in a session of its own.
:class:`RemoteJobHost` is one SSH connection: each operation runs ``hostops``'s source with the
host's ``python3 -S`` on a channel of its own (:mod:`poprun_py.hostside.bundle`, as the agent
is started: nothing to install for ``jobs``, ``logs``, ``stop`` and ``wait``), and the
supervisor is ``python -m poprun_py supervise ID`` of this interpreter's path there (else
``python3``). Either way the supervisor reads its job record on stdin, the values of ``--env
NAME`` secrets arrive in its environment (over the channel's stdin for a remote host:
:func:`poprun_py.ssh.commands.env_block`), and it answers on stdout once every instance runs
(:data:`READY`), or fails with one line on stderr and its exit code.

Example::

    with remote_job_host(host_spec, ssh_settings) as host:
        host.call("list")                     # every job record there, each with "alive"
        host.follow("c-20261201-1200-ab12", "output.log", True, sys.stdout.buffer.write)

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> source = payload("hostops").source  # what a host's python3 -S runs for jobs/logs/stop
    >>> b"from poprun_py" in source, READY
    (False, 'poprun-py-supervisor: running')
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from poprun_py.errors import BackendError, PoprunError, PreflightError
from poprun_py.hostside import hostops
from poprun_py.hostside.bundle import over_stdin, payload

if TYPE_CHECKING:
    from poprun_py.core.spec import HostSpec
    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.settings import SshSettings

READY = "poprun-py-supervisor: running"
"""The supervisor's one line on stdout once every instance of its job runs."""
SUPERVISOR_START = (
    'if [ -x "$1" ]; then p=$1; else p=python3; fi; exec "$p" -m poprun_py supervise "$2"'
)
"""Runs the supervisor with this interpreter's path where it exists there, else ``python3``
(no separate probe: one interpreter start; a missing poprun-py is its one line)."""
NOT_INSTALLED = "No module named poprun_py"
Write = Callable[[bytes], None]


class JobHost(Protocol):
    """A supervisor's host: its jobs' records and files, and where new supervisors start."""

    name: str

    def call(self, op: str, *args: str) -> Any:
        """A :mod:`~poprun_py.hostside.hostops` operation's JSON answer (None: no such job)."""
        ...

    def follow(self, job_id: str, name: str, keep: bool, write: Write) -> bool:
        """``write`` the job file's bytes (following it with ``keep``); False: no such job."""
        ...

    def start_supervisor(self, job_id: str, record: str, env: Mapping[str, str]) -> str:
        """Start the job's supervisor; return once it says every instance runs: the job's
        directory there."""
        ...


class LocalJobHost:
    """This machine."""

    name = "localhost"

    def call(self, op: str, *args: str) -> Any:
        """Run the operation in-process."""
        root = local_root()
        if op == "list":
            return hostops.list_jobs(root)
        fn = {"show": hostops.show, "wait": hostops.wait}.get(op)
        if fn is not None:
            return fn(root, args[0])
        if op == "stop":
            return hostops.stop(root, args[0], float(args[1]))
        if op == "prune":
            return hostops.prune(root, float(args[0]))
        raise ValueError(f"unknown operation {op!r}")

    def follow(self, job_id: str, name: str, keep: bool, write: Write) -> bool:
        """Read (and follow) the file in-process."""
        return hostops.follow(local_root(), job_id, name, keep, write)

    def start_supervisor(self, job_id: str, record: str, env: Mapping[str, str]) -> str:
        """This interpreter, ``-m poprun_py supervise``, in a session of its own."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "poprun_py", "supervise", job_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
            start_new_session=True,
        )
        out, err = proc.communicate(record.encode())
        return _check_started(self.name, proc.returncode, out.decode(), err.decode())


class RemoteJobHost:
    """One host over one SSH connection."""

    def __init__(self, conn: Connection):
        self.conn, self.name = conn, conn.name

    def call(self, op: str, *args: str) -> Any:
        """Run the operation there; its JSON answer."""
        result = self.conn.run(over_stdin(op, *args), stdin=payload("hostops").data)
        if result.exit_code == hostops.NO_SUCH_JOB:
            return None
        if result.exit_code == hostops.UNSAFE_ROOT:
            raise _unsafe(self.name, result.stderr.strip().removeprefix("poprun-py: "))
        if result.exit_code != 0:
            raise BackendError(f"{self.name}: {op} failed: {result.stderr.strip()[-300:]}")
        return json.loads(result.stdout)

    def follow(self, job_id: str, name: str, keep: bool, write: Write) -> bool:
        """Stream the file from there; a Ctrl-C here stops the reading there, not the job."""

        def on_output(stream: str, data: bytes) -> None:
            if stream == "stdout":
                write(data)

        cancel = threading.Event()
        argv = over_stdin("follow", job_id, name, "1" if keep else "0")
        try:
            result = self.conn.run(
                argv, stdin=payload("hostops").data, on_output=on_output, cancel=cancel
            )
        except KeyboardInterrupt:
            cancel.set()
            raise
        return result.exit_code != hostops.NO_SUCH_JOB

    def start_supervisor(self, job_id: str, record: str, env: Mapping[str, str]) -> str:
        """The first poprun-py there (this interpreter's path, else ``python3``)."""
        argv = ["sh", "-c", SUPERVISOR_START, "poprun-py-supervise", sys.executable, job_id]
        result = self.conn.run(argv, stdin=record.encode(), env=dict(env) or None)
        return _check_started(self.name, result.exit_code, result.stdout, result.stderr)


def local_root() -> str:
    """This machine's root of detached jobs, checked (PreflightError, exit 3, when another
    user could tamper with it)."""
    from poprun_py.hostside.private import UnsafePath

    try:
        return hostops.checked_root(hostops.jobs_root())
    except UnsafePath as exc:
        raise _unsafe("localhost", str(exc)) from None


def _unsafe(host: str, why: str) -> PreflightError:
    from poprun_py.errors import Fault

    return PreflightError([Fault(host, "job root", why)])


def _check_started(host: str, code: int, out: str, err: str) -> str:
    """The job's directory once the supervisor said it runs; otherwise its one line and exit
    code become an error."""
    for line in out.splitlines():
        if code == 0 and line.startswith(READY):
            return line[len(READY) :].strip()
    lines = [line for line in err.splitlines() if line.strip()]
    message = lines[-1] if lines else f"the supervisor on {host} ended (exit code {code})"
    message = message.removeprefix("poprun-py: error: ").removeprefix("poprun-py: ")
    if code == 127 or NOT_INSTALLED in err:
        from poprun_py.errors import Fault

        if NOT_INSTALLED in err:
            message = (
                f"{message}: install poprun-py there (the same path as here, or for python3) "
                "to supervise detached jobs on it"
            )
        raise PreflightError([Fault(host, "supervisor", message)])
    error = PoprunError(message)
    error.exit_code = code or 1
    raise error


@contextlib.contextmanager
def remote_job_host(host: HostSpec, settings: SshSettings) -> Iterator[RemoteJobHost]:
    """One fresh connection to ``host``; a host that cannot be reached is a PreflightError."""
    from poprun_py.ssh.pool import ConnectionPool

    with ConnectionPool([host], settings) as pool:
        conn = pool.open_all()[host.name]
        yield RemoteJobHost(conn)
