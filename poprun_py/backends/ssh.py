"""The ssh backend: every host's instances run under one agent started over that host's connection.

Per host, one channel on the host's existing connection runs :mod:`poprun_py.agent.host`
(its source travels over stdin, so nothing is installed remotely). :class:`AgentPool` starts the
agents and can first run preflight's commands through them (it answers ``map``/``run`` like a
:class:`~poprun_py.ssh.transport.ConnectionPool`), so a whole launch -- preflight, staging, start --
costs one login session per host. The agent then gets the host's part of the job as one JSON
line on stdin -- shard files, ``job.files`` and every instance's argv, environment and cwd, so
no environment value (secrets included) is ever in an argv or in ``ps`` -- writes the files
(0600), starts each instance in its own process group, reports ``p IDX PID`` first, then
streams tagged output lines and each exit. For other launchers (mpirun), :func:`stage_job`
writes the job's files through the same agents (``put`` requests), and
:mod:`poprun_py.agent.relay` gives each agent Open MPI's daemon as its job.

The local backend's rules apply across hosts: the first instance to fail (or a host lost)
makes every agent SIGTERM its instances' groups, and SIGKILL after the grace period;
SIGINT/SIGTERM to poprun-py do the same (a second one SIGKILLs at once). Agents and poprun-py
send each other heartbeats: a host silent for ``liveness`` seconds (dead, or off the network)
is reported ``lost`` -- as the root cause, dated from when it was last heard -- and an agent
that stops hearing poprun-py (closed stdin, or silence) stops its instances by itself, so a
SIGKILLed poprun-py or a cut-off host leaves nothing running.

Example::

    with ConnectionPool(hosts, settings) as pool:
        agents = AgentPool(pool)
        report = preflight(agents, plan)        # checks run by the agents
        result = SshBackend(agents).run(job, RunOptions(output_dir=Path("logs")))
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import marshal
import os
import posixpath
import secrets
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from poprun_py.agent import host as remote_agent
from poprun_py.backends.base import InstanceResult, LaunchResult, RunOptions
from poprun_py.errors import Fault, PreflightError
from poprun_py.process.supervise import Output

if TYPE_CHECKING:
    import paramiko

    from poprun_py.core.spec import HostSpec
    from poprun_py.render.job import RenderedJob
    from poprun_py.ssh.transport import Connection, ConnectionPool, RemoteResult, SshSettings

T = TypeVar("T")
HEARTBEAT = 0.5  # both ways: seconds of silence after which a side says "h"
LIVENESS = 3.0  # a host (or poprun-py, for the agent) silent this long is gone
KILL_WAIT = 3.0  # after SIGKILL, how long an agent has to report before its host is lost
START_TIMEOUT = 30.0  # until its first word: a login shell on a loaded host can take seconds
AGENT_START = (
    "sh",
    "-c",
    'for p in /usr/bin/python3 python3; do if command -v "$p" >/dev/null 2>&1; then '
    'exec "$p" -S -c "$0" "$@"; fi; done; echo "poprun-py agent: no python3 on PATH" >&2; exit 127',
)
"""Runs the agent bootstrap with the host's python3 (the system one first: it starts fastest)."""
_INSTANCE_RECORDS = frozenset((b"p", b"o", b"e", b"x", b"k", b"f", b"n"))


class SshBackend:
    """Runs each host's instances over SSH; stops all of them on the first failure anywhere."""

    name = "ssh"

    def __init__(
        self,
        pool_or_settings: AgentPool | ConnectionPool | SshSettings,
        *,
        heartbeat: float = HEARTBEAT,
        liveness: float = LIVENESS,
        start_timeout: float = START_TIMEOUT,
    ):
        self._given = pool_or_settings
        self.heartbeat, self.liveness = heartbeat, liveness
        self.start_timeout = start_timeout

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Start (or reuse) every host's agent, supervise the job to the end, report all."""
        from poprun_py.ssh.transport import ConnectionPool

        given = self._given
        if isinstance(given, AgentPool):
            return self._run(given, job, options)
        if isinstance(given, ConnectionPool):
            return self._run(AgentPool(given), job, options)
        with ConnectionPool([h.spec for h in job.plan.hosts], given) as pool:
            return self._run(AgentPool(pool), job, options)

    def _run(self, agents: AgentPool, job: RenderedJob, options: RunOptions) -> LaunchResult:
        agents.pool.open_all()  # PreflightError naming every unreachable host: nothing started
        timing = Timing(options.grace_period, self.heartbeat, self.liveness, self.start_timeout)
        output = Output(options, {c.index: c.host for c in job.instances})
        try:
            with _Watch() as watch:
                return _Run(job, agents, output, timing, watch).run()
        finally:
            output.close()


class AgentPool:
    """An agent on every host of a ConnectionPool, each started once on first use.

    ``map`` and ``hosts``/``settings`` are the pool's, but ``fn`` gets an
    :class:`AgentConnection`, whose ``run`` executes through the agent: preflight can run its
    checks here, and the ssh backend then runs the job on the same agents.
    """

    def __init__(self, pool: ConnectionPool):
        self.pool = pool
        self._agents: dict[str, AgentConnection] = {}
        self._lock = threading.Lock()

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        """The pool's hosts."""
        return self.pool.hosts

    @property
    def settings(self) -> SshSettings:
        """The pool's SSH settings."""
        return self.pool.settings

    def agent(self, conn: Connection) -> AgentConnection:
        """The agent on ``conn``'s host, started now if it is not running yet."""
        with self._lock:
            agent = self._agents.get(conn.name)
        if agent is None:
            agent = AgentConnection.start(conn)
            with self._lock:
                self._agents[conn.name] = agent
        return agent

    def agent_on(self, host: str) -> AgentConnection:
        """The agent on ``host``, over its open connection; ConnectionLost when it has none."""
        from poprun_py.ssh.transport import ConnectionLost

        conn = self.pool.connections.get(host)
        if conn is None:
            raise ConnectionLost(host, f"no open connection to host {host}")
        return self.agent(conn)

    def map(
        self,
        fn: Callable[[AgentConnection], T],
        hosts: Iterable[str] | None = None,
        *,
        connect: bool = False,
    ) -> dict[str, T | BaseException]:
        """``fn`` on every host's agent in parallel (see ConnectionPool.map); every outcome."""
        return self.pool.map(lambda conn: fn(self.agent(conn)), hosts, connect=connect)

    def close(self, wait: float = 3.0) -> None:
        """End every agent: EOF on its stdin (it stops whatever is left and exits), wait up to
        ``wait`` seconds for all of them to have exited, then close the channels -- so nothing
        of poprun-py's is still running on any host when this returns."""
        with self._lock:
            agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            agent.send_eof()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(a.exited() for a in agents):
            time.sleep(0.01)
        for agent in agents:
            agent.close()


@functools.cache
def agent_payload() -> tuple[list[str], bytes]:
    """The bootstrap's arguments and what it reads from stdin: the agent compiled here (run as
    is by a host whose Python has this bytecode magic) and its source (compiled there if not)."""
    source = Path(remote_agent.__file__).read_bytes()
    code = marshal.dumps(compile(source, "poprun-agent", "exec"))
    return [str(len(source)), importlib.util.MAGIC_NUMBER.hex(), str(len(code))], code + source


class AgentConnection:
    """One host's agent channel; ``run`` works like :meth:`Connection.run` until the job."""

    def __init__(self, conn: Connection, channel: paramiko.Channel):
        self.conn, self.channel = conn, channel
        self.name = conn.name
        self.buffer = b""
        self.stderr = b""
        self.answered = False
        self._requests = 0
        self._lock = threading.Lock()  # one request at a time per agent
        self._send_lock = threading.Lock()  # whole lines: heartbeats come from another thread

    @classmethod
    def start(cls, conn: Connection) -> AgentConnection:
        """Start the agent on a new channel of ``conn`` and send it its source."""
        args, payload = agent_payload()
        channel = conn.start([*AGENT_START, remote_agent.BOOTSTRAP, *args])
        channel.sendall(payload)
        return cls(conn, channel)

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
        with self._lock:
            return self._run(argv, stdin, env, cwd, timeout)

    def _run(
        self,
        argv: Sequence[str],
        stdin: bytes | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
        timeout: float | None,
    ) -> RemoteResult:
        from poprun_py.ssh.transport import RemoteResult, RemoteTimeout

        started = time.monotonic()
        self._requests += 1
        request = {
            "id": self._requests,
            "argv": list(argv),
            "env": dict(env or {}),
            "cwd": cwd,
            "timeout": timeout,
            "stdin": (stdin or b"").decode("utf-8", "surrogateescape"),
        }
        self.send(b"run " + json.dumps(request).encode())
        limit = None if timeout is None else started + timeout + max(5.0, timeout)
        reply = json.loads(self._reply(limit))
        if reply["timeout"]:
            what = " ".join(argv)
            raise RemoteTimeout(self.name, f"{self.name}: {what} timed out after {timeout:g} s")
        duration = time.monotonic() - started
        return RemoteResult(self.name, reply["code"], reply["stdout"], reply["stderr"], duration)

    def put(self, files: Sequence[Mapping[str, str]], timeout: float = START_TIMEOUT) -> str:
        """Write ``files`` (``path``, ``text``) on the host, mode 0600, through the agent;
        '' or what went wrong there."""
        with self._lock:
            self._requests += 1
            request = {"id": self._requests, "files": list(files)}
            self.send(b"put " + json.dumps(request).encode())
            reply = json.loads(self._reply(time.monotonic() + timeout))
        return str(reply.get("error") or "")

    def send(self, line: bytes) -> None:
        """Send one line to the agent."""
        with self._send_lock:
            self.channel.sendall(line + b"\n")

    def pending(self) -> bool:
        """True if data has arrived that nobody has read yet."""
        return bool(self.channel.recv_ready() or self.channel.recv_stderr_ready())

    def receive(self) -> tuple[bytes, bool]:
        """Whatever has arrived (stderr kept aside), and whether the channel has ended."""
        channel, data = self.channel, b""
        while channel.recv_stderr_ready():
            self.stderr = (self.stderr + channel.recv_stderr(65536))[-4096:]
        while channel.recv_ready():
            data += channel.recv(65536)
        self.answered = self.answered or bool(data)
        ended = not channel.recv_ready() and bool(channel.eof_received or channel.closed)
        return data, ended

    def _reply(self, deadline: float | None) -> bytes:
        from poprun_py.ssh.transport import ConnectionLost, RemoteTimeout

        while True:
            while b"\n" in self.buffer:
                line, _, self.buffer = self.buffer.partition(b"\n")
                if line.startswith(b"R "):
                    return line[2:]
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise RemoteTimeout(self.name, f"the agent on {self.name} did not answer")
            select.select([self.channel], [], [], wait)
            data, ended = self.receive()
            self.buffer += data
            if ended and b"\n" not in self.buffer:
                raise ConnectionLost(self.name, self.why_ended())

    def why_ended(self) -> str:
        """A one-line reason why the agent's channel ended early."""
        said = self.stderr.decode("utf-8", "replace").strip().splitlines()
        if said:
            return f"the agent on host {self.name} ended: {said[-1]}"
        return f"the connection to host {self.name} closed"

    def send_eof(self) -> None:
        """Close our side of the agent's stdin: it stops whatever is left and exits."""
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()

    def exited(self) -> bool:
        """True once the agent process has exited (or its channel is gone): its stdout reached
        EOF. (The exit status may come earlier: the agent runs in a session of its own.)"""
        try:
            return bool(self.channel.closed or self.channel.eof_received)
        except Exception:  # a broken channel has nothing left to wait for
            return True

    def close(self) -> None:
        """Close the channel (the agent sees EOF and stops whatever is left)."""
        with contextlib.suppress(Exception):
            self.channel.close()


def stage_job(agents: AgentPool, job: RenderedJob) -> None:
    """Write ``job.files`` and each instance's shard file on its host, through the hosts'
    agents in parallel (for launchers such as mpirun, whose ranks read them): no new session.
    PreflightError (nothing started) naming every host where that failed."""
    hosts = sorted({c.host for c in job.instances})
    outcomes = agents.map(lambda a: a.put(host_files(job, a.name)), hosts, connect=True)
    faults = [
        Fault(host, "stage job files", str(outcome))
        for host, outcome in sorted(outcomes.items())
        if outcome
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
    write and instances (``index``, ``argv``, ``env``, ``cwd``) to start."""
    return {
        "run_id": f"{run_id}-{host}",
        "grace": timing.grace,
        "heartbeat": timing.heartbeat,
        "liveness": timing.liveness,
        "files": files,
        "instances": instances,
    }


def _host_header(job: RenderedJob, host: str, run_id: str, timing: Timing) -> dict[str, Any]:
    """The agent's job on ``host``: files to write and instances to start (pure)."""
    instances = [
        {"index": c.index, "argv": list(c.argv), "env": dict(c.env), "cwd": c.cwd}
        for c in job.instances
        if c.host == host
    ]
    return agent_header(run_id, host, timing, instances, host_files(job, host))


@dataclass(frozen=True)
class Timing:
    grace: float
    heartbeat: float
    liveness: float
    start_timeout: float


class _Watch:
    """SIGINT/SIGTERM counter with a wake-up pipe (handlers only on the main thread)."""

    def __init__(self) -> None:
        self.count = 0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Watch:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._on) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _on(self, signum: int, frame: object) -> None:
        self.count += 1
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"\0")


class AgentLink:
    """One host's agent during the job: records in, control lines out, when last heard."""

    def __init__(self, host: str, indexes: Sequence[int]):
        self.host, self.indexes = host, tuple(indexes)
        self.agent: AgentConnection | None = None
        self.heard = time.monotonic()
        self.heard_wall = time.time()
        self.done = False  # the agent said "d", or the host is lost

    def start(self, agent: AgentConnection, header: dict[str, Any]) -> None:
        """Hand the job to the agent."""
        agent.send(b"job " + json.dumps(header).encode())
        self.agent = agent
        self.heard, self.heard_wall = time.monotonic(), time.time()

    def send(self, line: bytes) -> None:
        """Send one control line; a dead channel shows up as silence or EOF, not here."""
        if self.agent is not None and not self.done:
            with contextlib.suppress(OSError, EOFError):
                self.agent.send(line)

    def receive(self) -> tuple[list[bytes], bool]:
        """Complete records received so far, and whether the channel has ended."""
        assert self.agent is not None
        data, ended = self.agent.receive()
        if data:
            self.heard, self.heard_wall = time.monotonic(), time.time()
        *records, self.agent.buffer = (self.agent.buffer + data).split(b"\n")
        return records, ended

    def pending(self) -> bool:
        """True if the agent has said something not read yet (the host is alive)."""
        return self.agent is not None and self.agent.pending()

    def close(self) -> None:
        """Close the channel (the agent sees EOF and stops whatever is left)."""
        if self.agent is not None:
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


class _Run:
    """One supervised run across hosts: start the agents, route records, apply the rules."""

    def __init__(
        self,
        job: RenderedJob,
        agents: AgentPool,
        output: Output,
        timing: Timing,
        watch: _Watch,
    ):
        self.job, self.agents, self.output = job, agents, output
        self.timing, self.watch = timing, watch
        self.run_id = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.hosts = {c.index: c.host for c in job.instances}
        by_host: dict[str, list[int]] = {}
        for c in job.instances:
            by_host.setdefault(c.host, []).append(c.index)
        self.links = {h: AgentLink(h, idx) for h, idx in by_host.items()}
        self.started: dict[int, float] = {}
        self.results: dict[int, InstanceResult] = {}
        self.sel = selectors.DefaultSelector()
        self.kill_at: float | None = None  # set when the stop begins
        self.lose_at: float | None = None  # set when SIGKILL was sent
        self.t0 = time.time()

    def run(self) -> LaunchResult:
        """Start every agent, loop until every host is done, return every instance's result."""
        self.sel.register(self.watch.wake_r, selectors.EVENT_READ, None)
        stop_beating = threading.Event()
        beater = threading.Thread(target=self.beat, args=(stop_beating,), daemon=True)
        beater.start()
        try:
            self.start_all()
            while not all(link.done for link in self.links.values()):
                for key, _ in self.sel.select(self.timeout()):
                    self.pump(key.data)
                self.tick(time.monotonic())
        finally:
            stop_beating.set()
            beater.join()
            self.close_links()
            self.sel.close()
        results = tuple(self.result(index) for index in sorted(self.hosts))
        return LaunchResult(results, self.watch.count > 0, time.time() - self.t0)

    def close_links(self, wait: float = 3.0) -> None:
        """End every host's agent: EOF on its stdin, then wait (together, at most ``wait``
        seconds) until each has exited -- its stdout closed -- before closing the channels, so
        no agent is still running on any host when the backend returns."""
        agents = [link.agent for link in self.links.values() if link.agent is not None]
        for agent in agents:
            agent.send_eof()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(a.exited() for a in agents):
            time.sleep(0.005)
        for link in self.links.values():
            link.close()

    def start_all(self) -> None:
        """Hand every host its job (starting agents not yet running) in parallel; a host
        whose agent cannot start is lost."""

        def start(agent: AgentConnection) -> None:
            link = self.links[agent.name]
            link.start(agent, _host_header(self.job, link.host, self.run_id, self.timing))

        outcomes = self.agents.map(start, list(self.links), connect=True)
        for host, link in self.links.items():
            failure = outcomes.get(host, None)
            if link.agent is None or isinstance(failure, BaseException):
                why = f"{failure}" if failure else "no connection"
                self.lose(link, f"cannot start the agent on host {host}: {why}")
            else:
                self.sel.register(link.agent.channel, selectors.EVENT_READ, link)

    def beat(self, stop: threading.Event) -> None:
        """Heartbeats to every agent, from a thread of their own: a main loop held up by a
        slow terminal must not make the agents think poprun-py is gone."""
        while not stop.wait(self.timing.heartbeat):
            self.send(b"h")

    def timeout(self) -> float:
        """Seconds until the next liveness check or stop deadline (at most one heartbeat)."""
        live = [link for link in self.links.values() if not link.done]
        times = [time.monotonic() + self.timing.heartbeat]
        times += [link.heard + link.silence_limit(self.timing) for link in live]
        times += [t for t in (self.kill_at, self.lose_at) if t is not None]
        return max(0.0, min(times) - time.monotonic())

    def pump(self, link: AgentLink | None) -> None:
        """Handle what one channel (or the signal pipe, for None) has to say."""
        if link is None:
            with contextlib.suppress(OSError):
                os.read(self.watch.wake_r, 1024)
            return
        records, ended = link.receive()
        for record in records:
            self.record(link, record)
        if ended and not link.done:
            self.lose(link, link.why_lost())

    def record(self, link: AgentLink, record: bytes) -> None:
        """Act on one agent record (see :mod:`poprun_py.agent.host`)."""
        kind, _, rest = record.partition(b" ")
        if kind == b"d":
            self.forget(link)
            return
        number, _, text = rest.partition(b" ")
        if kind not in _INSTANCE_RECORDS or not number.isdigit() or int(number) not in link.indexes:
            return  # a heartbeat, or noise
        index = int(number)
        if kind in (b"o", b"e"):
            self.output.emit(index, "stdout" if kind == b"o" else "stderr", text)
        elif kind == b"p":
            self.started[index] = time.time()
        elif kind in (b"x", b"k") and text.isdigit():
            self.exited(index, int(text), by_signal=kind == b"k")
        elif kind in (b"f", b"n"):
            detail = text.decode("utf-8", "replace")
            state, code = ("exited", 127) if kind == b"f" else ("not-started", None)
            self.finish(InstanceResult(index, link.host, code, None, state, detail=detail))

    def exited(self, index: int, value: int, by_signal: bool) -> None:
        """An instance ended; it is "stopped" if we had signalled it and it did not exit 0."""
        stopped = self.kill_at is not None and (by_signal or value != 0)
        self.finish(
            InstanceResult(
                index,
                self.hosts[index],
                exit_code=None if by_signal else value,
                signal=value if by_signal else None,
                state="stopped" if stopped else "exited",
            )
        )

    def finish(self, result: InstanceResult) -> None:
        """Record an outcome (with times); a failure stops everything."""
        now = time.time()
        ended = result.ended or now
        started = self.started.get(result.index, ended)
        self.results[result.index] = replace(result, started=started, ended=ended)
        if result.failed:
            self.stop()

    def lose(self, link: AgentLink, reason: str, when: float | None = None) -> None:
        """A host is gone: its unfinished instances are lost, dated when it was last heard
        (so a host that died is the root cause of the failures it caused elsewhere)."""
        self.forget(link)
        link.close()
        for index in link.indexes:
            if index not in self.results:
                lost = InstanceResult(index, link.host, state="lost", detail=reason)
                self.finish(replace(lost, ended=when or link.heard_wall))

    def forget(self, link: AgentLink) -> None:
        """The host is done: stop watching its channel."""
        link.done = True
        if link.agent is not None and link.agent.channel in self.sel.get_map():
            self.sel.unregister(link.agent.channel)

    def stop(self) -> None:
        """SIGTERM everywhere now; SIGKILL after the grace period."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.timing.grace
            self.send(b"term")

    def send(self, line: bytes) -> None:
        """Send a control line to every live agent."""
        for link in self.links.values():
            link.send(line)

    def tick(self, now: float) -> None:
        """Interrupts, liveness, and the SIGKILL and give-up deadlines."""
        if self.watch.count:
            self.stop()
        if self.watch.count > 1 and self.kill_at is not None:
            self.kill_at = min(self.kill_at, now)
        for link in self.links.values():
            silence = now - link.heard
            if not link.done and silence > link.silence_limit(self.timing) and not link.pending():
                self.lose(link, link.why_lost(silence))
        if self.kill_at is not None and now >= self.kill_at and self.lose_at is None:
            self.lose_at = now + KILL_WAIT
            self.send(b"kill")
        if self.lose_at is not None and now >= self.lose_at:
            now_wall = time.time()
            for link in self.links.values():
                if not link.done:
                    self.lose(link, f"host {link.host} did not report after SIGKILL", now_wall)

    def result(self, index: int) -> InstanceResult:
        """The outcome of one instance (lost if its agent never said)."""
        if index in self.results:
            return self.results[index]
        return InstanceResult(index, self.hosts[index], state="lost", detail="no report")
