"""Run a piece of a test in a forked child, and aim signals at that child only.

A test of the launcher's signal path must deliver real signals to the process running
``launch``. Sent to pytest itself, a late one (after ``launch`` returned and the handlers were
restored) would kill or interrupt the whole session; sent to a forked child, it can only end
that child. The child's return value (or exception) comes back pickled.

Example (not run here: it forks):

    result = in_child(lambda: launch(...), signals=[(0.2, signal.SIGINT)])
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def in_child(
    fn: Callable[[], T], signals: Sequence[tuple[float, int]] = (), within: float = 60.0
) -> T:
    """``fn()`` run in a forked child of this process, each ``(after, signum)`` of ``signals``
    sent to that child ``after`` seconds after the previous one (never to this process; none
    once the child has ended). Returns ``fn``'s value, or raises its exception."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the outcome back, exit without pytest's clean-up
        os.close(read_end)
        try:
            outcome: tuple[bool, object] = (True, fn())
        except BaseException as exc:
            outcome = (False, exc)
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:
            data = pickle.dumps((False, RuntimeError(f"cannot pickle the outcome: {exc!r}")))
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
        os._exit(0)
    os.close(write_end)
    done = threading.Event()

    def send() -> None:
        for after, signum in signals:
            if done.wait(after):
                return
            os.kill(pid, signum)  # the child is not reaped before this thread ends: still ours

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        data = _read_all(read_end, time.monotonic() + within)
    finally:
        done.set()
        sender.join()
        os.close(read_end)
        if not _exited(pid):  # timed out: it must not outlive the test
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"the child ended without an outcome (wait status {status})")
    ok, value = pickle.loads(data)
    if not ok and not isinstance(value, Exception):  # KeyboardInterrupt would end the session
        raise AssertionError(f"the child raised {value!r}") from value
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _exited(pid: int) -> bool:
    """True once child ``pid`` has exited (a zombie, not yet reaped)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read_all(fd: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("the child did not finish in time")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
