"""A node's launcher in per-node mode (``poprun-py launch --node-rank K --nnodes N
--coordinator HOST[:PORT] ...``): every node, node 0 included, runs the node loop; node 0 also
runs the coordinator (:mod:`poprun_py.pernode.coordinator`) and the launch itself.

The node loop dials the coordinator, proves the shared secret and says its rank and plan
digest (:mod:`poprun_py.pernode.wire`), then waits for one order: ``start ARGV`` runs ARGV
(the agent's bootstrap, exactly what the ssh backend runs on a host) and relays its stdin and
stdout over the connection, as sshd would; when it ends, the node dials again for its next
order (a restart starts a new agent). ``done RC`` ends the loop: the node's launcher exits
with RC, the job's exit code. A coordinator that cannot be reached (or that does not prove the
secret, or refuses this node) is one line and exit 3; a coordinator that goes away while an
agent runs closes the agent's stdin, and the agent stops its instances itself -- as does the
end of this launcher, killed or not: nothing is left running on the node.

Example::

    per_node(prep, identity, read_secret(None, os.environ), 120.0, run_the_launch)

Run as a doctest (tests/unit/test_docstrings.py): a node whose coordinator is not there::

    >>> from poprun_py.pernode.identity import NodeIdentity
    >>> node = NodeIdentity(1, 2, "127.0.0.1", 9, "--node-rank")   # nothing listens on 9
    >>> try:
    ...     node_loop(node, b"s" * 16, "d", 0.3, 5.0)
    ... except CoordinatorUnreachable as exc:
    ...     print(str(exc).split(":")[0], exc.exit_code)
    node 1 cannot reach the coordinator at 127.0.0.1 3
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from poprun_py.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_PREFLIGHT,
    PoprunError,
    UsageError,
)
from poprun_py.pernode import wire

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend
    from poprun_py.pernode.identity import NodeIdentity
    from poprun_py.prepare.job import Prepared

log = logging.getLogger("poprun_py")
RECONNECT = 10.0  # after an agent ended: seconds to reach the coordinator again, at most
RETRY = 0.1  # seconds between dials while the coordinator is not listening yet
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)
STOP_WAIT = 30.0  # seconds an interrupted node's agent has to stop its instances and exit


class CoordinatorUnreachable(PoprunError):
    """No coordinator answered in time, or it went away: one line, exit 3."""

    exit_code = EXIT_PREFLIGHT


class JobFailed(PoprunError):
    """The job ended with a failure (node 0's launcher reports it): this node exits with its
    code."""

    def __init__(self, code: int, reason: str = ""):
        self.exit_code = code
        why = f": {reason}" if reason else ""
        super().__init__(f"the job failed (exit {code}): node 0's launcher says why{why}")


def dial(
    node: NodeIdentity, secret: bytes, hello: wire.Hello, deadline: float, within: float
) -> tuple[socket.socket, wire.Lines]:
    """An authenticated connection to the coordinator, trying again until ``deadline`` while
    it does not listen (or its name does not resolve yet). CoordinatorUnreachable then; a
    coordinator that does not prove the secret or refuses this node: WireError (exit 3)."""
    last = "no answer"
    while True:
        wait = deadline - time.monotonic()
        try:
            sock = socket.create_connection((node.coordinator, node.port), max(0.2, min(wait, 5)))
        except OSError as exc:
            last = exc.strerror or str(exc)
        else:
            try:
                return sock, _handshake(sock, secret, hello)
            except wire.Refused as exc:
                sock.close()
                raise wire.Refused(f"node {node.rank}: {exc}") from None
            except (wire.WireError, OSError) as exc:
                sock.close()
                last = str(exc)
        if time.monotonic() + RETRY >= deadline:
            raise CoordinatorUnreachable(
                f"node {node.rank} cannot reach the coordinator at {node.address} within "
                f"{within:g} s: {last}"
            )
        time.sleep(RETRY)


def _handshake(sock: socket.socket, secret: bytes, hello: wire.Hello) -> wire.Lines:
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lines = wire.Lines(sock)
    wire.join_coordinator(sock, lines, secret, hello, wire.HANDSHAKE_TIMEOUT)
    wire.expect_ok(lines, wire.deadline_in(wire.HANDSHAKE_TIMEOUT))
    return lines


def wait_order(lines: wire.Lines, liveness: float) -> tuple[str, Any]:
    """The coordinator's next order; WireError when it is silent for ``liveness`` seconds
    (each heartbeat counts) or closes."""
    while True:
        kind, value = wire.read_order(lines, wire.deadline_in(liveness))
        if kind != "h":
            return kind, value


def relay(argv: list[str], sock: socket.socket, first: bytes) -> int:
    """Run ``argv`` (in a session of its own) with its stdin and stdout relayed over ``sock``
    (``first``: bytes that already came for it) until it exits; its exit status. Its stderr
    is this launcher's. The socket's end closes its stdin; its output's end, the socket.
    Interrupted (SIGTERM, Ctrl-C), the agent's stdin is closed -- it stops its instances --
    and it is waited for (:data:`STOP_WAIT` seconds, then killed)."""
    child = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, start_new_session=True
    )
    try:
        return _relayed(child, sock, first)
    except BaseException:
        _stop_agent(child, sock)
        raise


def _stop_agent(child: subprocess.Popen[bytes], sock: socket.socket) -> None:
    """The agent's stdin closed (it stops its instances), then its end waited for."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    for pipe in (child.stdin, child.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    try:
        child.wait(STOP_WAIT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    sock.close()


def _relayed(child: subprocess.Popen[bytes], sock: socket.socket, first: bytes) -> int:
    assert child.stdin is not None and child.stdout is not None
    stdin = child.stdin

    def inbound() -> None:
        with contextlib.suppress(OSError, ValueError):
            _write_all(stdin.fileno(), first)
            while chunk := sock.recv(65536):
                _write_all(stdin.fileno(), chunk)
        with contextlib.suppress(OSError):
            stdin.close()

    reader = threading.Thread(target=inbound, daemon=True, name="poprun-relay")
    reader.start()
    with contextlib.suppress(OSError):
        while chunk := os.read(child.stdout.fileno(), 65536):
            sock.sendall(chunk)
    code = child.wait()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    reader.join(5.0)
    sock.close()
    child.stdout.close()
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def node_loop(
    node: NodeIdentity,
    secret: bytes,
    digest: str,
    join_timeout: float,
    liveness: float,
    *,
    joined: Callable[[], None] | None = None,
) -> wire.Done:
    """Dial, take orders, run agents, until ``done``: the job's end. CoordinatorUnreachable when no
    coordinator answers within ``join_timeout`` (later: within :data:`RECONNECT`) or it goes
    away while this node waits; WireError when it refuses this node. ``joined``: called once,
    when the coordinator first accepted this node (a detached node's launcher returns then)."""
    hello = wire.Hello(node.rank, digest)
    deadline, within = wire.deadline_in(join_timeout), join_timeout
    while True:
        sock, lines = dial(node, secret, hello, deadline, within)
        if joined is not None:
            joined()
            joined = None
        try:
            kind, value = wait_order(lines, liveness)
        except wire.WireError as exc:
            sock.close()
            raise CoordinatorUnreachable(
                f"node {node.rank} lost the coordinator at {node.address}: {exc}"
            ) from None
        if kind != "start":
            sock.close()
            if kind == "no":
                raise wire.Refused(f"node {node.rank}: the coordinator refused it: {value}")
            return wire.Done.of(value)
        relay([str(word) for word in value], sock, lines.rest)
        within = min(join_timeout, RECONNECT)
        deadline = wire.deadline_in(within)


def launch_per_node(
    prep: Prepared,
    launch: Callable[[Prepared, Backend], None],
    *,
    sync: bool = False,
    on_running: Callable[[int], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """``launch`` in per-node mode (the CLI's, attached or in a detached job's supervisor):
    this node's identity and the secret (:func:`checked_node`), then :func:`per_node`.
    ``on_running``: on a node other than 0, called (with 0) once node 0 accepted it -- node 0
    calls it itself, from ``launch``, once every instance runs."""
    node, secret = checked_node(prep, sync=sync, environ=environ)
    joined = None if on_running is None else functools.partial(on_running, 0)
    per_node(prep, node, secret, prep.options.join_timeout, launch, joined=joined)


def checked_node(
    prep: Prepared, *, sync: bool = False, environ: Mapping[str, str] | None = None
) -> tuple[NodeIdentity, bytes]:
    """This node's identity and the secret, from the options and ``environ`` (default: this
    process's). UsageError (exit 2) for what per-node mode cannot do -- ``--sync`` (it needs
    SSH: put the files on every node) and spare hosts -- for a bad identity or secret, and for
    a node count that is not the plan's."""
    from poprun_py.pernode.identity import check_nnodes, resolve_identity
    from poprun_py.pernode.secret import read_secret

    env = os.environ if environ is None else environ
    unavailable = {"--sync": sync, "--spare-hosts": bool(prep.long_run.spares)}
    for flag, given in unavailable.items():
        if given:
            raise UsageError(f"{flag} is not available in per-node mode (docs/per-node.md)")
    opts = prep.options
    node = resolve_identity(opts.node_rank, opts.nnodes, opts.coordinator, env)
    secret = read_secret(opts.secret_file, env)
    check_nnodes(node, prep.plan)
    return node, secret


def per_node(
    prep: Prepared,
    node: NodeIdentity,
    secret: bytes,
    join_timeout: float,
    launch: Callable[[Prepared, Backend], None],
    *,
    joined: Callable[[], None] | None = None,
) -> None:
    """Node ``node.rank``'s part: node 0 runs the coordinator, its own node loop (over the
    loopback) and ``launch`` with the joined nodes as its hosts, then tells every node the
    outcome; any other node runs the node loop (``joined``: called once node 0 accepted it;
    SIGTERM and SIGHUP stop it as Ctrl-C does: its agent stops its instances). JobFailed with
    the job's exit code."""
    from poprun_py.pernode.digest import plan_digest
    from poprun_py.pernode.identity import check_nnodes
    from poprun_py.process.signals import interrupting

    check_nnodes(node, prep.plan)
    digest = plan_digest(prep.plan)
    if not node.is_coordinator:
        with interrupting(), _forwarded_signals_kept(node.rank):
            live = prep.host_timeout
            done = node_loop(node, secret, digest, join_timeout, live, joined=joined)
        if done.code:
            raise JobFailed(done.code, done.reason)
        return
    _coordinate(prep, node, secret, digest=digest, join_timeout=join_timeout, launch=launch)


def _coordinate(
    prep: Prepared,
    node: NodeIdentity,
    secret: bytes,
    *,
    digest: str,
    join_timeout: float,
    launch: Callable[[Prepared, Backend], None],
) -> None:
    from poprun_py.pernode.coordinator import Coordinator, PerNodeBackend

    hosts = [h.name for h in prep.plan.cluster.hosts]
    with Coordinator(hosts, secret, digest, node.port, join_timeout) as coordinator:
        here = replace(node, coordinator="127.0.0.1", port=coordinator.port)
        args = (here, secret, digest, join_timeout, prep.host_timeout)
        own = threading.Thread(target=_own_node, args=args, daemon=True, name="poprun-node-0")
        own.start()
        code, lost, reason = EXIT_FAILURE, (), "node 0's launcher failed"
        try:
            launch(replace(prep, backend="ssh"), PerNodeBackend(coordinator))
            code, reason = 0, ""
        except PoprunError as exc:
            code, reason = exc.exit_code, str(exc)
            lost = getattr(getattr(exc, "result", None), "lost_hosts", ())
            raise
        except KeyboardInterrupt:
            code, reason = EXIT_INTERRUPTED, "interrupted"
            raise
        finally:  # a lost node's launcher is not waited for
            coordinator.finish(code, lost=lost, reason=reason)
            own.join(wire.HANDSHAKE_TIMEOUT)


def _own_node(node: NodeIdentity, secret: bytes, digest: str, wait: float, live: float) -> None:
    """Node 0's node loop, beside its coordinator; its failures are the coordinator's to see
    (node 0 does not join: a preflight fault naming it)."""
    try:
        node_loop(node, secret, digest, wait, live)
    except PoprunError as exc:
        log.warning("%s", exc)


@contextlib.contextmanager
def _forwarded_signals_kept(rank: int) -> Iterator[None]:
    """SIGUSR1/SIGUSR2 to a node other than 0 would end its launcher (their default): they
    are node 0's launcher's to forward to every instance, so here they are only logged."""

    def note(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        log.warning("node %d: %s is forwarded by node 0's launcher; send it there", rank, name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, note) for s in FORWARDED}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
