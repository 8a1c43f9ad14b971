"""Connections to many hosts (:class:`ConnectionPool`): opened in parallel, each in its own worker
(which also resolves that host's ssh configuration), and reused for everything a launch does
(preflight, sync, exec, launch). Hosts behind the same jump host share one connection to it.

Up to :data:`MAX_WORKERS` hosts have a worker at once, but at most :data:`CONNECT_WINDOW` of them
resolve and connect at once (the rest run their commands):
a host's connect timeout counts from when its own attempt starts, so on a busy machine a host
that only waited for a slot is not reported unreachable. A pool raises ``RLIMIT_NOFILE`` to its
hard limit (:func:`raise_nofile_limit`): a thousand hosts need more than 1,024 descriptors.

Example::

    with ConnectionPool(hosts, SshSettings(known_hosts=Path("known_hosts"))) as pool:
        pool.open_all()          # PreflightError listing every host that cannot be used
        outcomes = pool.each(lambda conn: conn.run(["hostname"]))  # host -> HostResult

    >>> ConnectionPool([], SshSettings()).connect_all()
    {}
    >>> import resource; soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    >>> soft == hard or hard == resource.RLIM_INFINITY
    True
"""

from __future__ import annotations

import contextlib
import resource
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

from poprun_py.core.spec import HostSpec
from poprun_py.errors import Fault, PreflightError, UsageError
from poprun_py.ssh.connect import Context, connect
from poprun_py.ssh.connection import Connection
from poprun_py.ssh.errors import ConnectionLost, TransportError
from poprun_py.ssh.hostresult import HostResult
from poprun_py.ssh.settings import SshSettings
from poprun_py.ssh.tree import GatewayLink, TreeConnection, plain_endpoint, subtrees

T = TypeVar("T")

CONNECT_WINDOW = 64
"""At most this many hosts of a pool resolve their configuration and connect at once (as
clush's default fanout): a thousand handshakes at once on a few cores would each be slow enough
to time out."""
MAX_WORKERS = 2 * CONNECT_WINDOW
"""Workers of a pool: one per host up to this many (past it, a host waits for a free worker).
Not one per host: with a thousand threads, the GIL's hand-offs cost the launcher over 100 ms
of CPU per host (measured at 1,024 hosts, ``benchmarks/bench_scale.py``)."""
IDLE_WAKE = 2.0
"""Seconds an established Paramiko connection's reader thread sleeps when nothing arrives
(Paramiko's own is 0.1 s, :func:`quiet`)."""
NOFILE_FALLBACK = 1 << 20
"""The soft ``RLIMIT_NOFILE`` asked for when the hard limit is unlimited."""


def raise_nofile_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; the soft limit now.

    Each host takes a socket (Paramiko) or three pipes (OpenSSH): 1,024 hosts pass the usual
    soft limit of 1,024. Where the limit cannot be raised, it stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NOFILE_FALLBACK if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def quiet(conn: Connection, wake: float = IDLE_WAKE) -> None:
    """Let ``conn``'s Paramiko reader thread sleep ``wake`` seconds (not 0.1 s) while nothing
    arrives: it wakes only to see whether the connection was closed here, and a thousand idle
    connections waking ten times a second each were the launcher's main CPU cost with every
    agent connection open (``launch`` at 1,024 hosts). Anything arriving wakes it at once."""
    transport = getattr(conn, "transport", None)
    sock = getattr(transport, "sock", None)
    if sock is not None and hasattr(sock, "settimeout"):
        with contextlib.suppress(OSError):
            sock.settimeout(wake)


class _Gate:
    """Counts the hosts whose configuration is resolved; remembers the first failure."""

    def __init__(self, waiting: set[str]):
        self.waiting = frozenset(waiting)
        self._left = set(waiting)
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        if not waiting:
            self._done.set()

    def arrive(self, name: str, error: BaseException | None = None) -> None:
        with self._lock:
            self._left.discard(name)
            if error is not None and self._error is None:
                self._error = error
            if not self._left or self._error is not None:
                self._done.set()

    def wait(self) -> None:
        """Block until every host resolved; raise the failure (bad input) if one did not."""
        self._done.wait()
        if self._error is not None:
            raise _Aborted from None

    def check(self) -> None:
        """After the workers: raise the resolution failure, if any."""
        if self._error is not None:
            raise self._error


class _Aborted(Exception):
    """Another host's configuration could not be resolved: this one does nothing."""


class ConnectionPool:
    """Connections to many hosts, opened in parallel and reused; a context manager."""

    def __init__(
        self,
        hosts: Sequence[HostSpec],
        settings: SshSettings,
        max_workers: int = MAX_WORKERS,
        window: int = CONNECT_WINDOW,
    ):
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise UsageError("a host is listed twice")
        raise_nofile_limit()
        self.hosts = tuple(hosts)
        self.settings = settings
        self.connections: dict[str, Connection] = {}
        self.errors: dict[str, TransportError] = {}
        self._context = Context(settings)
        self._workers = max(1, min(max_workers, len(self.hosts)))
        self._window = threading.BoundedSemaphore(max(1, window))
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.tree = subtrees(names, settings.fanout)  # host -> its gateway (--fanout)
        self.gateways: dict[str, GatewayLink] = {}
        self._gateway_locks = {g: threading.Lock() for g in set(self.tree.values())}

    @property
    def resolver_kind(self) -> str:
        """``openssh`` (``ssh -G``) or ``paramiko`` (the fallback reader)."""
        return self._context.resolver.kind

    @property
    def resolve_seconds(self) -> dict[str, float]:
        """What resolving each host's (and jump host's) ssh configuration took."""
        return dict(self._context.resolver.seconds)

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _parallel(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[HostResult[T]]:
        if not items:
            return []
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="poprun-ssh")
        futures = [self._executor.submit(fn, item) for item in items]
        outcomes: list[HostResult[T]] = []
        for future in futures:
            # Every host's outcome is kept, but only what its worker raised: a Ctrl-C that
            # arrives while this thread waits (KeyboardInterrupt, here) goes on up.
            error = future.exception()
            done = HostResult(future.result()) if error is None else HostResult(fault=error)
            outcomes.append(done)
        return outcomes

    def _open(self, host: HostSpec) -> Connection:
        """The host's connection, opened now if needed; failures are remembered in ``errors``."""
        with self._lock:
            conn = self.connections.get(host.name)
        if conn is not None:
            return conn
        try:
            gateway = self.tree.get(host.name)
            if gateway is not None:  # no handshake here: its ssh runs on the gateway
                conn = self._through(host, gateway)
            else:
                with self._window:  # its timeouts start here, once it has a slot
                    conn = connect(host, self.settings, self._context)
        except TransportError as exc:
            with self._lock:
                self.errors[host.name] = exc
            raise
        quiet(conn)
        with self._lock:
            self.connections[host.name] = conn
            self.errors.pop(host.name, None)
        return conn

    def _through(self, host: HostSpec, gateway: str) -> Connection:
        """``host``'s connection through its gateway's link (the gateway connected and its
        relay started on first use); ConnectionLost naming the gateway when it cannot be."""
        with self._gateway_locks[gateway]:
            link = self.gateways.get(gateway)
            if link is None:
                spec = next(h for h in self.hosts if h.name == gateway)
                try:
                    link = GatewayLink(self._open(spec))
                except TransportError as exc:
                    why = f"{host.name}: through gateway {gateway}, which cannot be used: "
                    why += exc.detail
                    raise ConnectionLost(host.name, why) from None
                self.gateways[gateway] = link
        endpoint = plain_endpoint(host, self.settings)
        return TreeConnection(host, endpoint, self.settings, link, self._window)

    def resolve_all(self) -> None:
        """Resolve every host's ssh configuration, in parallel, before anything connects: a bad
        config is a UsageError naming its file and line, and nothing has started."""
        todo = [h for h in self.hosts if h.name not in self.connections]
        for outcome in self._parallel(self._resolve, todo):
            if outcome.fault is not None:
                raise outcome.fault

    def _resolve(self, host: HostSpec) -> object:
        """Resolve ``host``'s configuration (``ssh -G``: a process) within the window; a
        subtree host's is resolved by its gateway's ``ssh``."""
        if host.name in self.tree:
            return None
        with self._window:
            return self._context.resolver.endpoint(host)

    def require_direct(self, why: str) -> None:
        """Raise PreflightError (one fault) if any host is configured behind a ProxyJump."""
        self.resolve_all()
        behind = [h.name for h in self.hosts if self._context.resolver.endpoint(h).jumps]
        if behind:
            names = ", ".join(behind)
            raise PreflightError([Fault(behind[0], "ssh", f"{names}: behind a ProxyJump; {why}")])

    def connect_all(self) -> dict[str, TransportError]:
        """Open every host not yet open; return the hosts that failed, with why."""
        todo = [h for h in self.hosts if h.name not in self.connections]
        opener, gate = self._opener(todo)
        outcomes = self._parallel(opener, todo)
        gate.check()
        failed: dict[str, TransportError] = {}
        for host, outcome in zip(todo, outcomes, strict=True):
            match outcome.fault:
                case TransportError() as fault:
                    failed[host.name] = fault
                case BaseException() as fault:
                    raise fault
        return failed

    def open_all(self) -> dict[str, Connection]:
        """Open every host; raise PreflightError with one fault per host that cannot be used."""
        failed = self.connect_all()
        if failed:
            raise PreflightError([failed[h.name].fault() for h in self.hosts if h.name in failed])
        return dict(self.connections)

    def each(
        self,
        fn: Callable[[Connection], T],
        hosts: Iterable[str] | None = None,
        *,
        connect: bool = False,
    ) -> dict[str, HostResult[T]]:
        """``fn`` on every open connection (or those of ``hosts``) in parallel; every host's
        :class:`HostResult`.

        With ``connect``, hosts not yet open are connected first, each in its own worker (so a
        host starts ``fn`` as soon as it is up); a host that cannot be reached has its
        TransportError as its fault.
        """
        wanted = set(hosts) if hosts is not None else None
        todo = [
            h
            for h in self.hosts
            if (connect or h.name in self.connections) and (wanted is None or h.name in wanted)
        ]
        from poprun_py.process import phases  # here: not imported by --dry-run

        opener, gate = self._opener([h for h in todo if h.name not in self.connections])

        def run(host: HostSpec) -> T:
            try:  # each host's steps, told to the launch's phase under way (if any)
                conn = opener(host)
                phases.done(host.name, phases.CONNECTING)
                return fn(conn)
            finally:
                phases.done(host.name)

        outcomes = self._parallel(run, todo)
        gate.check()
        return {h.name: out for h, out in zip(todo, outcomes, strict=True)}

    def _opener(self, todo: Sequence[HostSpec]) -> tuple[Callable[[HostSpec], Connection], _Gate]:
        """How workers open ``todo``: each resolves its host's configuration, connects, then
        waits until every host's configuration resolved; if one failed (bad input), nothing
        runs and :meth:`_Gate.check` raises its error. With more hosts than workers (which
        could then wait on hosts not yet started), every host is resolved first instead."""
        gate = _Gate({h.name for h in todo})
        if len(todo) > self._workers:
            self.resolve_all()
            return self._open, gate

        def opener(host: HostSpec) -> Connection:
            if host.name in gate.waiting:
                try:
                    self._resolve(host)
                except BaseException as exc:
                    gate.arrive(host.name, exc)
                    raise
                gate.arrive(host.name)
            conn = self._open(host)
            gate.wait()
            return conn

        return opener, gate

    def release(self, name: str) -> None:
        """Close ``name``'s connection now, when nothing else will use it (``exec``): each open
        Paramiko transport's thread wakes ten times a second, which a thousand idle ones turn
        into the launcher's main cost. The host connects again if used later."""
        if name in self._gateway_locks:
            return  # a gateway's connection carries its subtree's
        with self._lock:
            conn = self.connections.pop(name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close every connection (those through gateways, then the gateways' relays, then the
        rest) and the worker threads."""
        conns = sorted(self.connections.values(), key=lambda c: not isinstance(c, TreeConnection))
        for conn in conns[: sum(isinstance(c, TreeConnection) for c in conns)]:
            with contextlib.suppress(Exception):
                conn.close()
        for link in self.gateways.values():
            link.close()
        for conn in conns[sum(isinstance(c, TreeConnection) for c in conns) :]:
            with contextlib.suppress(Exception):
                conn.close()
        self.connections.clear()
        self._context.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
