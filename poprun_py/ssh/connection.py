"""One host's authenticated SSH connection (:class:`Connection`): every channel -- commands,
SFTP, agents, heartbeats -- goes over its one paramiko Transport, which itself may run inside a
jump host's direct-tcpip channel (``ProxyJump``).

Example::

    conn = connect(HostSpec("h1"), SshSettings())      # poprun_py.ssh.connect
    conn.run(["hostname"]).stdout                      # 'h1\\n'
    conn.run(["sleep", "60"], timeout=1.0)             # RemoteTimeout; the remote group is killed

    >>> RemoteResult("h1", 0, "ok\\n", "", 0.1).exit_code
    0
"""

from __future__ import annotations

import contextlib
import posixpath
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poprun_py.core.spec import HostSpec
from poprun_py.hostside.bundle import payload
from poprun_py.hostside.supervision import readable
from poprun_py.ssh.commands import env_block, remote_command
from poprun_py.ssh.errors import Cancelled, ConnectionLost, RemoteTimeout, TransportError
from poprun_py.ssh.settings import Endpoint
from poprun_py.ssh.streams import ChannelStream, Stream

if TYPE_CHECKING:
    import paramiko

OutputFn = Callable[[str, bytes], None]
"""``on_output(stream, data)``: ``stream`` is ``"stdout"`` or ``"stderr"``; data as it arrives."""

KILL_GRACE = 2.0
CANCEL_POLL = 0.1
_INLINE_STDIN = 64 * 1024


@dataclass(frozen=True)
class RemoteResult:
    """How one remote command ended, with its whole output."""

    host: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float


class Connection:
    """One host's authenticated SSH connection; every channel goes over its one Transport."""

    logs_in = True  # each command is a login session on the host (sshd, the user's shell)

    def __init__(
        self,
        host: HostSpec,
        endpoint: Endpoint,
        transport: paramiko.Transport,
        via: Connection | None = None,
    ):
        self.host = host
        self.endpoint = endpoint
        self.transport = transport
        self.via = via  # the jump host's connection that carries this one, if any
        self._on_close: list[Callable[[], None]] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Connection({self.endpoint.user}@{self.endpoint.label})"

    @property
    def name(self) -> str:
        """The host's name (the pool's key)."""
        return self.host.name

    @property
    def jumps(self) -> tuple[Connection, ...]:
        """The jump hosts' connections this one goes through, the first hop first."""
        chain: list[Connection] = []
        hop = self.via
        while hop is not None:
            chain.insert(0, hop)
            hop = hop.via
        return tuple(chain)

    @property
    def alive(self) -> bool:
        """True while the transport is up."""
        return self.transport.is_active()

    def open_channel(self) -> paramiko.Channel:
        """A new session channel (for streaming); raises ConnectionLost if the host is gone."""
        import paramiko

        try:
            return self.transport.open_session(timeout=self.endpoint_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(self.name, f"lost the connection to {self.label}: {exc}") from None

    @property
    def label(self) -> str:
        """``h2 (198.18.0.12)``."""
        return self.endpoint.label

    @property
    def endpoint_timeout(self) -> float:
        """The handshake timeout, reused for opening channels."""
        return float(self.transport.handshake_timeout)

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        report_pid: bool = False,
    ) -> paramiko.Channel:
        """Start ``argv`` on a new channel (env sent on stdin first); stdin stays open."""
        import paramiko

        chan = self.open_channel()
        try:
            chan.exec_command(remote_command(argv, env, cwd, report_pid=report_pid))
            if env:
                chan.sendall(env_block(env))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise ConnectionLost(self.name, f"lost the connection to {self.label}: {exc}") from None
        return chan

    def agent_stream(self, argv: Sequence[str]) -> Stream:
        """The transport seam: ``argv`` (an agent's bootstrap) started on a new channel, as
        a :class:`~poprun_py.ssh.streams.Stream`."""
        return ChannelStream(self.start(argv))

    def send_program(self, stream: Stream, entry: str) -> None:
        """Send the program ``entry`` of :mod:`poprun_py.hostside` (its payload) to the
        bootstrap ``stream`` started (:meth:`agent_stream`); OSError when it is broken."""
        stream.write(payload(entry).data)

    def agent_failure(self, stream: Stream) -> Callable[[], TransportError] | None:
        """Why ``stream`` (from :meth:`agent_stream`) ended before its agent said a word, typed
        by the transport; None: a plain ConnectionLost says it."""
        return None

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
        """Run ``argv`` to the end and return its exit code and output.

        ``on_output`` sees output as it arrives. After ``timeout`` seconds, or once ``cancel`` is
        set, the command's process group is sent SIGTERM (SIGKILL 2 s later) and RemoteTimeout
        or Cancelled is raised.
        """
        started = time.monotonic()
        watched = timeout is not None or cancel is not None
        chan = self.start(argv, env=env, cwd=cwd, report_pid=watched)
        with contextlib.closing(chan):
            reader = _Reader(chan, on_output, expect_pid=watched, cancel=cancel)
            _send_stdin(chan, stdin)
            deadline = None if timeout is None else started + timeout
            status = reader.pump(deadline)
            if status != "done":
                self._stop(reader)
                raise self._stopped_error(status, argv, timeout)
            code = chan.exit_status
        if code < 0 and not self.alive:
            raise ConnectionLost(self.name, f"lost the connection to {self.label}")
        code = code if code >= 0 else 255  # killed by a signal: no exit status, 255 like ssh
        out, err = reader.text()
        return RemoteResult(self.name, code, out, err, time.monotonic() - started)

    def _stopped_error(
        self, status: str, argv: Sequence[str], timeout: float | None
    ) -> TransportError:
        if status == "cancelled":
            return Cancelled(self.name, f"{self.label}: {shlex.join(argv)} was stopped")
        return RemoteTimeout(
            self.name, f"{self.label}: {shlex.join(argv)} timed out after {timeout:g} s"
        )

    def signal_group(self, pgid: int, signame: str = "TERM") -> None:
        """Send ``signame`` to the remote process group ``pgid`` (over a new channel)."""
        with contextlib.suppress(TransportError):
            self.run(["kill", "-s", signame, "--", f"-{pgid}"], timeout=None)

    def _stop(self, reader: _Reader) -> None:
        """SIGTERM the command's process group; SIGKILL if it is still there after the grace."""
        if reader.pid is None or reader.pid <= 0:
            return
        self.signal_group(reader.pid, "TERM")
        reader.cancel = None
        if reader.pump(time.monotonic() + KILL_GRACE) != "done":
            self.signal_group(reader.pid, "KILL")

    def sftp(self) -> paramiko.SFTPClient:
        """This connection's SFTP session, opened once."""
        import paramiko

        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(self.transport)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise ConnectionLost(self.name, f"no SFTP on {self.label}: {exc}") from None
                if self._sftp is None:
                    raise ConnectionLost(self.name, f"no SFTP on {self.label}")
            return self._sftp

    def put_text(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write ``text`` to the remote ``path`` with ``mode`` (set before any byte is written),
        creating parent directories."""
        sftp = self.sftp()
        makedirs(sftp, posixpath.dirname(path))
        with sftp.open(path, "w") as handle:
            handle.chmod(mode)
            handle.write(text.encode("utf-8", "surrogateescape"))

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` after this connection is closed (e.g. to close its own jump hosts)."""
        self._on_close.append(fn)

    def close(self) -> None:
        """Close SFTP and the transport (then whatever :meth:`on_close` was given)."""
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self.transport.close()
        for fn in self._on_close:
            with contextlib.suppress(Exception):
                fn()


def makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP."""
    if path in ("", "/", "."):
        return
    try:
        sftp.stat(path)
        return
    except OSError:
        pass
    makedirs(sftp, posixpath.dirname(path))
    with contextlib.suppress(OSError):  # created meanwhile by another writer
        sftp.mkdir(path)


def _send_stdin(chan: paramiko.Channel, data: bytes | None) -> None:
    """Send ``data`` then EOF; large inputs go from a thread so output cannot deadlock."""
    if not data:
        chan.shutdown_write()
        return
    if len(data) <= _INLINE_STDIN:
        chan.sendall(data)
        chan.shutdown_write()
        return

    def send() -> None:
        with contextlib.suppress(OSError, EOFError):
            chan.sendall(data)
            chan.shutdown_write()

    threading.Thread(target=send, daemon=True, name="poprun-stdin").start()


@dataclass
class _Reader:
    """Collects a channel's stdout and stderr; strips the pid line when one is expected."""

    chan: paramiko.Channel
    on_output: OutputFn | None
    expect_pid: bool
    cancel: threading.Event | None = None
    pid: int | None = None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    _head: bytearray = field(default_factory=bytearray)

    def pump(self, deadline: float | None) -> str:
        """Read until EOF and the exit status: ``done``, or ``timeout`` / ``cancelled`` first."""
        chan = self.chan
        while not (chan.eof_received or chan.closed):
            wait = self._wait(deadline)
            if wait is not None and wait <= 0:
                return self._why()
            readable([chan], wait)
            self.drain()
        self.drain()
        while not (chan.status_event.is_set() or chan.closed):
            wait = self._wait(deadline)
            if wait is not None and wait <= 0:
                return self._why()
            chan.status_event.wait(wait)
        return "done"

    def _wait(self, deadline: float | None) -> float | None:
        """How long to block: until the deadline, in short steps while cancellable."""
        if self.cancel is not None and self.cancel.is_set():
            return 0.0
        wait = None if deadline is None else deadline - time.monotonic()
        if self.cancel is not None:
            wait = CANCEL_POLL if wait is None else min(wait, CANCEL_POLL)
        return wait

    def _why(self) -> str:
        return "cancelled" if self.cancel is not None and self.cancel.is_set() else "timeout"

    def drain(self) -> None:
        """Take whatever output has arrived."""
        while self.chan.recv_ready():
            self._stdout(self.chan.recv(65536))
        while self.chan.recv_stderr_ready():
            data = self.chan.recv_stderr(65536)
            self.err += data
            if self.on_output:
                self.on_output("stderr", data)

    def _stdout(self, data: bytes) -> None:
        if self.expect_pid and self.pid is None:
            self._head += data
            line, sep, rest = self._head.partition(b"\n")
            if not sep:
                return
            self.pid = int(line) if line.strip().isdigit() else -1
            data = bytes(rest)
        if data:
            self.out += data
            if self.on_output:
                self.on_output("stdout", data)

    def text(self) -> tuple[str, str]:
        """stdout and stderr decoded (UTF-8, undecodable bytes replaced)."""
        return self.out.decode(errors="replace"), self.err.decode(errors="replace")
