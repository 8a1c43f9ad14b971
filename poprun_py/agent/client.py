"""poprun-py's end of the per-host agent (:mod:`poprun_py.hostside.agent`): start it over a host's
connection, talk to it in the protocol of :mod:`poprun_py.hostside.protocol`, stage files through
it.

:class:`AgentPool` starts one agent per host on first use and answers ``map``/``run`` like a
:class:`~poprun_py.ssh.pool.ConnectionPool`, so preflight can run its checks through the
agents; the ssh backend then runs the job on the same agents
(:class:`~poprun_py.backends.ssh.SshBackend`) and the mpirun backend starts Open MPI's daemons
through them (:mod:`poprun_py.agent.relay`). A whole launch costs one login session per host.
:class:`AgentLink` is one host's agent during a job: records in, control lines out, when it was
last heard. Both talk to the agent over a :class:`~poprun_py.agent.stream.Stream` (a Paramiko
channel, or an OpenSSH client process), never to the transport beneath.

Example::

    with ConnectionPool(hosts, settings) as pool:
        agents = AgentPool(pool)
        report = preflight(agents, plan)        # checks run by the agents
        stage_job(agents, job)                  # the job's files, through the same agents

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.hostside.bundle import payload
    >>> source = payload("agent").source  # what travels to a host, with its compiled code
    >>> b"from poprun_py" in source, b"def bound(" in source
    (False, True)
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from poprun_py.agent.stream import Stream
from poprun_py.core.result import HOST_TIMEOUT
from poprun_py.errors import Fault, PreflightError
from poprun_py.hostside import protocol as P
from poprun_py.hostside.bundle import over_stdin, warm_up
from poprun_py.hostside.supervision import readable

if TYPE_CHECKING:
    from poprun_py.core.spec import HostSpec
    from poprun_py.render.job import RenderedJob
    from poprun_py.ssh.connection import Connection, RemoteResult
    from poprun_py.ssh.errors import TransportError
    from poprun_py.ssh.hostresult import HostResult
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import SshSettings

T = TypeVar("T")
HEARTBEAT = 0.5  # both ways: seconds of silence after which a side says "h"
LIVENESS = HOST_TIMEOUT  # a host (or poprun-py, for the agent) silent this long is gone
LATE = 1.0  # a look at a host this much later than due: poprun-py was not listening meanwhile
PAUSE_WAIT = 2.0  # on Ctrl-Z, how long the agents' "pause" may take before poprun-py stops
KILL_WAIT = 3.0  # after SIGKILL, how long an agent has to report before its host is lost
START_TIMEOUT = 30.0  # until its first word: a login shell on a loaded host can take seconds


class AgentPool:
    """An agent on every host of a ConnectionPool, each started once on first use.

    ``map`` and ``hosts``/``settings`` are the pool's, but ``fn`` gets an
    :class:`AgentConnection`, whose ``run`` executes through the agent: preflight can run its
    checks here, and the ssh backend then runs the job on the same agents.
    """

    def __init__(self, pool: ConnectionPool, linger: bool = False):
        self.pool = pool
        # agents serve requests again after their job (the job directory's removal) where a
        # command would otherwise cost another login session (:attr:`Connection.logs_in`)
        self.linger = linger
        self._agents: dict[str, AgentConnection] = {}
        self._retired: list[AgentConnection] = []  # agents whose job was handed out
        self._lock = threading.Lock()
        # built while the connections are being made, before the first agent needs it
        threading.Thread(target=warm_up, args=("agent",), daemon=True, name="poprun-warm").start()

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        """The pool's hosts."""
        return self.pool.hosts

    @property
    def settings(self) -> SshSettings:
        """The pool's SSH settings."""
        return self.pool.settings

    @property
    def connections(self) -> Mapping[str, Connection]:
        """The pool's open connections."""
        return self.pool.connections

    def agent(self, conn: Connection) -> AgentConnection:
        """The agent on ``conn``'s host, started now if it is not running yet (or has ended:
        an agent exits after its job, and a restarted job starts a new one on the same
        connection)."""
        with self._lock:
            agent = self._agents.get(conn.name)
        if agent is not None and (agent.given_job or agent.exited()):
            with self._lock:  # an agent runs one job: a restarted job gets a new one
                self._retired.append(agent)
            agent.send_eof()  # one lingering after its job ends now
            agent = None
        if agent is None:
            agent = AgentConnection.start(conn, linger=self.linger and conn.logs_in)
            with self._lock:
                self._agents[conn.name] = agent
        return agent

    def agent_on(self, host: str) -> AgentConnection:
        """The agent on ``host``, over its open connection; ConnectionLost when it has none."""
        from poprun_py.ssh.errors import ConnectionLost

        conn = self.pool.connections.get(host)
        if conn is None:
            raise ConnectionLost(host, f"no open connection to host {host}")
        return self.agent(conn)

    def lingering(self, host: str) -> AgentConnection | None:
        """``host``'s agent if its job is over and it serves requests again (``linger``)."""
        with self._lock:
            agent = self._agents.get(host)
        return agent if agent is not None and agent.serves_after_job() else None

    def each(
        self,
        fn: Callable[[AgentConnection], T],
        hosts: Iterable[str] | None = None,
        *,
        connect: bool = False,
    ) -> dict[str, HostResult[T]]:
        """``fn`` on every host's agent in parallel (see ConnectionPool.each)."""
        return self.pool.each(lambda conn: fn(self.agent(conn)), hosts, connect=connect)

    def close(self, wait: float = 3.0) -> None:
        """End every agent: EOF on its stdin (it stops whatever is left and exits), wait up to
        ``wait`` seconds for all of them to have exited, then close the streams -- so nothing
        of poprun-py's is still running on any host when this returns."""
        with self._lock:
            agents, self._agents = [*self._retired, *self._agents.values()], {}
            self._retired = []
        for agent in agents:
            agent.send_eof()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(a.exited() for a in agents):
            time.sleep(0.01)
        for agent in agents:
            agent.close()


class AgentConnection:
    """One host's agent over a :class:`~poprun_py.agent.stream.Stream`; ``run`` works like
    :meth:`Connection.run` until the job."""

    def __init__(
        self, name: str, stream: Stream, failure: Callable[[], TransportError] | None = None
    ):
        self.name, self.stream = name, stream
        self.failure = failure  # why the transport failed, before the agent said a word
        self.buffer = b""
        self.answered = False
        self.given_job = False  # the agent got its job: it exits after it, never reused
        self.linger = False  # asked to serve requests after the job (and, once over, it does)
        self.job_over = False  # it said "d": its job is over
        self.start_allowance = 0.0  # started here (:meth:`start`): START_TIMEOUT to say a word
        self._requests = 0
        self._lock = threading.Lock()  # one request at a time per agent
        self._send_lock = threading.Lock()  # whole lines: heartbeats come from another thread

    @classmethod
    def start(cls, conn: Connection, linger: bool = False) -> AgentConnection:
        """Start the agent through ``conn``'s transport seam (:meth:`Connection.agent_stream`:
        a Paramiko channel, an ``ssh`` process, a joined node's socket) and send it its code;
        ``linger``: its job will ask it to serve requests after the job, until EOF."""
        stream = conn.agent_stream(over_stdin())
        failure = conn.agent_failure(stream)
        agent = cls(conn.name, stream, failure)
        agent.linger, agent.start_allowance = linger, START_TIMEOUT
        try:
            conn.send_program(stream, "agent")
        except OSError:  # the transport ended: it could not connect, or the host refused
            if failure is None:
                raise
            raise agent.lost() from None
        return agent

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> RemoteResult:
        """Run ``argv`` on the host through the agent and return its outcome."""
        from poprun_py.ssh.connection import RemoteResult
        from poprun_py.ssh.errors import RemoteTimeout

        started = time.monotonic()
        request = {
            "argv": list(argv),
            "env": dict(env or {}),
            "cwd": cwd,
            "timeout": timeout,
            "stdin": (stdin or b"").decode("utf-8", "surrogateescape"),
        }
        limit = None if timeout is None else timeout + max(5.0, timeout)
        reply = self.request(P.REQUEST_RUN, request, limit)
        if reply["timeout"]:
            what = " ".join(argv)
            raise RemoteTimeout(self.name, f"{self.name}: {what} timed out after {timeout:g} s")
        duration = time.monotonic() - started
        return RemoteResult(self.name, reply["code"], reply["stdout"], reply["stderr"], duration)

    def put(self, files: Sequence[Mapping[str, str]], timeout: float = START_TIMEOUT) -> str:
        """Write ``files`` (``path``, ``text``) on the host, mode 0600, through the agent;
        '' or what went wrong there."""
        reply = self.request(P.REQUEST_PUT, {"files": list(files)}, timeout)
        return str(reply.get("error") or "")

    def request(self, verb: bytes, body: dict[str, Any], wait: float | None) -> Any:
        """Send one request (numbered; one at a time) and wait up to ``wait`` seconds for the
        reply with its number: a late reply to an earlier request, given up on, is not this
        one's. Until the agent has said a word, :attr:`start_allowance` more: its start (a login,
        through a tree's gateway an ``ssh`` handshake too) is not the request's time.
        RemoteTimeout, or ConnectionLost when the agent ends first."""
        with self._lock:
            starting = 0.0 if self.answered else self.start_allowance
            deadline = None if wait is None else time.monotonic() + wait + starting
            self._requests += 1
            ident = self._requests
            try:
                self.send(verb + b" " + json.dumps({"id": ident, **body}).encode())
            except OSError:
                raise self.lost() from None
            return self._reply(ident, deadline)

    def send(self, line: bytes) -> None:
        """Send one line to the agent; OSError when its stream is broken."""
        with self._send_lock:
            self.given_job = self.given_job or line.startswith(P.JOB + b" ")
            self.stream.write(line + b"\n")

    def pending(self) -> bool:
        """True if data has arrived that nobody has read yet."""
        return self.stream.ready()

    def receive(self) -> tuple[bytes, bool]:
        """Whatever has arrived, and whether the stream has ended (and all of it is read)."""
        ended = self.stream.ended()  # first: once ended, every byte has arrived
        data = self.stream.read()
        self.answered = self.answered or bool(data)
        return data, ended and not self.stream.ready()

    def _reply(self, ident: int, deadline: float | None) -> Any:
        from poprun_py.ssh.errors import RemoteTimeout

        while True:
            while b"\n" in self.buffer:
                line, _, self.buffer = self.buffer.partition(b"\n")
                kind, _, body = line.partition(b" ")
                reply = _parsed(body) if kind == P.REPLY else None
                if reply is not None and reply.get("id") == ident:
                    return reply
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise RemoteTimeout(self.name, f"the agent on {self.name} did not answer")
            readable([self.stream], wait)
            data, ended = self.receive()
            self.buffer += data
            if ended and b"\n" not in self.buffer:
                raise self.lost()

    def lost(self) -> TransportError:
        """The error for a stream that ended: the transport's own failure when the agent never
        answered (over OpenSSH: ssh's refusal, typed), else ConnectionLost."""
        from poprun_py.ssh.errors import ConnectionLost

        if self.failure is not None and not self.answered:
            return self.failure()
        return ConnectionLost(self.name, self.why_ended())

    def why_ended(self) -> str:
        """A one-line reason why the agent's stream ended early."""
        said = self.stream.last_words()
        if said:
            return f"the agent on host {self.name} ended: {said}"
        return f"the connection to host {self.name} closed"

    def serves_after_job(self) -> bool:
        """True while the agent, its job over, still answers requests (``linger``)."""
        return self.linger and self.job_over and not self.exited()

    def send_eof(self) -> None:
        """Close our side of the agent's stdin: it stops whatever is left and exits."""
        self.stream.send_eof()

    def exited(self) -> bool:
        """True once the agent process has exited (or its stream is gone): its stdout reached
        EOF. (The exit status may come earlier: the agent runs in a session of its own.)"""
        return self.stream.ended()

    def close(self) -> None:
        """Close the stream (the agent sees EOF and stops whatever is left)."""
        self.stream.close()


def _parsed(body: bytes) -> dict[str, Any] | None:
    """A reply's JSON object; None for one cut short or garbled (no request's reply)."""
    try:
        reply = json.loads(body)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def stage_job(agents: AgentPool, job: RenderedJob) -> None:
    """Write ``job.files`` and each instance's shard file on its host, through the hosts'
    agents in parallel (for launchers such as mpirun, whose ranks read them): no new session.
    PreflightError (nothing started) naming every host where that failed."""
    hosts = sorted({c.host for c in job.instances})
    outcomes = agents.each(lambda a: a.put(host_files(job, a.name)), hosts, connect=True)
    faults = [
        Fault(host, "stage job files", str(why))
        for host, outcome in sorted(outcomes.items())
        if (why := outcome.fault or outcome.value)
    ]
    if faults:
        raise PreflightError(faults)


def host_files(job: RenderedJob, host: str) -> list[dict[str, str]]:
    """What the agent on ``host`` writes: ``job.files`` and the shard files of its instances."""
    files = [
        {"path": posixpath.join(job.job_dir, name), "text": text}
        for name, text in job.files.items()
    ]
    files += [
        {"path": posixpath.join(job.job_dir, c.shard_file), "text": c.shard_text}
        for c in job.instances
        if c.host == host and c.shard_file
    ]
    return files


def agent_header(
    run_id: str, host: str, timing: Timing, instances: list[dict[str, Any]], files: list[Any]
) -> dict[str, Any]:
    """An agent's job: its run id (per host: test hosts share one /proc), timings, files to
    write and instances (``index``, ``argv``, ``env``, ``cwd``; ``cpus``/``mems`` when bound)
    to start."""
    return {
        "run_id": f"{run_id}-{host}",
        "grace": timing.grace,
        "heartbeat": timing.heartbeat,
        "liveness": timing.liveness,
        "files": files,
        "instances": instances,
    }


@dataclass(frozen=True)
class Timing:
    grace: float
    heartbeat: float
    liveness: float
    start_timeout: float


class AgentLink:
    """One host's agent during the job: records in, control lines out, when last heard."""

    def __init__(self, host: str, indexes: Sequence[int]):
        self.host, self.indexes = host, tuple(indexes)
        self.agent: AgentConnection | None = None
        self.heard = self.looked = time.monotonic()
        self.heard_wall = time.time()
        self.done = False  # the agent said "d", or the host is lost

    def start(self, agent: AgentConnection, header: dict[str, Any]) -> None:
        """Hand the job to the agent (asked to linger after it if the pool wants that)."""
        agent.send(P.JOB + b" " + json.dumps({**header, "linger": agent.linger}).encode())
        self.agent = agent
        self.heard = self.looked = time.monotonic()
        self.heard_wall = time.time()
        with _LOCK:
            _WORKING.difference_update([link for link in _WORKING if link.done])
            _WORKING.add(self)

    def send(self, line: bytes) -> None:
        """Send one control line; a dead stream shows up as silence or EOF, not here. No
        heartbeat while poprun-py is pausing (:func:`pausing`): it would end the agents' wait."""
        if line == P.HEARTBEAT_LINE and PAUSED.is_set():
            return
        if self.agent is not None and not self.done:
            with contextlib.suppress(OSError):
                self.agent.send(line)

    def silence(self, now: float) -> float:
        """Seconds the host has been silent while poprun-py listened: a look much later than
        due (poprun-py was stopped -- SIGSTOP, Ctrl-Z -- or held up) gives the host back the
        time nobody listened, since its records may be waiting unread."""
        gap = now - self.looked
        if gap > LATE:
            self.heard = min(now, self.heard + gap)
        self.looked = now
        return now - self.heard

    def receive(self) -> tuple[list[bytes], bool]:
        """Complete records received so far, and whether the stream has ended."""
        assert self.agent is not None
        data, ended = self.agent.receive()
        if data:
            self.heard, self.heard_wall = time.monotonic(), time.time()
        *records, self.agent.buffer = (self.agent.buffer + data).split(b"\n")
        for record in records:
            if record in (P.DONE, P.DONE_LINGERING):
                self.agent.job_over = True  # ``d linger``: it serves requests again; ``d``: exits
                self.agent.linger = self.agent.linger and record == P.DONE_LINGERING
        return records, ended

    def pending(self) -> bool:
        """True if the agent has said something not read yet (the host is alive)."""
        return self.agent is not None and self.agent.pending()

    def close(self) -> None:
        """Close the stream (the agent sees EOF and stops whatever is left) -- unless the
        agent lingers after its job: then its pool ends it (:meth:`AgentPool.close`)."""
        with _LOCK:
            _WORKING.discard(self)
        if self.agent is not None and not self.agent.serves_after_job():
            self.agent.close()

    def silence_limit(self, timing: Timing) -> float:
        """How long this host may stay silent: longer while its agent is still starting."""
        answered = self.agent is not None and self.agent.answered
        return timing.liveness if answered else timing.start_timeout

    def why_lost(self, silence: float | None = None) -> str:
        """A one-line reason for losing this host."""
        if silence is not None and not (self.agent and self.agent.answered):
            return f"the agent on host {self.host} did not start within {silence:.0f} s"
        if silence is not None:
            return f"host {self.host} stopped answering ({silence:.1f} s without a heartbeat)"
        assert self.agent is not None
        return self.agent.why_ended()


_LOCK = threading.Lock()
_WORKING: set[AgentLink] = set()  # the links whose agent has a job: told to wait on Ctrl-Z
PAUSED = threading.Event()  # set while poprun-py is stopping (Ctrl-Z) until it continues


class _Pausing:
    """How many :func:`pausing` are active, and the SIGTSTP handler they replaced."""

    depth = 0
    replaced: Any = None


@contextlib.contextmanager
def pausing() -> Iterator[None]:
    """While active (main thread only; nested use is counted), Ctrl-Z (SIGTSTP) of poprun-py
    first tells every agent running a job to wait (``pause``: its silence limit is off until
    poprun-py speaks again), then stops poprun-py as usual; on SIGCONT (``fg``, ``bg``) the
    heartbeats resume, and they end the agents' wait. The job runs on meanwhile. An
    uncatchable SIGSTOP is covered by the silence limit (``--host-timeout``) alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _Pausing.depth == 0:
        _Pausing.replaced = signal.signal(signal.SIGTSTP, _on_tstp)
    _Pausing.depth += 1
    try:
        yield
    finally:
        _Pausing.depth -= 1
        if _Pausing.depth == 0:
            replaced, _Pausing.replaced = _Pausing.replaced, None
            with contextlib.suppress(ValueError):  # left on another thread: nothing to undo
                signal.signal(signal.SIGTSTP, signal.SIG_DFL if replaced is None else replaced)


def _on_tstp(signum: int, frame: object) -> None:
    """Tell the agents to wait (from a thread: the code this handler interrupted may hold a
    stream's lock), stop for real, and carry on once continued."""
    PAUSED.set()
    told = threading.Event()

    def tell() -> None:
        try:
            with _LOCK:
                _WORKING.difference_update([link for link in _WORKING if link.done])
                links = list(_WORKING)
            for link in links:
                if link.agent is not None and not link.done:
                    with contextlib.suppress(Exception):
                        link.agent.send(P.PAUSE_LINE)
        finally:
            told.set()

    threading.Thread(target=tell, daemon=True, name="poprun-pause").start()
    told.wait(PAUSE_WAIT)
    try:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until SIGCONT
    finally:
        signal.signal(signal.SIGTSTP, _on_tstp)
        PAUSED.clear()
