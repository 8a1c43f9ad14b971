"""A signal that a helper thread takes wakes the runner's poll at once.

The kernel hands a process's signal to any thread that does not block it, and Python runs its
handlers in the main thread only, when that thread next runs bytecode: a main thread asleep in
``poll`` would not notice until something else woke it. :func:`handling_signals` makes every
signal write to the Control's wake-up pipe as it arrives (``signal.set_wakeup_fd``).

Each test runs in a forked child (tests/unit/in_child.py), whose helper thread takes the
signal: no signal is aimed at pytest, and neither its handlers nor its wake-up fd change. A
child that a signal ended (its handler gone) fails its test alone."""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from poprun_py.process.signals import Control, handling_signals
from tests.unit.in_child import in_child


def in_select(tid: int) -> bool:
    """Whether thread ``tid`` of this process sleeps in select/poll (its kernel wait channel)."""
    with open(f"/proc/self/task/{tid}/wchan") as handle:
        wchan = handle.read()
    return "poll" in wchan or "select" in wchan


def taken_by_a_helper_thread(sig: int) -> threading.Thread:
    """A helper thread that, once the main thread sleeps in select (polled against a
    deadline), takes ``sig`` itself."""
    main = threading.get_native_id()

    def helper() -> None:
        deadline = time.monotonic() + 2.0  # then signal anyway: the select waits 5 s
        while not in_select(main) and time.monotonic() < deadline:
            time.sleep(0.001)
        signal.pthread_kill(threading.get_ident(), sig)

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    return thread


def woken(control: Control, sig: int) -> bool:
    """Whether the main thread's select on the wake-up pipe returns (within 5 s: without the
    wake-up fd it would wait all of them) after a helper thread took ``sig``."""
    helper = taken_by_a_helper_thread(sig)
    readable, _, _ = select.select([control.wake_fd], [], [], 5.0)
    helper.join(5)
    return readable == [control.wake_fd]


def forwarded() -> tuple[bool, list[int]]:
    control = Control()
    with handling_signals(control):
        control.arm()
        woke = woken(control, signal.SIGUSR1)
        control.drain()
        taken = control.take_forwards()
    control.close()
    return woke, taken


def test_a_forwarded_signal_taken_by_a_helper_thread_wakes_the_poll() -> None:
    assert in_child(forwarded, within=30) == (True, [signal.SIGUSR1])


def interrupted() -> tuple[bool, bool]:
    control = Control()
    with handling_signals(control):
        control.arm()
        woke = woken(control, signal.SIGTERM)
        stopped = control.interrupted
    control.close()
    return woke, stopped


def test_an_interrupt_taken_by_a_helper_thread_wakes_the_poll() -> None:
    assert in_child(interrupted, within=30) == (True, True)


def wakeup_fds() -> tuple[bool, bool]:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    try:
        control = Control()
        with handling_signals(control):
            ours = signal.set_wakeup_fd(control.signal_fd) == control.signal_fd  # meanwhile
        control.close()
        return ours, signal.set_wakeup_fd(-1) == write_end
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read_end)
        os.close(write_end)


def test_the_old_wakeup_fd_comes_back_afterwards() -> None:
    assert in_child(wakeup_fds, within=30) == (True, True)
