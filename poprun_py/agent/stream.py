"""The transport seam under the agent protocol (:mod:`poprun_py.hostside.protocol`): a
:class:`Stream` is one byte stream to one host's agent -- its stdin one way, its stdout the
other. The protocol's users (:class:`~poprun_py.agent.client.AgentConnection`,
:class:`~poprun_py.agent.client.AgentLink`, :mod:`poprun_py.agent.relay`,
:mod:`poprun_py.backends.ssh`) talk to a Stream only, never to the transport beneath.

A Paramiko channel is one transport (:class:`ChannelStream`); an OpenSSH client process is
another (:class:`ProcessStream`: its stdin and stdout pipes, the end of its stdout as the
end, its stderr kept for :meth:`Stream.last_words`); a per-node launch's joined node is the
third (:class:`SocketStream`: a TCP connection, authenticated before, whose far end relays an
agent's stdin and stdout: :mod:`poprun_py.pernode.node`). :mod:`poprun_py.testing.streams` has a
fake one for tests of the protocol.

Example::

    stream = ChannelStream(conn.start(argv))       # the agent's command, on a channel
    stream.write(b"h\\n")                          # a whole line, or OSError
    selectors.DefaultSelector().register(stream, selectors.EVENT_READ)   # it has a fileno
    data = stream.read()                           # what came, without waiting
    if stream.ended() and not stream.ready():      # the far side finished, all read
        why = stream.last_words()                  # e.g. "no python3 on PATH"

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.testing.streams import FakeStream
    >>> stream = FakeStream()
    >>> stream.peer.deliver(b"p 0 4")
    >>> stream.ready(), stream.read(), stream.read()  # bytes as they came; b"": nothing now
    (True, b'p 0 4', b'')
    >>> stream.peer.hang_up("gone")
    >>> stream.ended(), stream.ready(), stream.last_words()
    (True, False, 'gone')
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from typing import TYPE_CHECKING, Protocol

from poprun_py.ssh.openssh import end_process

if TYPE_CHECKING:
    import paramiko

DIAGNOSTICS_KEPT = 4096  # bytes of the far side's diagnostics (stderr) kept for last_words


class Stream(Protocol):
    """A byte stream to one agent. Every method returns at once, except ``write``, which
    waits until the far side has room."""

    def fileno(self) -> int:
        """A file descriptor that select/selectors report readable whenever :meth:`ready`
        is true or the stream has ended."""

    def ready(self) -> bool:
        """True if something arrived that nobody has read yet (the far side is alive)."""

    def read(self) -> bytes:
        """Every byte that has arrived, without waiting: b"" when nothing has."""

    def ended(self) -> bool:
        """True once the far side has finished (its output closed, the process exited, the
        connection dropped) or this side closed the stream; bytes that arrived before may
        still be unread (:meth:`ready`)."""

    def write(self, data: bytes) -> None:
        """Send all of ``data``; OSError when the stream is broken or closed."""

    def send_eof(self) -> None:
        """Close this side's direction (the agent reads the end of its stdin); never raises."""

    def close(self) -> None:
        """Close both directions and release the transport; never raises."""

    def last_words(self) -> str:
        """The last line the far side said on its diagnostics (stderr), '' if none."""


class ChannelStream:
    """A Paramiko channel as a :class:`Stream`: the remote command's stdout in, its stdin out,
    its stderr kept aside (the last :data:`DIAGNOSTICS_KEPT` bytes) for :meth:`last_words`."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel
        self.stderr = b""

    def fileno(self) -> int:
        """Paramiko's pipe, set while output or stderr is unread, and at the channel's end."""
        return self.channel.fileno()

    def ready(self) -> bool:
        """Unread output or stderr."""
        return bool(self.channel.recv_ready() or self.channel.recv_stderr_ready())

    def read(self) -> bytes:
        """The unread output; unread stderr goes aside."""
        channel, data = self.channel, b""
        while channel.recv_stderr_ready():
            self.stderr = (self.stderr + channel.recv_stderr(65536))[-DIAGNOSTICS_KEPT:]
        while channel.recv_ready():
            data += channel.recv(65536)
        return data

    def ended(self) -> bool:
        """The remote command's output ended (EOF), or the channel closed or broke."""
        try:
            return bool(self.channel.closed or self.channel.eof_received)
        except Exception:  # a broken channel has nothing left to wait for
            return True

    def write(self, data: bytes) -> None:
        """All of ``data`` to the command's stdin (Paramiko's EOFError becomes an OSError)."""
        try:
            self.channel.sendall(data)
        except EOFError as exc:
            raise BrokenPipeError(f"the channel is closed: {exc}") from None

    def send_eof(self) -> None:
        """EOF on the command's stdin."""
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()

    def close(self) -> None:
        """Close the channel."""
        with contextlib.suppress(Exception):
            self.channel.close()

    def last_words(self) -> str:
        """The last line of the command's stderr."""
        return last_line(self.stderr)


class ProcessStream:
    """A child process as a :class:`Stream` (the OpenSSH client: ``ssh ... HOST COMMAND``): its
    stdout in (non-blocking), its stdin out, its stderr read by a thread and kept aside (the
    last :data:`DIAGNOSTICS_KEPT` bytes). The process must have been started with all three
    as pipes (``bufsize=0``) and in a session of its own: :meth:`close` ends its group."""

    def __init__(self, process: subprocess.Popen[bytes]):
        assert process.stdin and process.stdout and process.stderr
        self.process = process
        self._out = process.stdout.fileno()
        os.set_blocking(self._out, False)
        self._pending = bytearray()
        self._eof = False
        self.stderr = b""
        self._lock = threading.Lock()
        self._stderr = threading.Thread(target=self._collect, daemon=True, name="poprun-stderr")
        self._stderr.start()

    def _collect(self) -> None:
        assert self.process.stderr is not None
        fd = self.process.stderr.fileno()
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self.stderr = (self.stderr + chunk)[-DIAGNOSTICS_KEPT:]

    def _pull(self) -> None:
        """Move what the pipe holds into the buffer; note its end."""
        with self._lock:
            while not self._eof:
                try:
                    chunk = os.read(self._out, 65536)
                except BlockingIOError:
                    return
                except (OSError, ValueError):  # closed here
                    chunk = b""
                if not chunk:
                    self._eof = True
                self._pending += chunk

    def fileno(self) -> int:
        """The stdout pipe: readable while output is unread, and at its end."""
        return self._out

    def ready(self) -> bool:
        """Unread output."""
        self._pull()
        return bool(self._pending)

    def read(self) -> bytes:
        """The unread output."""
        self._pull()
        with self._lock:
            data, self._pending = bytes(self._pending), bytearray()
        return data

    def ended(self) -> bool:
        """The process's stdout ended (it exited, or the far side closed), or it was closed."""
        self._pull()
        return self._eof

    def write(self, data: bytes) -> None:
        """All of ``data`` to the process's stdin; BrokenPipeError once it is gone."""
        stdin = self.process.stdin
        if stdin is None or stdin.closed:
            raise BrokenPipeError("the stream is closed")
        view = memoryview(data)
        while view:
            written = os.write(stdin.fileno(), view)
            view = view[written:]

    def send_eof(self) -> None:
        """Close the process's stdin."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()

    def close(self) -> None:
        """Close stdin, end the process (SIGTERM to its group, SIGKILL a second later), reap
        it and close its pipes."""
        self.send_eof()
        end_process(self.process)
        with self._lock:
            self._eof = True
            with contextlib.suppress(OSError, ValueError):
                if self.process.stdout is not None:
                    self.process.stdout.close()
        self._stderr.join(1.0)
        with contextlib.suppress(OSError, ValueError):
            if self.process.stderr is not None and not self._stderr.is_alive():
                self.process.stderr.close()

    def said(self, wait: float = 2.0) -> str:
        """All of the process's stderr that was kept, once it has exited (``wait`` seconds at
        most)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait)
        self._stderr.join(wait)
        return self.stderr.decode("utf-8", "replace")

    def last_words(self) -> str:
        """The last line of the process's stderr."""
        self._stderr.join(0.2 if self.process.poll() is not None else 0.0)
        return last_line(self.stderr)


class SocketStream:
    """A connected socket as a :class:`Stream`: what arrives in (read without waiting), what
    is written out (all of it, waiting for room), the peer's close (or a reset) as the end.
    There is no diagnostics channel: :attr:`said` (set by whoever knows why the peer ended,
    '' by default) is the last words."""

    def __init__(self, sock: socket.socket, said: str = ""):
        self.sock = sock
        sock.setblocking(True)
        self._pending = bytearray()
        self._eof = False
        self._lock = threading.Lock()
        self.said = said

    def _pull(self) -> None:
        """Move what the socket holds into the buffer; note its end."""
        with self._lock:
            while not self._eof:
                try:
                    chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:  # reset, or closed here
                    chunk = b""
                if not chunk:
                    self._eof = True
                self._pending += chunk

    def fileno(self) -> int:
        """The socket: readable while data is unread, and at its end (-1 once closed)."""
        return self.sock.fileno()

    def ready(self) -> bool:
        """Unread data."""
        self._pull()
        return bool(self._pending)

    def read(self) -> bytes:
        """The unread data."""
        self._pull()
        with self._lock:
            data, self._pending = bytes(self._pending), bytearray()
        return data

    def ended(self) -> bool:
        """The peer closed its side (or the connection broke), or this side closed it."""
        self._pull()
        return self._eof

    def write(self, data: bytes) -> None:
        """All of ``data``; OSError (BrokenPipeError, ConnectionResetError) once it is broken."""
        if self.sock.fileno() < 0:
            raise BrokenPipeError("the stream is closed")
        self.sock.sendall(data)

    def send_eof(self) -> None:
        """Shut down this side's direction: the peer reads the end."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Shut down both directions and close the socket."""
        with self._lock:
            self._eof = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def last_words(self) -> str:
        """Why the peer ended, when someone said (:attr:`said`)."""
        return self.said


def last_line(text: bytes) -> str:
    """The last non-empty line of ``text``, decoded ('' if none)."""
    said = text.decode("utf-8", "replace").strip().splitlines()
    return said[-1].strip() if said else ""
