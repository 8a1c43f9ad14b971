"""A tree of SSH (``--fanout K``): poprun-py connects to K hosts, the gateways, and each runs the
OpenSSH clients of the hosts of its subtree (:mod:`poprun_py.hostside.gateway`), as Open MPI's
tree spawn and clush's gateways do. The launcher's CPU then grows with K, not with the hosts:
one connection, one relay and one reader thread per gateway.

:func:`subtrees` places the hosts: the first K are the gateways, the rest are split among them
in order, in blocks (so a subtree is one node set). A host of a subtree gets a
:class:`TreeConnection`: an :class:`~poprun_py.ssh.openssh.OpenSshConnection` whose ``ssh``
processes run on its gateway (:mod:`poprun_py.ssh.remote`: an agent's stream, a command, or a
process with pipes here), so every command that works over OpenSSH -- the agents and their
whole protocol, preflight's commands, ``exec`` -- works through the tree unchanged; the agent's
code goes to each gateway once, not once a host. :class:`GatewayLink` is the launcher's end of one
gateway: it moves the children's bytes to and from the gateway's frames, and when the gateway
is lost (its host, or its connection) every child of it ends at once, saying so: the gateway is
named as the cause, and the subtree's agents, their stdin gone, stop their instances.

The gateways run ``ssh`` with the options the launcher would use (:func:`ssh_options`: the
spec's and the flags' ``--ssh-config``, identity file and known_hosts paths, which a cluster's
shared home gives every host); without them the gateway's own ``~/.ssh`` applies.

Example:

    >>> subtrees(["g1", "g2", "h3", "h4", "h5"], 2)
    {'h3': 'g1', 'h4': 'g1', 'h5': 'g2'}
    >>> subtrees(["g1", "g2"], 2), subtrees(["h1", "h2", "h3"], None)
    ({}, {})
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from poprun_py.core.spec import HostSpec
from poprun_py.hostside.bundle import over_stdin, payload
from poprun_py.hostside.gateway import CHUNK, frame, frames
from poprun_py.ssh.commands import env_block, remote_command
from poprun_py.ssh.connection import OutputFn, RemoteResult
from poprun_py.ssh.errors import ConnectionLost, TransportError
from poprun_py.ssh.openssh import THROUGH, OpenSshConnection, ssh_failure
from poprun_py.ssh.remote import END_WAIT, Remote, RemoteChild, RemoteRun, RemoteStream
from poprun_py.ssh.settings import Endpoint, SshSettings
from poprun_py.ssh.streams import Stream

if TYPE_CHECKING:
    from poprun_py.ssh.connection import Connection

log = logging.getLogger("poprun_py")
R = TypeVar("R", bound=Remote)
START_HOLD = 30.0  # at most this long does a silent child hold its connect-window slot


def subtrees(names: Sequence[str], fanout: int | None) -> dict[str, str]:
    """Each host reached through a gateway, and its gateway: the first ``fanout`` hosts are
    the gateways, the others follow in blocks (flat -- {} -- without a fanout, or with one
    that covers every host)."""
    if not fanout or fanout >= len(names):
        return {}
    gateways, rest = names[:fanout], names[fanout:]
    return {name: gateways[i * fanout // len(rest)] for i, name in enumerate(rest)}


def plain_endpoint(host: HostSpec, settings: SshSettings) -> Endpoint:
    """A subtree host's Endpoint from its spec and the settings alone: its gateway's ``ssh``
    resolves its configuration there (not ``ssh -G`` here, once per host)."""
    known = (settings.known_hosts,) if settings.known_hosts is not None else ()
    return Endpoint(
        name=host.name,
        hostname=host.address or host.name,
        port=host.port or 22,
        user=host.user or settings.user or "",
        identity_files=(),
        explicit_identity=False,
        key_names=(),
        known_hosts=known,
        record_to=None,
    )


class GatewayLink:
    """The launcher's end of one gateway (:mod:`poprun_py.hostside.gateway`), on its host's
    connection: frames out through a writer thread (a full window never stops the reader),
    the children's bytes in through one reader thread (``poll``, no descriptor limit)."""

    def __init__(self, conn: Connection):
        self.name = conn.name
        self.stream = conn.agent_stream(over_stdin())
        self.children: dict[int, Remote] = {}
        self.why = ""  # why the gateway is gone ('' while it serves)
        self._number = 0
        self._lock = threading.Lock()
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._wake, self._woken = os.pipe()
        self._poller = select.poll()  # the reader thread's own, as is _watched
        self._watched: dict[int, Remote] = {}
        self._new: list[Remote] = []  # started, their stdin not yet watched
        self._stuck: set[Remote] = set()  # output waiting for room in their pipes
        self._holds: list[tuple[float, Remote]] = []  # (when, remote) for :meth:`hold`
        self._out.put(payload("gateway").data)
        self._cached: set[str] = set()  # the programs the gateway holds (frame c)
        for target, name in ((self._write, "w"), (self._read, "r")):
            threading.Thread(
                target=target, daemon=True, name=f"poprun-gw{name}-{self.name}"
            ).start()

    @property
    def alive(self) -> bool:
        """True while the gateway serves."""
        return not self.why

    def spawn(self, host: str, argv: Sequence[str]) -> RemoteChild:
        """Start ``argv`` on the gateway, as a Popen with pipes here (:class:`RemoteChild`)."""
        return self.open(host, argv, lambda n: RemoteChild(self, n, host, argv))

    def open(self, host: str, argv: Sequence[str], make: Callable[[int], R]) -> R:
        """Start ``argv`` on the gateway, held here as ``make(its number)``; ConnectionLost
        naming the gateway once it is gone."""
        with self._lock:
            if self.why:
                raise ConnectionLost(host, f"{host}: through gateway {self.name}: {self.why}")
            self._number += 1
            child = make(self._number)
            # queued before the reader can see the child: its stdin's frames come after
            self.send(b"o", child.number, json.dumps(list(argv)).encode("utf-8", "surrogateescape"))
            self.children[child.number] = child
            self._new.append(child)
        with contextlib.suppress(OSError):  # the reader watches the new child's stdin
            os.write(self._woken, b"c")
        return child

    def feed(self, child: Remote, entry: str) -> None:
        """The gateway writes the program ``entry``'s payload to ``child``'s stdin, ahead of
        what is written there later: sent to the gateway once (``c``), not once a host."""
        data = payload(entry).data
        with self._lock:  # queued under the lock: no other host's f can pass this c
            if entry not in self._cached:
                self._cached.add(entry)
                self.send(b"c", 0, entry.encode() + b"\0" + data)
        self.send(b"f", child.number, entry.encode())

    def hold(self, remote: Remote) -> None:
        """Call ``remote.started`` (its ``on_started``: a connect-window slot's release) after
        :data:`START_HOLD` seconds if it has not said anything by then."""
        with self._lock:
            self._holds.append((time.monotonic() + START_HOLD, remote))
        with contextlib.suppress(OSError):
            os.write(self._woken, b"h")

    def _expire(self) -> float | None:
        """Release the holds that are due; seconds until the next one (None: none left)."""
        now = time.monotonic()
        with self._lock:
            due = [r for at, r in self._holds if at <= now]
            self._holds = [(at, r) for at, r in self._holds if at > now and r.on_started]
            left = min((at for at, _ in self._holds), default=None)
        for remote in due:
            remote.started()
        return None if left is None else max(0.0, left - now)

    def send(self, kind: bytes, number: int, data: bytes = b"") -> None:
        """One frame to the gateway (queued: never waits)."""
        self._out.put(frame(kind, number, data))

    def close(self) -> None:
        """End the gateway: EOF on its stdin (it ends every child left and exits)."""
        self._out.put(None)

    def _write(self) -> None:
        while (data := self._out.get()) is not None:
            try:
                self.stream.write(data)
            except OSError:
                break
        self.stream.send_eof()

    def _read(self) -> None:
        buffer = bytearray()
        self._poller.register(self.stream.fileno(), select.POLLIN)
        self._poller.register(self._wake, select.POLLIN)
        try:
            while True:
                self._watch()
                stuck, hold = self._unstick(), self._expire()
                # bytes the stream took in already (its last look) do not wake the poll
                wait = 0 if self.stream.ready() else 0.2 if stuck else hold
                wait = hold if hold is not None and wait is not None and hold < wait else wait
                for fd, _ in self._poller.poll(None if wait is None else wait * 1000):
                    if fd == self._wake:
                        os.read(self._wake, 4096)
                    elif fd in self._watched:
                        self._take_stdin(fd)
                ended = self.stream.ended()  # first: once ended, every byte has arrived
                got, buffer = frames(buffer + self.stream.read())
                for kind, number, body in got:
                    self._frame(kind, number, body)
                if ended and not self.stream.ready():
                    break
        finally:
            self._lost(self.stream.last_words() or "its connection closed")

    def _watch(self) -> None:
        """Watch the stdin of every child started since the last look."""
        with self._lock:
            new, self._new = self._new, []
        for child in new:
            if child.feed >= 0:
                self._watched[child.feed] = child
                self._poller.register(child.feed, select.POLLIN)

    def _take_stdin(self, fd: int) -> None:
        child = self._watched[fd]
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        if data:
            self.send(b"i", child.number, data)
            return
        self._unwatch(child)
        self.send(b"e", child.number)

    def _unwatch(self, child: Remote) -> None:
        """Stop reading the child's stdin (its end came, or the child's)."""
        if child.feed in self._watched:
            self._poller.unregister(child.feed)
            del self._watched[child.feed]
        if child.feed >= 0:
            os.close(child.feed)
            child.feed = -1

    def _unstick(self) -> bool:
        """Pass on what waits for room in a child's pipe; True while some still waits (the
        reader then looks again on a timer). Only the children with something waiting."""
        for child in list(self._stuck):
            self._settle(child, child.flush())
        return bool(self._stuck)

    def _settle(self, child: Remote, left: bool) -> None:
        """Note whether ``child`` has output waiting; forget it once it ended and all is passed."""
        if left:
            self._stuck.add(child)
        else:
            self._stuck.discard(child)
        if child.returncode is not None:
            with self._lock:
                self.children.pop(child.number, None)

    def _frame(self, kind: bytes, number: int, body: bytes) -> None:
        with self._lock:
            child = self.children.get(number)
        if kind == b"g" or child is None:
            return
        if kind in (b"1", b"2"):
            self._settle(child, child.deliver(kind, body))
        elif kind == b"x":
            self._unwatch(child)
            self._settle(child, child.exited(int(body or b"255")))

    def _lost(self, said: str) -> None:
        """The gateway is gone: one warning names it and its hosts still running, and each of
        those children ends, saying so on its stderr, exit 255 (as ssh's own failure:
        :func:`~poprun_py.ssh.openssh.transport_error` types it)."""
        with self._lock:
            self.why = self.why or f"gateway {self.name} lost: {said}"
            children, self.children = list(self.children.values()), {}
        running = sorted({c.host for c in children if c.exit_code is None})
        if running:
            from ClusterShell.NodeSet import NodeSet

            hosts = NodeSet.fromlist(running)
            log.warning("gateway %s lost (%s): %s lost with it", self.name, said, hosts)
        for child in children:
            self._unwatch(child)
            if child.exit_code is None:
                self._settle(child, child.exited(255, f"ssh: lost with gateway {self.name}\n"))
        deadline = time.monotonic() + END_WAIT  # what is still to be read here, passed on
        while self._unstick() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._out.put(None)
        for fd in (self._wake, self._woken):
            with contextlib.suppress(OSError):
                os.close(fd)


class TreeConnection(OpenSshConnection):
    """A host of a subtree: an :class:`~poprun_py.ssh.openssh.OpenSshConnection` whose ``ssh``
    processes run on its gateway (``ssh`` as the gateway finds it on PATH): an agent's stream
    is a :class:`~poprun_py.ssh.remote.RemoteStream`, a command a
    :class:`~poprun_py.ssh.remote.RemoteRun`, anything else a
    :class:`~poprun_py.ssh.remote.RemoteChild`. With a ``window`` (the pool's connect window),
    an ``ssh`` holds a slot from its start until it first says something (it got in) or ends,
    as a flat connection's handshake does: a thousand handshakes at once on a loaded machine
    would each be slow enough to time out."""

    def __init__(
        self,
        host: HostSpec,
        endpoint: Endpoint,
        settings: SshSettings,
        link: GatewayLink,
        window: threading.Semaphore | None = None,
    ):
        super().__init__(host, endpoint, settings, f"{THROUGH}{link.name}")
        self.link, self.window = link, window
        self._remotes: set[Remote] = set()

    def __repr__(self) -> str:
        return f"TreeConnection({self.endpoint.user}@{self.endpoint.label} via {self.link.name})"

    @property
    def alive(self) -> bool:
        """True until closed, while its gateway serves."""
        return not self._closed and self.link.alive

    def options(self) -> list[str]:
        """The launcher's ``ssh`` options, for the gateway's ``ssh``."""
        return ["ssh", *super().options()[1:]]

    def agent_stream(self, argv: Sequence[str]) -> Stream:
        """``argv`` (an agent's bootstrap) through the gateway's ``ssh``, as a stream."""
        command = remote_command(argv, None, None, report_pid=False)
        return self._open(command, lambda n: RemoteStream(self.link, n, self.name))

    def agent_failure(self, stream: Stream) -> Callable[[], TransportError] | None:
        """ssh's refusal on the gateway (typed from what it said), saying so."""
        if not isinstance(stream, RemoteStream):
            return None
        return lambda: self._from_gateway(ssh_failure(self.name, stream.said(), stream.returncode))

    def send_program(self, stream: Stream, entry: str) -> None:
        """The gateway feeds ``entry`` from its copy (:meth:`GatewayLink.feed`)."""
        if isinstance(stream, Remote):
            self.link.feed(stream, entry)
        else:
            super().send_program(stream, entry)

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: OutputFn | None = None,
        cancel: threading.Event | None = None,
    ) -> RemoteResult:
        """As over OpenSSH, with no thread or pipe here; a failure to reach the host says
        which gateway could not."""
        started = time.monotonic()
        command = remote_command(argv, env, cwd, report_pid=True)
        child = self._open(command, lambda n: RemoteRun(self.link, n, self.name, on_output))
        with contextlib.suppress(BrokenPipeError):  # it ended at once: its output says why
            child.write_stdin(env_block(env) if env else b"")
            child.write_stdin(stdin or b"")
        child.close_stdin()
        try:
            return self._finish(child.output, argv, started, timeout, cancel)
        except TransportError as exc:
            raise self._from_gateway(exc) from None

    def _from_gateway(self, exc: TransportError) -> TransportError:
        """``exc`` as seen from the gateway (the hosts of a tree must reach each other)."""
        if self.link.why or f"gateway {self.link.name}" in exc.detail:
            return exc
        detail = exc.detail.removeprefix(f"{self.name}: ")
        return type(exc)(self.name, f"{self.name}: from gateway {self.link.name}: {detail}")

    def _popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """A Popen with pipes here (SFTP's ``ssh -s``)."""
        child = self._hold(lambda: self.link.spawn(self.name, argv))
        with self._children_lock:
            self._children = {c for c in self._children if c.poll() is None} | {child}
        return child

    def _open(self, command: str, make: Callable[[int], R]) -> R:
        """``ssh ... HOST command`` on the gateway, held here as ``make(its number)``."""
        argv = [*self.options(), "--", self.host.name, command]
        remote = self._hold(lambda: self.link.open(self.name, argv, make))
        with self._children_lock:
            self._remotes = {r for r in self._remotes if r.poll() is None} | {remote}
        return remote

    def _hold(self, start: Callable[[], R]) -> R:
        """``start()`` within the window: its slot is free once the process said something."""
        if self.window is None:
            return start()
        self.window.acquire()
        try:
            remote = start()
        except BaseException:
            self.window.release()
            raise
        remote.on_started = self.window.release
        self.link.hold(remote)
        return remote

    def close(self) -> None:
        """End every process on the gateway this connection started that still runs."""
        with self._children_lock:
            remotes, self._remotes = self._remotes, set()
        for remote in remotes:
            remote.end_group(1.0)
        super().close()
