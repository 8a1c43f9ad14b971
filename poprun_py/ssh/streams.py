"""The agent's byte streams over SSH transports: the :class:`Stream` protocol (the transport
seam of :mod:`poprun_py.agent.stream`, which documents it and adds the per-node socket), a
Paramiko channel (:class:`ChannelStream`) and an OpenSSH client process
(:class:`ProcessStream`), which reads as the per-node socket's stream does
(:class:`BufferedStream`: chunks read without waiting, kept until read). Here, beside the
connections that make them (:meth:`~poprun_py.ssh.connection.Connection.agent_stream`), so
that the ssh package does not import the agent package that uses them.

Example:

    >>> last_line(b"Warning: added host key\\nssh: connect to host h2: No route to host\\n")
    'ssh: connect to host h2: No route to host'
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import TYPE_CHECKING, Protocol

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


class BufferedStream:
    """The reading half that :class:`ProcessStream` and the per-node socket's stream share:
    their transport is read in chunks without waiting (:meth:`_chunk`, which each gives), what
    arrived is kept until it is read, and the transport's end is noted (also by ``close``)."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._eof = False
        self._lock = threading.Lock()

    def _chunk(self) -> bytes | None:
        """What the transport holds now, without waiting: b"" at its end, None for nothing."""
        raise NotImplementedError

    def _pull(self) -> None:
        """Move what the transport holds into the buffer; note its end."""
        with self._lock:
            while not self._eof:
                chunk = self._chunk()
                if chunk is None:
                    return
                if not chunk:
                    self._eof = True
                self._pending += chunk

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
        """The transport ended (the peer closed or the connection broke; the process's stdout
        ended), or this side closed it."""
        self._pull()
        return self._eof


class ProcessStream(BufferedStream):
    """A child process as a :class:`Stream` (the OpenSSH client: ``ssh ... HOST COMMAND``): its
    stdout in (non-blocking), its stdin out, its stderr read by a thread and kept aside (the
    last :data:`DIAGNOSTICS_KEPT` bytes). The process must have been started with all three
    as pipes (``bufsize=0``) and in a session of its own: :meth:`close` ends its group."""

    def __init__(self, process: subprocess.Popen[bytes]):
        assert process.stdin and process.stdout and process.stderr
        super().__init__()
        self.process = process
        self._out = process.stdout.fileno()
        os.set_blocking(self._out, False)
        self.stderr = b""
        self._stderr = threading.Thread(target=self._collect, daemon=True, name="poprun-stderr")
        self._stderr.start()

    def _collect(self) -> None:
        assert self.process.stderr is not None
        fd = self.process.stderr.fileno()
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                self.stderr = (self.stderr + chunk)[-DIAGNOSTICS_KEPT:]

    def _chunk(self) -> bytes | None:
        """What the stdout pipe holds."""
        try:
            return os.read(self._out, 65536)
        except BlockingIOError:
            return None
        except (OSError, ValueError):  # closed here
            return b""

    def fileno(self) -> int:
        """The stdout pipe: readable while output is unread, and at its end."""
        return self._out

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


def last_line(text: bytes) -> str:
    """The last non-empty line of ``text``, decoded ('' if none)."""
    said = text.decode("utf-8", "replace").strip().splitlines()
    return said[-1].strip() if said else ""


def end_process(process: subprocess.Popen[bytes], grace: float = 1.0) -> None:
    """SIGTERM ``process``'s group (it leads a session of its own), SIGKILL after ``grace``
    seconds, and reap it; nothing when it has exited already. Never raises."""
    end_group = getattr(process, "end_group", None)
    if end_group is not None:  # a process on a gateway (poprun_py.ssh.tree.RemoteChild)
        end_group(grace)
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
