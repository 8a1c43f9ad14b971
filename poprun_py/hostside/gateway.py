"""A tree's gateway (``--fanout K``): on one of the K hosts poprun-py connects to, it runs the
OpenSSH clients of the hosts of its subtree, each a child in a session of its own, and relays
their stdin, stdout, stderr and exit codes to and from poprun-py over its own stdin and stdout.
What travels through a child is whatever poprun-py runs on its host -- an agent and its whole
protocol (heartbeats, output, exit codes, stacks, signals), a preflight command, ``exec``'s
command -- so none of it is written again here.

Frames both ways: a kind (one byte), the child's number and the data's length (4 bytes each,
big-endian), the data. poprun-py sends ``o`` (start the child: its argv, JSON), ``i`` (bytes
for its stdin), ``e`` (close its stdin) and ``k`` (a signal number, for its process group),
and ``c`` (a program's payload, ``NAME\\0DATA``, kept) once, so that ``f`` (NAME) writes it to a
child's stdin without sending it again for every host (the agent's is 200 kB); the
gateway sends ``g`` once when it runs, then ``1``/``2`` (the child's stdout/stderr) and ``x``
(its exit code, once both are read to their end and it is reaped; a child that cannot start
says why on ``2`` and exits 255, as ``ssh`` does when it cannot connect). At the end of its
stdin (poprun-py closed it, or is gone) the gateway ends every child -- SIGTERM to its group,
SIGKILL two seconds later -- and exits: the subtree's agents see their stdin end and stop.

Standard library only, Python 3.7 and later (it ships like the agent,
:mod:`poprun_py.hostside.bundle`).

Example:

    >>> frame(b"x", 3, b"0")
    b'x\\x00\\x00\\x00\\x03\\x00\\x00\\x00\\x010'
    >>> frames(bytearray(frame(b"i", 1, b"ab") + b"x"))
    ([(b'i', 1, b'ab')], bytearray(b'x'))
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from typing import Any

HEAD = 9  # kind (1), child (4), length (4)
CHUNK = 65536
KILL_AFTER = 2.0  # seconds from SIGTERM to SIGKILL for the children left at the end
REAP_POLL = 0.05


def frame(kind: bytes, child: int, data: bytes = b"") -> bytes:
    """One frame."""
    return kind + child.to_bytes(4, "big") + len(data).to_bytes(4, "big") + data


def frames(buffer: bytearray) -> tuple[list[tuple[bytes, int, bytes]], bytearray]:
    """The whole frames at the start of ``buffer``, and what is left of it."""
    got, at = [], 0
    while len(buffer) - at >= HEAD:
        size = int.from_bytes(buffer[at + 5 : at + 9], "big")
        if len(buffer) - at - HEAD < size:
            break
        kind, child = bytes(buffer[at : at + 1]), int.from_bytes(buffer[at + 1 : at + 5], "big")
        got.append((kind, child, bytes(buffer[at + HEAD : at + HEAD + size])))
        at += HEAD + size
    return got, buffer[at:]


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (blocking)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Child:
    """One relayed process: its pipes, the bytes waiting for its stdin, its open outputs."""

    def __init__(self, number: int, process: subprocess.Popen):  # type: ignore[type-arg]
        self.number, self.process = number, process
        self.waiting = bytearray()  # for its stdin, not yet taken
        self.close_stdin = False  # poprun-py said e: close it once ``waiting`` is written
        self.open = 2  # stdout and stderr, until each reaches its end


class Gateway:
    """The relay: poprun-py's frames in on ``fd_in``, the children's out on ``fd_out``."""

    def __init__(self, fd_in: int = 0, fd_out: int = 1):
        self.fd_in, self.fd_out = fd_in, fd_out
        self.children: dict[int, Child] = {}
        self.selector = selectors.DefaultSelector()
        self.buffer = bytearray()
        self.ended = False  # poprun-py's side ended
        self.programs: dict[bytes, bytes] = {}  # name -> payload, for f (sent once: c)

    def send(self, kind: bytes, number: int, data: bytes = b"") -> None:
        """One frame to poprun-py; its end (EPIPE) ends the gateway's input too."""
        try:
            write_all(self.fd_out, frame(kind, number, data))
        except OSError:
            self.ended = True

    def serve(self) -> None:
        """Relay until poprun-py's side ends and every child is gone."""
        self.selector.register(self.fd_in, selectors.EVENT_READ, None)
        self.send(b"g", 0)
        while not self.ended:
            timeout = REAP_POLL if any(c.open == 0 for c in self.children.values()) else None
            for key, events in self.selector.select(timeout):
                self._event(key.data, key.fileobj, events)
            self._reap()
        self._end_all()

    def _event(self, what: tuple[Child, bytes] | None, fileobj: Any, events: int) -> None:
        if what is None:
            self._from_poprun()
            return
        child, stream = what
        if stream == b"i":
            self._feed(child)
            return
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""
        if data:
            self.send(stream, child.number, data)
            return
        self.selector.unregister(fileobj)
        child.open -= 1

    def _from_poprun(self) -> None:
        try:
            data = os.read(self.fd_in, CHUNK)
        except OSError:
            data = b""
        if not data:
            self.ended = True
            return
        got, self.buffer = frames(self.buffer + data)
        for kind, number, body in got:
            self._order(kind, number, body)

    def _order(self, kind: bytes, number: int, body: bytes) -> None:
        if kind == b"o":
            self._start(number, json.loads(body.decode("utf-8", "surrogateescape")))
            return
        if kind == b"c":
            name, _, data = body.partition(b"\0")
            self.programs[name] = data
            return
        child = self.children.get(number)
        if child is None:
            return  # ended already: nothing left to give it
        if kind == b"i":
            child.waiting += body
        elif kind == b"f":
            child.waiting += self.programs.get(body, b"")
        elif kind == b"e":
            child.close_stdin = True
        elif kind == b"k":
            with contextlib.suppress(OSError, ValueError):
                os.killpg(child.process.pid, int(body))
        self._feed(child)

    def _start(self, number: int, argv: list[str]) -> None:
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                bufsize=0, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            why = "poprun-py gateway: cannot start {}: {}\n".format(argv[0] if argv else "?", exc)
            self.send(b"2", number, why.encode())
            self.send(b"x", number, b"255")
            return
        child = Child(number, process)
        self.children[number] = child
        assert process.stdin and process.stdout and process.stderr
        os.set_blocking(process.stdin.fileno(), False)
        self.selector.register(process.stdout, selectors.EVENT_READ, (child, b"1"))
        self.selector.register(process.stderr, selectors.EVENT_READ, (child, b"2"))

    def _feed(self, child: Child) -> None:
        """Write what waits for the child's stdin, as far as the pipe takes it; watch the pipe
        while some is left; close it once all is written after an ``e``."""
        stdin = child.process.stdin
        if stdin is None or stdin.closed:
            child.waiting.clear()
            return
        try:
            while child.waiting:
                written = os.write(stdin.fileno(), child.waiting)
                del child.waiting[:written]
        except BlockingIOError:
            pass
        except OSError:  # the child is gone: its input with it
            child.waiting.clear()
        watched = self._watched(stdin)
        if child.waiting and not watched:
            self.selector.register(stdin, selectors.EVENT_WRITE, (child, b"i"))
        elif not child.waiting and watched:
            self.selector.unregister(stdin)
        if not child.waiting and child.close_stdin:
            stdin.close()

    def _watched(self, fileobj: Any) -> bool:
        try:
            self.selector.get_key(fileobj)
        except KeyError:
            return False
        return True

    def _reap(self) -> None:
        """Report every child whose outputs ended and that has exited."""
        for number, child in list(self.children.items()):
            if child.open == 0 and child.process.poll() is not None:
                stdin = child.process.stdin
                if stdin is not None and not stdin.closed:
                    if self._watched(stdin):
                        self.selector.unregister(stdin)
                    stdin.close()
                del self.children[number]
                self.send(b"x", number, str(child.process.returncode).encode())

    def _end_all(self) -> None:
        """SIGTERM every child's group, SIGKILL what is left after :data:`KILL_AFTER`."""
        for sig, wait in ((signal.SIGTERM, KILL_AFTER), (signal.SIGKILL, KILL_AFTER)):
            left = [c for c in self.children.values() if c.process.poll() is None]
            for child in left:
                with contextlib.suppress(OSError):
                    os.killpg(child.process.pid, sig)
            deadline = time.monotonic() + wait
            while left and time.monotonic() < deadline:
                left = [c for c in left if c.process.poll() is None]
                time.sleep(REAP_POLL)


def main() -> None:
    """Serve poprun-py on stdin and stdout, then exit at once (no interpreter teardown)."""
    Gateway().serve()
    os._exit(0)


if __name__ == "__main__":
    main()
