"""The poprun-py end of :mod:`poprun_py.hostside.rsh_shim`: Open MPI's daemons start through the
agents.

A remote mpirun launch renders ``--mca plm_rsh_agent "/usr/bin/env <python> -S -I rsh_shim.py"``
(see :func:`poprun_py.hostside.rsh_shim.mpirun_args`). :class:`RshRelay` listens on a Unix socket
(mode 0600, in a private temporary directory) that mpirun's environment names to the shim as
``POPRUN_RSH_SOCKET`` -- never an argv, so ``--dry-run`` prints exactly what runs. Each shim
connection asks to run one command on one host: the relay maps the name Open MPI uses (the
hostfile's: a host's address, else its name) to that host's agent -- already started for
preflight, and already holding the job's files (:func:`~poprun_py.agent.client.stage_job`) -- and
hands it a job of one instance, ``/bin/sh -c COMMAND`` (no second login shell: the agent's
environment is its login session's). The agent's output lines and exit go back to the shim;
heartbeats go to every agent while its daemon runs.

Stopping: when the shim disconnects (mpirun killed it, or ended), the agent is told ``term``:
SIGTERM to orted, its ranks and anything carrying the host's run id, SIGKILL after the grace
period. When poprun-py dies, the agents stop everything by themselves. A host silent for
``liveness`` seconds (``--host-timeout``), or whose stream ended, is lost: its shim exits 255,
which makes mpirun abort the job, and :attr:`Relay.lost` names it -- dated when it was last
heard, so it is the root cause. An agent runs one job, so a second request for one host is
refused (exit 255).

A hung job's stacks (:meth:`RshRelay.dump_ranks`, for ``--hang-timeout``): every agent running
a daemon is sent ``dump-ranks``; its ``s RANK TEXT``/``w RANK HOW`` records are gathered per
rank, and once each has answered (``y``) or ended, the launcher's run gets them all at once.

Example::

    with relayed(agents, job, grace=5.0) as relay:
        run = supervise_launcher(job, {**job.launcher_env, **relay.environ}, ...)
    relay.lost          # {"h3": Lost("host h3 stopped answering (3.1 s ...)", 1712.5)}

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.render.job import render_job
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    >>> plan = make_plan(cluster, JobSpec(("prog",), replicas=2, instances=2))
    >>> host_names(render_job(plan, "mpirun", job_dir="/tmp/j"))  # Open MPI's name -> host
    {'h1': 'h1', 'h2': 'h2'}
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poprun_py.agent.client import (
    HEARTBEAT,
    KILL_WAIT,
    LIVENESS,
    START_TIMEOUT,
    AgentLink,
    Timing,
    agent_header,
    pausing,
)
from poprun_py.hostside import protocol as P
from poprun_py.hostside.rsh_shim import SOCKET_VAR, uses_relay
from poprun_py.hostside.supervision import readable

if TYPE_CHECKING:
    from poprun_py.agent.client import AgentConnection, AgentPool
    from poprun_py.render.job import RenderedJob

AGENT_RUN_VAR = "POPRUN_AGENT_RUN_ID"
"""The relay's run id, in the launcher's environment: a rank that MPICH's hydra starts (in a
session of its own, with the launcher's environment, not the daemon's) joins its host agent's
run with it (``mpiexec.j2``), so that the agent stops it with the daemon."""
REQUEST_TIMEOUT = 10.0  # for the shim's request line, and for each write to the shim
DAEMON_SHELL = "/bin/sh"


RankDumps = dict[int, list[bytes] | None]
"""Rank -> its stack lines (``py-spy dump``'s), or None: found, but not dumped."""


@dataclass(frozen=True)
class Lost:
    """A host that stopped answering: why, and when it was last heard (wall clock)."""

    reason: str
    when: float


class Relay:
    """What a launcher needs from a relay: mpirun's extra environment and the hosts lost.
    This base relays nothing (a local launch, or the user's own ``plm_rsh_agent``)."""

    relays = False  # whether daemons start through the agents (they can reach the ranks)

    def __init__(self) -> None:
        self.environ: dict[str, str] = {}
        self.lost: dict[str, Lost] = {}

    def stop_daemons(self) -> None:
        """Stop every daemon relayed so far (and its ranks) now, the launch going on."""

    def dump_ranks(self, done: Callable[[RankDumps], None]) -> bool:
        """Have every relayed daemon's agent dump its ranks' stacks; ``done`` hears what they
        found. False: no daemon is relayed (nothing is done)."""
        return False

    def signal_ranks(self, signum: int) -> None:
        """Have every relayed daemon's agent send ``signum`` to its ranks (``sigr N``)."""


@contextlib.contextmanager
def relayed(
    agents: AgentPool | None, job: RenderedJob, grace: float, host_timeout: float = LIVENESS
) -> Iterator[Relay]:
    """An :class:`RshRelay` while mpirun runs when ``job.launcher`` uses the shim and there are
    agents to relay to (a host silent ``host_timeout`` seconds is lost, and so is poprun-py
    to its agent); otherwise a :class:`Relay` that does nothing."""
    if agents is None or not uses_relay(job.launcher):
        yield Relay()
        return
    beat = P.heartbeat_for(len(job.plan.hosts), HEARTBEAT, host_timeout)
    timing = Timing(grace, beat, host_timeout, START_TIMEOUT)
    with RshRelay(agents, host_names(job), timing) as relay:
        yield relay


def host_names(job: RenderedJob) -> dict[str, str]:
    """How Open MPI may name each plan host (its target -- address or name -- and its name)
    -> the plan host's name; a target shared by several plan hosts goes to the first."""
    names: dict[str, str] = {}
    for host in job.plan.hosts:
        names.setdefault(host.spec.target, host.name)
    for host in job.plan.hosts:
        names.setdefault(host.name, host.name)
    return names


class RshRelay(Relay):
    """Serves the shim on a Unix socket while mpirun runs (a context manager)."""

    relays = True

    def __init__(self, agents: AgentPool, names: dict[str, str], timing: Timing):
        super().__init__()
        self.agents, self.names, self.timing = agents, names, timing
        self.run_id = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.claimed: set[str] = set()
        self.sessions: list[_Session] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.stopped = False  # stop_daemons() was called: no daemon may start any more
        self.give_up_at = float("inf")  # once closing: when sessions stop waiting for agents
        self.directory = tempfile.mkdtemp(prefix="poprun-rsh-")  # mode 0700
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.dump_waits: set[_Session] | None = None  # a rank dump under way: who has not answered
        self.dump_found: RankDumps = {}
        self.dump_done: Callable[[RankDumps], None] = lambda found: None
        self.paused = contextlib.ExitStack()

    def __enter__(self) -> RshRelay:
        path = os.path.join(self.directory, "socket")
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(128)
        self.environ[SOCKET_VAR] = path
        self.environ[AGENT_RUN_VAR] = self.run_id
        self.paused.enter_context(pausing())  # Ctrl-Z: the agents are told to wait
        self.spawn(self.accept)
        self.spawn(self.beat)
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop accepting, tell every agent still running a daemon to stop, and wait (at most
        grace + KILL_WAIT) until each has said it is done."""
        self.give_up_at = time.monotonic() + self.timing.grace + KILL_WAIT
        self.closing.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()
        with self.lock:
            sessions, threads = list(self.sessions), list(self.threads)
        for session in sessions:
            session.stop()
        for thread in threads:
            thread.join(max(0.0, self.give_up_at - time.monotonic()))
        self.paused.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def stop_daemons(self) -> None:
        """Tell every agent running a daemon to stop it (hydra does not stop the other hosts'
        proxies when a rank fails: see :mod:`poprun_py.backends.mpiexec`); a daemon asked for
        from now on is refused, and one whose start was under way is stopped once started."""
        with self.lock:
            self.stopped = True
            sessions = list(self.sessions)
        for session in sessions:
            session.stop()

    def dump_ranks(self, done: Callable[[RankDumps], None]) -> bool:
        """Every running daemon's agent dumps its ranks (``dump-ranks``); ``done`` is called
        (on a relay thread) once each has answered or ended."""
        with self.lock:
            sessions = [s for s in self.sessions if s.link is not None and not s.link.done]
            if not sessions:
                return False
            self.dump_waits, self.dump_found, self.dump_done = set(sessions), {}, done
        for session in sessions:
            assert session.link is not None
            session.link.send(P.DUMP_RANKS_LINE)
        return True

    def signal_ranks(self, signum: int) -> None:
        """Every running daemon's agent signals its ranks, not the daemon (``sigr N``)."""
        with self.lock:
            links = [s.link for s in self.sessions if s.link is not None and not s.link.done]
        for link in links:
            link.send(b"%s %d" % (P.SIGNAL_RANKS_LINE, signum))

    def rank_stacks(self, rank: int, line: bytes | None) -> None:
        """One line of ``rank``'s stacks (None: the rank was found, not dumped)."""
        with self.lock:
            lines = self.dump_found.get(rank)
            if line is not None:
                self.dump_found[rank] = [*(lines or []), line]
            else:
                self.dump_found.setdefault(rank, None)

    def dump_answered(self, session: _Session) -> None:
        """``session``'s agent has sent every rank's stacks (or ended): ``done`` after the last."""
        with self.lock:
            if self.dump_waits is None or session not in self.dump_waits:
                return
            self.dump_waits.discard(session)
            if self.dump_waits:
                return
            self.dump_waits = None
            found = self.dump_found
        self.dump_done(found)

    def spawn(self, target: Callable[[], None]) -> None:
        """Run ``target`` on a daemon thread of its own."""
        thread = threading.Thread(target=target, daemon=True, name="poprun-rsh-relay")
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def accept(self) -> None:
        """One session per shim connection, until the relay closes."""
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            session = _Session(self, conn)
            with self.lock:
                self.sessions.append(session)
            self.spawn(session.run)

    def beat(self) -> None:
        """Heartbeats to every agent running a daemon (from a thread of their own, so a shim
        slow to read cannot make an agent think poprun-py is gone)."""
        while not self.closing.wait(self.timing.heartbeat):
            with self.lock:
                links = [s.link for s in self.sessions if s.link is not None]
            for link in links:
                link.send(P.HEARTBEAT_LINE)

    def claim(self, name: str) -> tuple[str, AgentConnection]:
        """The plan host Open MPI calls ``name`` and its agent, now taken for one daemon;
        LookupError saying why not."""
        host = self.names.get(name) or self.names.get(name.rpartition("@")[2])
        if host is None:
            raise LookupError(f"host {name} is not one of this launch's hosts")
        if self.closing.is_set() or self.stopped:
            raise LookupError("the launch is over")
        with self.lock:
            if host in self.claimed:
                raise LookupError(f"host {host} already runs a daemon of this launch")
            self.claimed.add(host)
        try:
            return host, self.agents.agent_on(host)
        except Exception as exc:  # a typed transport error, or a channel that broke
            raise LookupError(f"cannot use the agent on host {host}: {exc}") from None

    def lose(self, host: str, lost: Lost) -> None:
        """Record a host that stopped answering."""
        with self.lock:
            self.lost.setdefault(host, lost)


class _Session:
    """One shim connection: one daemon on one host's agent, relayed until the agent is done."""

    def __init__(self, relay: RshRelay, sock: socket.socket):
        self.relay, self.sock = relay, sock
        self.link: AgentLink | None = None
        self.shim_open = True

    def run(self) -> None:
        """Read the request, start the command through the agent, relay until it is done."""
        with self.sock:
            try:
                host, command = self.request()
                name, agent = self.relay.claim(host)
            except (OSError, ValueError, LookupError) as exc:
                self.fail(str(exc), 255)
                return
            link = AgentLink(name, (0,))
            instance = {"index": 0, "argv": [DAEMON_SHELL, "-c", command], "env": {}, "cwd": None}
            header = agent_header(self.relay.run_id, name, self.relay.timing, [instance], [])
            try:
                link.start(agent, header)
            except OSError:
                link.agent = agent
                self.lose(link, agent.why_ended())
                return
            self.link = link
            if self.relay.stopped:  # stop_daemons() ran while this daemon was starting
                link.send(P.TERM_LINE)
            try:
                self.pump(link)
            finally:
                self.relay.dump_answered(self)  # a dump it would not answer any more

    def request(self) -> tuple[str, str]:
        """The shim's request (:func:`poprun_py.hostside.rsh_shim.request`): host and command."""
        self.sock.settimeout(REQUEST_TIMEOUT)
        data = b""
        while data.count(b"\0") < 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ValueError("the rsh agent sent no request")
            data += chunk
        host, command, _ = data.split(b"\0", 2)
        return os.fsdecode(host), os.fsdecode(command)

    def pump(self, link: AgentLink) -> None:
        """Relay the agent's records to the shim, until the agent is done or the host lost."""
        assert link.agent is not None
        stream = link.agent.stream
        while not link.done and time.monotonic() < self.relay.give_up_at:
            watched: list[Any] = [stream, self.sock] if self.shim_open else [stream]
            ready = readable(watched, self.relay.timing.heartbeat)
            if self.sock in ready:
                self.read_shim(link)
            if stream in ready or link.pending():
                records, ended = link.receive()
                for record in records:
                    self.record(link, record)
                if ended and not link.done:
                    self.lose(link, link.why_lost())
            silence = link.silence(time.monotonic())
            if not link.done and silence > self.relay.timing.liveness and not link.pending():
                self.lose(link, link.why_lost(silence))

    def read_shim(self, link: AgentLink) -> None:
        """The shim says nothing after its request: EOF means mpirun ended it; stop the daemon."""
        try:
            data = self.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.shim_open = False
            link.send(P.TERM_LINE)

    def record(self, link: AgentLink, record: bytes) -> None:
        """Act on one agent record (see :mod:`poprun_py.hostside.agent`)."""
        kind, index, text = P.parse(record)
        if kind == P.DONE:
            link.done = True
        elif kind == P.RANK_STACK and index >= 0:
            self.relay.rank_stacks(index, text)
        elif kind == P.RANK_DUMPED and index >= 0:
            self.relay.rank_stacks(index, None)
        elif kind == P.STACKS:
            self.relay.dump_answered(self)
        elif index != 0:
            return  # a heartbeat, or noise
        elif kind in (P.STDOUT, P.STDERR):  # the shim's records: o/e TEXT, x CODE
            self.tell((b"o " if kind == P.STDOUT else b"e ") + text)
        elif kind == P.EXITED and text.isdigit():
            self.tell(b"x " + text)
        elif kind == P.KILLED and text.isdigit():
            self.tell(b"x %d" % (128 + int(text)))
        elif kind in (P.FAILED, P.NOT_STARTED):
            self.fail(text.decode("utf-8", "replace"), 127 if kind == P.FAILED else 255)

    def tell(self, line: bytes) -> None:
        """Send one record to the shim; a shim that is gone is noted, not an error."""
        if not self.shim_open:
            return
        try:
            self.sock.sendall(line + b"\n")
        except OSError:
            self.shim_open = False
            if self.link is not None:
                self.link.send(P.TERM_LINE)

    def fail(self, message: str, code: int) -> None:
        """Tell the shim why it cannot go on, and its exit code."""
        self.tell(b"e poprun-py: " + message.encode())
        self.tell(b"x %d" % code)

    def lose(self, link: AgentLink, reason: str) -> None:
        """The host is gone: the shim exits 255 (mpirun aborts the job); the relay records it."""
        link.done = True
        self.relay.lose(link.host, Lost(reason, link.heard_wall))
        self.fail(reason, 255)
        link.close()

    def stop(self) -> None:
        """The launch is over: tell the agent to stop whatever is left of its daemon."""
        if self.link is not None and not self.link.done:
            self.link.send(P.TERM_LINE)
