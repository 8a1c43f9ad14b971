"""Node 0's coordinator in per-node mode: the other nodes' launchers dial it over TCP, prove the
shared secret (:mod:`poprun_py.pernode.wire`) and say their plan's digest; a node that joined is
then one of the job's hosts, driven exactly as an SSH host is.

:class:`Coordinator` listens (a port in use: one line, exit 3), refuses and logs every
connection without the secret, refuses a node whose plan differs from its own, and keeps each
joined node's idle connection (heartbeats to it) until an agent is wanted there. Host K of the
plan is node K. :class:`JoinedPool` quacks like :class:`~poprun_py.ssh.pool.ConnectionPool`
for :class:`~poprun_py.agent.client.AgentPool` and
:class:`~poprun_py.backends.session.RemoteSession`: "connecting" to a host waits (until
``--join-timeout``) for its node to join, and an agent on it is the node's next dial, ordered
to ``start`` the agent's bootstrap and relaying it over the socket
(:class:`~poprun_py.agent.stream.SocketStream`, through :meth:`JoinedConnection.agent_stream`).
So preflight's table, fail-fast, ``--timeout``, ``--hang-timeout``, USR1/USR2 and
``--max-restarts`` (a new agent per attempt: the node dials again) are the ssh backend's own
(:class:`PerNodeBackend`). A node that has not joined in time, or whose plan differs, is a
preflight fault naming it.

Example::

    with Coordinator(["n0", "n1"], secret, plan_digest(plan), 29400, 120.0) as coordinator:
        result = launcher.launch(prep, settings, backend=PerNodeBackend(coordinator))
        coordinator.finish(result.exit_code)          # every node's launcher exits with it

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> with Coordinator(["n0"], b"s" * 16, "d", 0, 0.1) as c:  # port 0: any free port
    ...     try:
    ...         c.wait_joined(0, c.join_deadline())
    ...     except NotJoined as exc:
    ...         print(exc.fault())
    Fault(host='n0', check='join', detail='node 0 (n0) has not joined within 0.1 s')
"""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from poprun_py.agent.stream import SocketStream, Stream
from poprun_py.backends.ssh import SshBackend
from poprun_py.core.spec import HostSpec
from poprun_py.errors import EXIT_PREFLIGHT, PoprunError
from poprun_py.pernode import wire
from poprun_py.ssh.connection import Connection, RemoteResult
from poprun_py.ssh.errors import ConnectionLost, TransportError
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings

if TYPE_CHECKING:
    from poprun_py.backends.session import RemoteSession
    from poprun_py.core.result import RunSettings
    from poprun_py.prepare.job import Prepared

log = logging.getLogger("poprun_py")
IDLE_BEAT = 1.0  # seconds between heartbeats to a node waiting for an order
FINISH_WAIT = 10.0  # seconds the coordinator waits, at the end, for a node to dial for "done"
AGENT_EXIT_WAIT = 5.0  # seconds a one-off agent (a command's) has to exit after its command


class PortInUse(PoprunError):
    """The coordinator's port is taken on this node: one line, exit 3."""

    exit_code = EXIT_PREFLIGHT


class NotJoined(TransportError):
    """A node that has not joined (or not joined again) in time."""

    check = "join"


class PlanDiffers(TransportError):
    """A node that joined with another plan than node 0's."""

    check = "plan"


class Coordinator:
    """Accepts the nodes' launchers on ``port`` and hands out their connections; a context
    manager (closing stops listening and drops every idle connection)."""

    def __init__(
        self,
        hosts: Sequence[str],
        secret: bytes,
        digest: str,
        port: int,
        join_timeout: float,
        *,
        bind: str = "",
    ):
        self.hosts, self.secret, self.digest = tuple(hosts), secret, digest
        self.join_timeout = join_timeout
        try:
            self.server = _listen(bind, port)
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise PortInUse(
                f"the coordinator cannot listen on port {port}: {why} "
                "(another job's coordinator? give another port: --coordinator HOST:PORT)"
            ) from None
        self.port = self.server.getsockname()[1]
        self.idle: dict[int, tuple[socket.socket, wire.Lines]] = {}
        self.differs: dict[int, str] = {}  # rank -> the digest it joined with
        self.refused: list[str] = []  # "ADDRESS: why", each logged
        self.seen: set[int] = set()
        self.finished: set[int] = set()  # ranks told "done": a dial of theirs is not for this
        self.cond = threading.Condition()
        self.started = time.monotonic()
        self.closed = False
        self._opened = 0  # pools opened: the first waits from the start, later ones from then
        for target, name in ((self._accept, "poprun-accept"), (self._beat, "poprun-idle")):
            threading.Thread(target=target, daemon=True, name=name).start()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, address = self.server.accept()
            except OSError:
                if self.closed:
                    return
                time.sleep(0.05)  # EMFILE and friends: try again
                continue
            peer = str(address[0]).removeprefix("::ffff:")  # an IPv4 peer as such
            where = f"[{peer}]:{address[1]}" if ":" in peer else f"{peer}:{address[1]}"
            args = (sock, where)
            threading.Thread(target=self._join, args=args, daemon=True, name="poprun-join").start()

    def _join(self, sock: socket.socket, where: str) -> None:
        """One dial: the handshake, then the node waits for an order (or is refused)."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = wire.Lines(sock)
        try:
            hello = wire.accept_node(sock, lines, self.secret, wire.HANDSHAKE_TIMEOUT)
            if self._finished(hello.rank):  # no answer: its dial is a later round's, which
                sock.close()  # it tries again until that listens (launch --check --detach)
                return
            verdict = self._verdict(hello)
            if verdict is not None:  # logged before the node hears it
                self._refuse(where, f"node {hello.rank}: {verdict}")
            wire.send_line(sock, b"ok" if verdict is None else wire.order("no", verdict))
        except (wire.WireError, OSError) as exc:
            self._refuse(where, str(exc))
            sock.close()
            return
        if verdict is not None:
            sock.close()
            return
        with self.cond:
            old = self.idle.pop(hello.rank, None)
            self.idle[hello.rank] = (sock, lines)
            self.seen.add(hello.rank)
            self.cond.notify_all()
        if old is not None:  # the node dialled again (a restarted pod): the old line is dead
            old[0].close()

    def _finished(self, rank: int) -> bool:
        """Node ``rank`` was told ``done`` by this coordinator."""
        with self.cond:
            return rank in self.finished

    def _verdict(self, hello: wire.Hello) -> str | None:
        """Why node ``hello.rank`` may not join (None: it may)."""
        if not 0 <= hello.rank < len(self.hosts):
            return f"rank {hello.rank} is not one of this job's nodes 0-{len(self.hosts) - 1}"
        with self.cond:
            if hello.digest != self.digest:
                self.differs[hello.rank] = hello.digest
                self.cond.notify_all()
                return (
                    f"its plan differs from node 0's (digest {hello.digest[:12]}, node 0's "
                    f"{self.digest[:12]}): every node must run the same command and inputs"
                )
            self.differs.pop(hello.rank, None)
        return None

    def _refuse(self, where: str, why: str) -> None:
        log.warning("refused a connection from %s: %s", where, why)
        with self.cond:
            self.refused.append(f"{where}: {why}")

    def _beat(self) -> None:
        """Heartbeats to the idle nodes; a node whose idle line ended is dropped."""
        while not self.closed:
            time.sleep(IDLE_BEAT)
            with self.cond:
                for rank, (sock, _) in list(self.idle.items()):
                    if not _alive(sock):
                        del self.idle[rank]
                        sock.close()
                        continue
                    with contextlib.suppress(OSError):
                        sock.send(b"h\n", socket.MSG_DONTWAIT)

    def host(self, rank: int) -> str:
        """Host ``rank`` of the plan."""
        return self.hosts[rank]

    def join_deadline(self) -> float:
        """Until when a new pool waits for the nodes: ``--join-timeout`` from the start for
        the first, from now for later ones (a restart after a node was lost)."""
        self._opened += 1
        start = self.started if self._opened == 1 else time.monotonic()
        return start + self.join_timeout

    def wait_joined(self, rank: int, deadline: float) -> None:
        """Return once node ``rank`` waits for an order; NotJoined at ``deadline``, PlanDiffers
        at once for a node whose plan differs."""
        with self.cond:
            self._wait(rank, deadline)

    def take(self, rank: int, deadline: float) -> tuple[socket.socket, wire.Lines]:
        """Node ``rank``'s idle connection, for one order (waiting as :meth:`wait_joined`)."""
        with self.cond:
            self._wait(rank, deadline)
            return self.idle.pop(rank)

    def _wait(self, rank: int, deadline: float) -> None:
        while True:
            if rank in self.idle and _alive(self.idle[rank][0]):
                return
            if rank in self.idle:
                self.idle.pop(rank)[0].close()
            name = f"node {rank} ({self.hosts[rank]})"
            if rank in self.differs:
                digest = self.differs[rank]
                raise PlanDiffers(
                    self.hosts[rank],
                    f"{name} made a different plan (digest {digest[:12]}, node 0's "
                    f"{self.digest[:12]}): run the same command with the same inputs everywhere",
                )
            wait = deadline - time.monotonic()
            if wait <= 0 or self.closed:
                raise NotJoined(self.hosts[rank], self._not_joined(rank, name))
            self.cond.wait(min(wait, 1.0))

    def _not_joined(self, rank: int, name: str) -> str:
        again = " again" if rank in self.seen else ""
        text = f"{name} has not joined{again} within {self.join_timeout:g} s"
        if self.refused:
            text += f" ({len(self.refused)} connection(s) refused; last: {self.refused[-1]})"
        return text

    def finish(
        self, code: int, wait: float = FINISH_WAIT, lost: Sequence[str] = (), reason: str = ""
    ) -> None:
        """Tell every node that joined to exit with ``code``, and why (``reason``: the root
        cause; each dials again once its agent has ended: up to ``wait`` seconds for all; the
        nodes of ``lost`` hosts only if they wait already), then close. A node told ``done``
        that dials again meanwhile gets no answer: it is a later round's (``launch --check
        --detach``: the supervisors' coordinator), and dials on until that one listens."""
        deadline = time.monotonic() + wait
        for rank in sorted(self.seen):
            gone = self.hosts[rank] in lost
            try:
                sock, _ = self.take(rank, time.monotonic() if gone else deadline)
            except TransportError:
                continue
            with self.cond:
                self.finished.add(rank)
            with contextlib.suppress(OSError):
                wire.send_line(sock, wire.order("done", [code, reason]))
            sock.close()
        self.close()

    def close(self) -> None:
        """Stop listening; drop every idle connection (those nodes find the coordinator gone)."""
        with self.cond:
            self.closed = True
            idle, self.idle = list(self.idle.values()), {}
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        for sock, _ in idle:
            sock.close()


def _listen(bind: str, port: int) -> socket.socket:
    """A listening socket on ``port``: IPv6 and IPv4 where the node has IPv6, else IPv4."""
    if not bind and socket.has_dualstack_ipv6():
        try:
            return socket.create_server(
                ("", port), family=socket.AF_INET6, backlog=4096, dualstack_ipv6=True
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise
    return socket.create_server((bind, port), backlog=4096)


def _alive(sock: socket.socket) -> bool:
    """False once the peer of an idle connection closed it (an idle node sends nothing)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable or bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (OSError, ValueError):
        return False


class JoinedConnection(Connection):
    """A joined node as a host's connection: an agent on it is the node's next dial, ordered
    to start the agent's bootstrap; commands (``run``) go through a one-off agent."""

    logs_in = False  # a command is the node's next dial: no login session to save

    def __init__(self, coordinator: Coordinator, host: HostSpec, rank: int):
        self.host, self.coordinator, self.rank = host, coordinator, rank
        self.via = None
        self._on_close: list[Callable[[], None]] = []
        self._sftp = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JoinedConnection({self.label})"

    @property
    def label(self) -> str:
        """``h2 (node 2)``."""
        return f"{self.name} (node {self.rank})"

    @property
    def alive(self) -> bool:
        """True while the coordinator runs (each agent finds out whether its node answers)."""
        return not self.coordinator.closed

    @property
    def endpoint_timeout(self) -> float:
        """The join timeout."""
        return self.coordinator.join_timeout

    def agent_stream(self, argv: Sequence[str]) -> Stream:
        """The node's next dial, told to ``start argv`` with its stdin and stdout on the socket
        (NotJoined when the node does not dial within ``--join-timeout``)."""
        deadline = wire.deadline_in(self.coordinator.join_timeout)
        sock, _ = self.coordinator.take(self.rank, deadline)
        try:
            wire.send_line(sock, wire.order("start", list(argv)))
        except OSError as exc:
            sock.close()
            raise ConnectionLost(self.name, f"lost node {self.rank} ({self.name}): {exc}") from None
        return SocketStream(sock)

    def run(  # type: ignore[override]  # no on_output/cancel over an agent
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        **_: object,
    ) -> RemoteResult:
        """``argv`` on the node, through an agent of its own (ended afterwards)."""
        from poprun_py.agent.client import AgentConnection

        agent = AgentConnection.start(self)
        try:
            return agent.run(argv, stdin=stdin, env=env, cwd=cwd, timeout=timeout)
        finally:
            agent.send_eof()
            deadline = time.monotonic() + AGENT_EXIT_WAIT
            while not agent.exited() and time.monotonic() < deadline:
                time.sleep(0.01)
            agent.close()

    def _unsupported(self, what: str) -> NoReturn:
        raise ConnectionLost(self.name, f"{what} is not available on a joined node ({self.name})")

    def open_channel(self) -> NoReturn:
        """No SSH channels to a joined node."""
        self._unsupported("an SSH channel")

    def start(self, *args: object, **kwargs: object) -> NoReturn:
        """No SSH channels to a joined node: :meth:`agent_stream` starts an agent."""
        self._unsupported("an SSH channel")

    def sftp(self) -> NoReturn:
        """No SFTP to a joined node (``--sync`` needs SSH)."""
        self._unsupported("SFTP (--sync)")

    def signal_group(self, pgid: int, signame: str = "TERM") -> None:
        """Nothing: commands on a joined node run under an agent, which stops them itself."""

    def close(self) -> None:
        """Nothing held: the coordinator owns the node's connections."""


class JoinedPool(ConnectionPool):
    """The plan's hosts as joined nodes: opening host K waits for node K to join (until the
    coordinator's join deadline); NotJoined or PlanDiffers are its faults."""

    def __init__(self, coordinator: Coordinator, hosts: Sequence[HostSpec], settings: SshSettings):
        super().__init__(hosts, settings)
        self.coordinator = coordinator
        self.deadline = coordinator.join_deadline()
        self.ranks = {name: rank for rank, name in enumerate(coordinator.hosts)}

    def _resolve(self, host: HostSpec) -> object:
        """Nothing to resolve: the node dials in."""
        return None

    def resolve_all(self) -> None:
        """Nothing to resolve: the nodes dial in."""

    def require_direct(self, why: str) -> None:
        """Every joined node is reached directly."""

    def _open(self, host: HostSpec) -> Connection:
        with self._lock:
            conn = self.connections.get(host.name)
        if conn is not None:
            return conn
        rank = self.ranks[host.name]
        try:
            self.coordinator.wait_joined(rank, self.deadline)
        except TransportError as exc:
            with self._lock:
                self.errors[host.name] = exc
            raise
        conn = JoinedConnection(self.coordinator, host, rank)
        with self._lock:
            self.connections[host.name] = conn
            self.errors.pop(host.name, None)
        return conn


class PerNodeBackend(SshBackend):
    """The ssh backend over the coordinator's joined nodes."""

    def __init__(self, coordinator: Coordinator):
        super().__init__()
        self.coordinator = coordinator

    def open(self, prep: Prepared, settings: RunSettings) -> RemoteSession:
        """A session whose hosts are the joined nodes (each waited for, to the join deadline)."""
        from poprun_py.backends.session import RemoteSession, ssh_settings

        pool = JoinedPool(self.coordinator, list(prep.plan.cluster.hosts), ssh_settings(prep))
        return RemoteSession(prep, settings, self.with_agents, stages=True, pool=pool)
