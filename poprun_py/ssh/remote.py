"""A process on a tree's gateway (:mod:`poprun_py.ssh.tree`) as the launcher holds it: a
:class:`Remote` has a number on its gateway's link, gets its output and its end from the link's
reader thread, and sends its stdin, its stdin's end and signals as frames
(:mod:`poprun_py.hostside.gateway`). Three kinds, one per use, so that what a host costs here is
only what its use needs:

- :class:`RemoteStream`: an agent's :class:`~poprun_py.ssh.streams.Stream` (the protocol's
  transport seam), its output kept in memory and a pipe only to wake whoever polls it;
- :class:`RemoteRun`: one command to its end (``run``: ``exec``, preflight's commands), its
  output handed to an :class:`~poprun_py.ssh.openssh.RunOutput` as it comes, no thread;
- :class:`RemoteChild`: a :class:`subprocess.Popen` with three real pipes, for what wants file
  descriptors (SFTP over ``ssh -s``).

Example:

    >>> class Link:
    ...     def send(self, kind, number, data=b""): print(kind, number, data)
    >>> stream = RemoteStream(Link(), 7, "h2")
    >>> stream.write(b"h\\n")
    b'i' 7 b'h\\n'
    >>> _ = stream.deliver(b"1", b"p 0 4\\n"); stream.ready(), stream.read()
    (True, b'p 0 4\\n')
    >>> _ = stream.exited(255, "ssh: lost with gateway g1\\n")
    >>> stream.ended(), stream.ready(), stream.last_words()
    (True, False, 'ssh: lost with gateway g1')
    >>> stream.close()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from poprun_py.ssh.connection import OutputFn
from poprun_py.ssh.openssh import RunOutput
from poprun_py.ssh.streams import DIAGNOSTICS_KEPT, last_line

END_WAIT = 5.0  # after SIGKILL, how long a process on a gateway has to be reported gone


class Sender(Protocol):
    """Where a Remote's frames go (:class:`~poprun_py.ssh.tree.GatewayLink`)."""

    def send(self, kind: bytes, number: int, data: bytes = b"") -> None:
        """One frame to the gateway."""


class Remote:
    """One process on a gateway: its end (:meth:`wait`), signals to its process group there,
    its stdin as frames; the link's reader gives it its output (:meth:`deliver`) and its end
    (:meth:`exited`)."""

    feed = -1  # the pipe the link reads this one's stdin from (RemoteChild's); -1: none

    def __init__(self, link: Sender, number: int, host: str):
        self.link, self.number, self.host = link, number, host
        self.returncode: int | None = None  # once its end is said and its output passed on
        self.exit_code: int | None = None  # its end, as the gateway said it
        self.on_started: Callable[[], None] | None = None  # called once: first output, or end
        self._exited = threading.Event()
        self._eof_sent = False

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for its end; TimeoutExpired after ``timeout`` seconds."""
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"process {self.number} on a gateway", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """``sig`` to its process group on the gateway."""
        if self.returncode is None:
            self.link.send(b"k", self.number, str(int(sig)).encode())

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def end_group(self, grace: float) -> None:
        """SIGTERM, SIGKILL after ``grace`` seconds, until it is reported gone (what
        :func:`poprun_py.ssh.streams.end_process` calls: there is no local pid)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, END_WAIT)):
            if self.returncode is not None:
                return
            self.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(wait)

    def write_stdin(self, data: bytes) -> None:
        """``data`` for its stdin; BrokenPipeError once it has ended or its stdin is closed."""
        if self.exit_code is not None or self._eof_sent:
            raise BrokenPipeError(f"process {self.number} on the gateway: its stdin is closed")
        if data:
            self.link.send(b"i", self.number, data)

    def close_stdin(self) -> None:
        """The end of its stdin (once)."""
        if not self._eof_sent and self.exit_code is None:
            self._eof_sent = True
            self.link.send(b"e", self.number)

    # ---- the link's side

    def deliver(self, kind: bytes, data: bytes) -> bool:
        """Its stdout (``kind`` ``1``) or stderr (``2``); True if some waits to be passed on."""
        self.started()
        self.take(kind, data)
        return self.flush()

    def take(self, kind: bytes, data: bytes) -> None:
        """Keep or pass on ``data`` (each kind its own way)."""
        raise NotImplementedError

    def exited(self, code: int, why: str = "") -> bool:
        """It exited with ``code`` (``why`` on its stderr first: the gateway is gone); True if
        some output still waits."""
        if why:
            self.take(b"2", why.encode())
        self.exit_code = code
        self.started()
        return self.flush()

    def started(self) -> None:
        """Its ssh got in (it said something), or it ended: :attr:`on_started`, once."""
        done, self.on_started = self.on_started, None
        if done is not None:
            done()

    def flush(self) -> bool:
        """Pass on what waits (nothing, but for RemoteChild); once it ended, its exit code."""
        if self.exit_code is not None and not self._exited.is_set():
            self.returncode = self.exit_code
            self._finished()
            self._exited.set()
        return False

    def _finished(self) -> None:
        """Its end is known and its output passed on (before :meth:`wait` returns)."""


class RemoteStream(Remote):
    """An agent's byte stream (:class:`~poprun_py.ssh.streams.Stream`) through a gateway: its
    stdout kept here until read, its stderr's last :data:`DIAGNOSTICS_KEPT` bytes kept for
    :meth:`last_words`, a pipe that is readable while something is unread or once it ended."""

    def __init__(self, link: Sender, number: int, host: str):
        super().__init__(link, number, host)
        self._wake, self._woken = os.pipe()
        os.set_blocking(self._wake, False)
        os.set_blocking(self._woken, False)
        self._pending = bytearray()
        self.stderr = b""
        self._lock = threading.Lock()
        self._closed = False

    def take(self, kind: bytes, data: bytes) -> None:
        """Output kept until read; stderr aside."""
        with self._lock:
            if kind == b"2":
                self.stderr = (self.stderr + data)[-DIAGNOSTICS_KEPT:]
                return
            wake = not self._pending
            self._pending += data
        if wake:
            self._poke()

    def _finished(self) -> None:
        self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):  # full (already readable) or closed
            os.write(self._woken, b".")

    def fileno(self) -> int:
        """Readable while output is unread, and at its end."""
        return self._wake

    def ready(self) -> bool:
        """Unread output."""
        return bool(self._pending)

    def read(self) -> bytes:
        """The unread output."""
        with self._lock:  # the pipe emptied first: output taken after this pokes it again
            if self.exit_code is None:  # at its end it stays readable, as a stream's end is
                with contextlib.suppress(OSError):
                    os.read(self._wake, 4096)
            data, self._pending = bytes(self._pending), bytearray()
        return data

    def ended(self) -> bool:
        """It exited (all its output has arrived), or this side closed it."""
        return self.exit_code is not None or self._closed

    def write(self, data: bytes) -> None:
        """``data`` for its stdin; BrokenPipeError once it has ended."""
        self.write_stdin(data)

    def send_eof(self) -> None:
        """The end of its stdin."""
        self.close_stdin()

    def close(self) -> None:
        """End it (SIGTERM, SIGKILL a second later) and close the pipe."""
        self.close_stdin()
        self.end_group(1.0)
        self._closed = True
        for fd in (self._wake, self._woken):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake = self._woken = -1

    def last_words(self) -> str:
        """The last line of its stderr."""
        return last_line(self.stderr)

    def said(self, wait: float = 2.0) -> str:
        """All of its stderr that was kept, once it has exited (``wait`` seconds at most)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(wait)
        return self.stderr.decode("utf-8", "replace")


class RemoteRun(Remote):
    """One command to its end through a gateway: its output to :attr:`output`, a
    :class:`~poprun_py.ssh.openssh.RunOutput` without threads of its own."""

    def __init__(self, link: Sender, number: int, host: str, on_output: OutputFn | None):
        super().__init__(link, number, host)
        self.output = RunOutput(self, on_output, pump=False)  # type: ignore[arg-type]

    def take(self, kind: bytes, data: bytes) -> None:
        """To the RunOutput, as it came."""
        self.output.take("stdout" if kind == b"1" else "stderr", data)


class RemoteChild(Remote, subprocess.Popen):  # type: ignore[type-arg]
    """A process on a gateway as a :class:`subprocess.Popen` with its three pipes here
    (``bufsize=0``): what is written to :attr:`stdin` reaches its stdin (the link reads
    :attr:`feed`), its stdout and stderr arrive on :attr:`stdout` and :attr:`stderr`, as the
    pipes take them."""

    def __init__(self, link: Sender, number: int, host: str, argv: Sequence[str] = ()):
        Remote.__init__(self, link, number, host)  # no Popen.__init__: nothing starts here
        self.args = list(argv)
        self._child_created = False
        self.pid = -1
        feed, self._in = os.pipe()
        out, self._out = os.pipe()
        err, self._err = os.pipe()
        self.feed = feed
        self.stdin = os.fdopen(self._in, "wb", 0)
        self.stdout = os.fdopen(out, "rb", 0)
        self.stderr = os.fdopen(err, "rb", 0)
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)
        self.waiting = {self._out: bytearray(), self._err: bytearray()}

    def __del__(self) -> None:
        """Nothing to reap here."""

    def take(self, kind: bytes, data: bytes) -> None:
        """Kept until its pipe has room (:meth:`flush`)."""
        self.waiting[self._out if kind == b"1" else self._err] += data

    def flush(self) -> bool:
        """Pass on what waits, as far as the pipes take it; once it ended and all is passed,
        close them and set its exit code. True while something still waits."""
        for fd, data in self.waiting.items():
            try:
                while data:
                    del data[: os.write(fd, data)]
            except BlockingIOError:
                pass
            except OSError:  # nobody reads it any more
                data.clear()
        if any(self.waiting.values()):
            return True
        return super().flush()

    def _finished(self) -> None:
        for fd in self.waiting:
            with contextlib.suppress(OSError):
                os.close(fd)
