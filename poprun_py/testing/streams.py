"""A fake :class:`~poprun_py.agent.stream.Stream` for tests of the agent protocol: the client
end is a real socket (select and selectors work on it), the far end is driven by the test.

:class:`FakeStream` is the client end; its :class:`FakePeer` (``stream.peer``) is the far one:
``deliver`` bytes split anywhere, say nothing for a while (silence, loss), ``hang_up`` --
after half a record if the test likes -- and read what the client sent, line by line, to answer
requests in any order. :class:`AgentBehind` puts the real agent
(``python -m poprun_py.hostside.agent``, a subprocess) on the far end instead; what passes
each way goes through a :class:`Valve` the test can hold (silence, released later) or make
drop (loss), or cut into pieces. :class:`LocalGatewayHost` runs a tree's gateway
(:mod:`poprun_py.hostside.gateway`) here, for tests of :class:`~poprun_py.ssh.tree.GatewayLink`.

Example::

    behind = AgentBehind()                          # the real agent, behind the fake stream
    agent = AgentConnection("h1", behind.stream)
    agent.run(["true"]).code                        # 0, answered by the real agent
    behind.down.hold()                              # the host falls silent ...
    behind.close()

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> stream = FakeStream()
    >>> stream.write(b"run {}\\nput")                 # the client's side
    >>> stream.peer.read_line(1.0), stream.peer.read_line(0.05)
    (b'run {}', None)
    >>> stream.peer.deliver(b"R {}\\n"); stream.read()
    b'R {}\\n'
    >>> stream.close(); stream.peer.read_line(1.0), stream.peer.closed()
    (None, True)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from poprun_py.agent.stream import DIAGNOSTICS_KEPT, ProcessStream, last_line
from poprun_py.hostside.supervision import readable

AGENT = (sys.executable, "-m", "poprun_py.hostside.agent")
"""The real agent, run from this checkout (no bootstrap: the tests are about the stream)."""
ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding poprun_py


class FakeStream:
    """The client end of a fake stream (a :class:`~poprun_py.agent.stream.Stream`)."""

    def __init__(self) -> None:
        self.sock, far = socket.socketpair()
        self.peer = FakePeer(far)
        self.closed = False

    def fileno(self) -> int:
        """The socket's descriptor: readable when bytes wait or the far side hung up."""
        return self.sock.fileno()

    def ready(self) -> bool:
        """Bytes wait unread (looked at, not taken)."""
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, OSError):
            return False

    def read(self) -> bytes:
        """Every byte that waits, without waiting."""
        data = b""
        while not self.closed:
            try:
                chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            data += chunk
        return data

    def ended(self) -> bool:
        """The peer hung up, or this end was closed."""
        return self.closed or self.peer.hung_up.is_set()

    def write(self, data: bytes) -> None:
        """All of ``data`` to the peer; OSError once it (or this end) is closed."""
        if self.closed:
            raise BrokenPipeError("the fake stream is closed")
        self.sock.sendall(data)

    def send_eof(self) -> None:
        """The peer reads the end."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close this end: the peer reads the end, and writes to it fail."""
        self.closed = True
        self.sock.close()

    def last_words(self) -> str:
        """What the peer last said on its diagnostics (:meth:`FakePeer.complain`)."""
        return last_line(self.peer.diagnostics)


class FakePeer:
    """The far end of a :class:`FakeStream`, driven by the test (any thread)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.hung_up = threading.Event()
        self.diagnostics = b""
        self.received = b""  # read from the client, not yet taken by read_line
        self.eof = False  # the client closed its direction

    def deliver(self, data: bytes) -> None:
        """``data`` to the client, as one piece (the client may still read it in several)."""
        self.sock.sendall(data)

    def complain(self, text: bytes) -> None:
        """Say ``text`` on the diagnostics (stderr): the client's ``last_words``."""
        self.diagnostics = (self.diagnostics + text)[-DIAGNOSTICS_KEPT:]

    def hang_up(self, last_words: str = "") -> None:
        """Close the peer's output (the client reads the end after what was delivered, a half
        record included), with ``last_words`` on the diagnostics."""
        if last_words:
            self.complain(last_words.encode() + b"\n")
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        self.hung_up.set()

    def vanish(self) -> None:
        """Gone at once, both ways (a host cut off, a process killed)."""
        self.hung_up.set()
        self.sock.close()

    def read_line(self, timeout: float) -> bytes | None:
        """The client's next line (without the newline), waiting up to ``timeout`` seconds;
        None if none came by then, or the client's direction ended first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.received:
            left = deadline - time.monotonic()
            if self.eof or left <= 0 or not readable([self.sock], left):
                return None
            chunk = self.sock.recv(65536)
            self.eof = not chunk
            self.received += chunk
        line, _, self.received = self.received.partition(b"\n")
        return line

    def closed(self, timeout: float = 1.0) -> bool:
        """True if the client's direction ends within ``timeout`` (after what it sent)."""
        deadline = time.monotonic() + timeout
        while not self.eof and self.read_line(max(0.0, deadline - time.monotonic())) is not None:
            pass
        return self.eof


class Valve:
    """What passes one way between a fake stream and the agent behind it: everything as it
    comes (in pieces of ``chunk`` bytes if set), or held back (silence, let through on
    :meth:`open`), or dropped (loss)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = "open"
        self.held = b""
        self.chunk = 0  # > 0: forward in pieces of this many bytes, each written alone
        self.passed = 0  # bytes let through so far
        self.send: Callable[[bytes], None] = lambda data: None

    def open(self) -> None:
        """Let everything through again, what was held first."""
        with self.lock:
            self.mode, held, self.held = "open", self.held, b""
            self._forward(held)

    def hold(self) -> None:
        """Keep what comes from now on, until :meth:`open`."""
        with self.lock:
            self.mode = "hold"

    def drop(self) -> None:
        """Lose what comes from now on, until :meth:`open`."""
        with self.lock:
            self.mode = "drop"

    def pass_on(self, data: bytes) -> None:
        """Data from the source: forwarded, kept or lost, by the mode."""
        with self.lock:
            if self.mode == "hold":
                self.held += data
            elif self.mode == "open":
                self._forward(data)

    def _forward(self, data: bytes) -> None:
        size = self.chunk or len(data) or 1
        for start in range(0, len(data), size):
            self.send(data[start : start + size])
            self.passed += len(data[start : start + size])


class AgentBehind:
    """The real agent in a subprocess on the far end of a :class:`FakeStream`: ``up``
    (client to agent) and ``down`` (agent to client) are its :class:`Valve` s; its stderr is
    the stream's diagnostics, its exit the stream's end."""

    def __init__(self, argv: Sequence[str] = AGENT) -> None:
        self.stream = FakeStream()
        peer = self.stream.peer
        env = {**os.environ, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.up, self.down = Valve(), Valve()
        self.up.send = self._to_agent
        self.down.send = lambda data: _suppressed(peer.deliver, data)
        self.threads = [
            _thread(self._pump_up),
            _thread(lambda: self._pump(self.proc.stdout, self.down.pass_on, peer.hang_up)),
            _thread(lambda: self._pump(self.proc.stderr, peer.complain, lambda: None)),
        ]

    def _to_agent(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def _pump_up(self) -> None:
        """What the client writes, through ``up``; its end closes the agent's stdin."""
        sock = self.stream.peer.sock
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            self.up.pass_on(data)
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    @staticmethod
    def _pump(
        source: IO[bytes] | None, sink: Callable[[bytes], None], end: Callable[[], None]
    ) -> None:
        assert source is not None
        while data := os.read(source.fileno(), 65536):
            sink(data)
        end()

    def close(self, wait: float = 5.0) -> int:
        """Close the client end (the agent sees its stdin end and stops everything), wait
        for the agent (killed after ``wait`` seconds); its exit code."""
        self.stream.close()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for thread in self.threads:
            thread.join(wait)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        return self.proc.returncode


def _thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True, name="poprun-fake-stream")
    thread.start()
    return thread


def _suppressed(fn: Callable[[bytes], None], data: bytes) -> None:
    with contextlib.suppress(OSError):
        fn(data)


class LocalGatewayHost:
    """A gateway's host for :class:`~poprun_py.ssh.tree.GatewayLink` at its seam: the
    bootstrap it is given runs here, as a process of its own with its stdin and stdout the
    stream (as the gateway runs on its host), so the relay is tested without sshd."""

    name = "gw"

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def agent_stream(self, argv: list[str]) -> ProcessStream:
        """``argv`` started here, as a :class:`~poprun_py.ssh.streams.ProcessStream`."""
        process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            bufsize=0, start_new_session=True,
        )  # fmt: skip
        self.processes.append(process)
        return ProcessStream(process)
