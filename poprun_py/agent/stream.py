"""The transport seam under the agent protocol (:mod:`poprun_py.hostside.protocol`): a
:class:`Stream` is one byte stream to one host's agent -- its stdin one way, its stdout the
other. The protocol's users (:class:`~poprun_py.agent.client.AgentConnection`,
:class:`~poprun_py.agent.client.AgentLink`, :mod:`poprun_py.agent.relay`,
:mod:`poprun_py.backends.ssh`) talk to a Stream only, never to the transport beneath.

A Paramiko channel is one transport (:class:`ChannelStream`); an OpenSSH client process is
another (:class:`ProcessStream`: its stdin and stdout pipes, the end of its stdout as the
end, its stderr kept for :meth:`Stream.last_words`); a per-node launch's joined node is the
third (:class:`SocketStream`: a TCP connection, authenticated before, whose far end relays an
agent's stdin and stdout: :mod:`poprun_py.pernode.node`). Each connection makes its own
(:meth:`~poprun_py.ssh.connection.Connection.agent_stream`); the protocol and the SSH
transports' streams live beside the connections (:mod:`poprun_py.ssh.streams`: the ssh package
does not import this one) and are the same names here. :mod:`poprun_py.testing.streams` has a
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
import socket

from poprun_py.ssh.streams import (
    DIAGNOSTICS_KEPT,
    BufferedStream,
    ChannelStream,
    ProcessStream,
    Stream,
    last_line,
)

__all__ = [
    "DIAGNOSTICS_KEPT",
    "ChannelStream",
    "ProcessStream",
    "SocketStream",
    "Stream",
    "last_line",
]


class SocketStream(BufferedStream):
    """A connected socket as a :class:`Stream`: what arrives in (read without waiting), what
    is written out (all of it, waiting for room), the peer's close (or a reset) as the end.
    There is no diagnostics channel: :attr:`said` (set by whoever knows why the peer ended,
    '' by default) is the last words."""

    def __init__(self, sock: socket.socket, said: str = ""):
        super().__init__()
        self.sock = sock
        sock.setblocking(True)
        self.said = said

    def _chunk(self) -> bytes | None:
        """What the socket holds."""
        try:
            return self.sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:  # reset, or closed here
            return b""

    def fileno(self) -> int:
        """The socket: readable while data is unread, and at its end (-1 once closed)."""
        return self.sock.fileno()

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
