"""The one signal path: what SIGINT, SIGTERM and SIGHUP mean for every backend, ``exec`` and
``sync``, and the stop requests a running job is driven by.

A :class:`Control` is handed to whatever runs a job (a backend's running handle, the ``exec``
fan-out). It carries two kinds of request, both thread-safe and safe to make from a signal
handler, each waking the runner's poll loop through a pipe (:attr:`Control.wake_fd`):

- :meth:`Control.interrupt` -- the user's stop (a signal): every instance is stopped, the
  result is *interrupted* (exit 130); a second interrupt means "kill now";
- :meth:`Control.stop` -- a stop the launcher's rules decided (an instance failed, a host was
  lost, a clock ran out): every instance is stopped gracefully, the result keeps its root cause;
- :meth:`Control.forward` -- a signal for every instance on every host (SIGUSR1/SIGUSR2 sent to
  poprun-py, or the launcher's request for stack dumps); the runner takes it with
  :meth:`Control.take_forwards` when woken and signals its instances (``Running.signal``),
  and the job goes on;
- :meth:`Control.dump` -- the launcher's request for a hung job's stacks (a
  :class:`DumpRequest`): the runner takes it with :meth:`Control.take_dumps`, dumps every
  running instance with ``py-spy dump`` where py-spy is installed on its host, sends SIGUSR1 to
  the others that registered faulthandler, and says :meth:`Control.dumped` when done (the
  launcher waits for that, bounded, with :meth:`Control.wait_dumped`).

Runners report every instance's end to :meth:`Control.ended`; the launcher's policy (by default
:func:`fail_fast`) turns a failure into :meth:`Control.stop`. So the rule "the first failure
stops everything" lives once, here, not in each backend; so does telling whoever listens
(:meth:`Control.listening`: the hang clock's progress) that an instance ended.
:meth:`Control.stop` is atomic and says whether it was the first stop: a clock that fires as
an instance fails does not claim the failure as its own.

:func:`handling_signals` installs the handlers (main thread only; the old ones come back after).
While a job is running (``control.armed``) a signal becomes :meth:`Control.interrupt`; before
that (connecting, preflight, staging) it raises KeyboardInterrupt, which the CLI turns into
exit 130 with nothing left started. The forwarded signals (``Control(forwarding=...)``, by
default SIGUSR1 and SIGUSR2: :data:`FORWARD_SIGNALS`; ``--forward-signals``,
:func:`parse_forward_signals`) become :meth:`Control.forward` while armed and are ignored before
(they no longer kill poprun-py); a forwarded SIGHUP no longer stops the job.
A restarted job keeps its Control: :meth:`Control.next_attempt` clears the rule's stop and
disarms it (:meth:`Control.disarm`), so that until the next attempt runs (the restart delay,
reconnecting, preflight, staging) a stop signal raises KeyboardInterrupt again and SIGUSR1 and
SIGUSR2 are ignored.
:func:`deferring` holds the stop signals during a clean-up that must finish (a teardown).

Example:

    >>> parse_forward_signals("usr2,SIGHUP") == (signal.SIGUSR2, signal.SIGHUP)
    True
    >>> control = Control()
    >>> control.arm()
    >>> control.forward(10); control.take_forwards(), control.take_forwards()
    ([10], [])
    >>> control.dump(DumpRequest(frozenset({0}), every=True)); control.take_dumps()
    [DumpRequest(faulthandler=frozenset({0}), every=True)]
    >>> control.dumped(signalled=True); control.wait_dumped(0), control.dump_signalled
    (True, True)
    >>> control.stop("instance 1 on h2 failed"), control.stop("timed out after 5 s")
    (True, False)
    >>> control.next_attempt(); control.armed, control.stopping
    (False, False)
    >>> control.interrupt(); control.interrupts, control.stopping, control.interrupted
    (1, True, True)
    >>> control.close()
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from poprun_py.errors import UsageError

if TYPE_CHECKING:
    from poprun_py.core.result import InstanceResult

STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)
)
"""The signals that stop a job (and ``exec``/``sync``) the same way on every backend."""
_RECEIVED: list[int] = []
"""The stop signals this process took while poprun-py handled them, in order
(:func:`stopped_by`)."""


def stopped_by(since: int = 0) -> int | None:
    """The last stop signal (SIGINT, SIGTERM, SIGHUP) poprun-py took, of those after the first
    ``since`` (:func:`stops_so_far`); None when none came: the CLI says which signal stopped
    it, not merely "interrupted"."""
    return _RECEIVED[-1] if len(_RECEIVED) > since else None


def stops_so_far() -> int:
    """How many stop signals poprun-py has taken so far (for :func:`stopped_by`)."""
    return len(_RECEIVED)


FORWARD_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, n) for n in ("SIGUSR1", "SIGUSR2") if hasattr(signal, n)
)
"""The signals poprun-py passes on to every instance of a running job by default (the job goes
on); ``--forward-signals`` chooses others among :data:`FORWARDABLE`."""
FORWARDABLE: tuple[str, ...] = tuple(
    n for n in ("SIGUSR1", "SIGUSR2", "SIGHUP") if hasattr(signal, n)
)
"""The signals ``--forward-signals`` may name: poprun-py handles each of them itself."""


def parse_forward_signals(text: str, flag: str = "--forward-signals") -> tuple[int, ...]:
    """``USR1,sigusr2,HUP`` as signal numbers, in the order given (duplicates dropped); names
    with or without ``SIG``, any case. UsageError (exit 2, nothing started) for an empty list,
    an unknown name, or a signal poprun-py cannot pass on (KILL, STOP, INT, TERM, CHLD...)."""
    chosen: list[int] = []
    for word in (w.strip() for w in text.split(",")):
        name = word.upper() if word.upper().startswith("SIG") else "SIG" + word.upper()
        if name not in FORWARDABLE:
            what = "unknown" if not hasattr(signal, name) else "cannot be forwarded"
            names = ", ".join(n[3:] for n in FORWARDABLE)
            raise UsageError(f"{flag} {word or '(empty)'}: {what}; choose among {names}")
        if getattr(signal, name) not in chosen:
            chosen.append(getattr(signal, name))
    return tuple(chosen)


def forward_signals(text: str | None, backend: str) -> tuple[int, ...]:
    """``--forward-signals`` (or the spec's ``defaults.forward_signals``) for ``backend``:
    :data:`FORWARD_SIGNALS` when not given; UsageError (exit 2, nothing started) for a bad name
    (:func:`parse_forward_signals`) or one the backend's launcher cannot pass on."""
    if text is None:
        return FORWARD_SIGNALS
    from poprun_py.core.backends import capabilities

    chosen = parse_forward_signals(text)
    cannot = dict(capabilities(backend).unforwardable)
    for signum in chosen:
        why = cannot.get(signal.Signals(signum).name)
        if why is not None:
            name = signal.Signals(signum).name[3:]
            raise UsageError(f"--forward-signals {name}: not with --backend {backend} ({why})")
    return chosen


T = TypeVar("T")

Policy = Callable[["Control", "InstanceResult"], None]
"""Called with every instance's end; may call ``control.stop(reason)``."""


def fail_fast(control: Control, result: InstanceResult) -> None:
    """The default policy: the first instance that fails (or whose host is lost) stops all."""
    if result.failed:
        control.stop(f"instance {result.index} on {result.host} failed")


@dataclass(frozen=True)
class DumpRequest:
    """A hung job's stacks, asked for: ``py-spy dump`` where installed; otherwise SIGUSR1 to
    the instances in ``faulthandler`` (those that registered it; ``every``: all of them did,
    so a launcher that can only signal every instance at once may do so)."""

    faulthandler: frozenset[int]
    every: bool


class Control:
    """Stop requests for one running job, with a wake-up pipe for the runner's poll loop."""

    def __init__(
        self, policy: Policy | None = fail_fast, forwarding: tuple[int, ...] = FORWARD_SIGNALS
    ):
        self.policy = policy
        self.forwarding = forwarding  # the signals passed on to every instance (--forward-signals)
        self.interrupts = 0
        self.stop_reason: str | None = None
        self.armed = False
        self._forwards: list[int] = []
        self._dumps: list[DumpRequest] = []
        self._dumped = threading.Event()
        self.dump_signalled = False  # the last dump sent SIGUSR1 to some instance
        self._listeners: list[Callable[[InstanceResult], None]] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @property
    def wake_fd(self) -> int:
        """Readable whenever a request was made: register it in the runner's poller."""
        return self._wake_r

    @property
    def signal_fd(self) -> int:
        """The pipe's write end, for :func:`signal.set_wakeup_fd`: a signal that the kernel
        hands to another thread than the main one (any thread may take it) must still wake the
        main thread's poll at once, which then runs the Python handler."""
        return self._wake_w

    @property
    def stopping(self) -> bool:
        """True once any stop (interrupt or rule) was requested."""
        return self.interrupts > 0 or self.stop_reason is not None

    @property
    def interrupted(self) -> bool:
        """True when the user interrupted (a signal), not merely a rule."""
        return self.interrupts > 0

    @property
    def kill_now(self) -> bool:
        """True after a second interrupt: SIGKILL without waiting for the grace period."""
        return self.interrupts > 1

    def arm(self) -> None:
        """The job is running: from now on a stop signal interrupts it instead of raising."""
        self.armed = True

    def disarm(self) -> None:
        """No job runs (between attempts): a stop signal raises KeyboardInterrupt again."""
        self.armed = False

    def interrupt(self) -> None:
        """The user asked to stop (Ctrl-C, SIGTERM, SIGHUP). Safe in a signal handler."""
        self.interrupts += 1
        self.wake()

    def stop(self, reason: str) -> bool:
        """The launcher's rules ask every instance to stop. The first reason is kept: True
        when this was the first stop (neither a rule nor the user had stopped the job), in one
        step, so that two stops racing each other (a clock, an instance's failure) cannot
        both believe they were first."""
        with self._lock:
            first = self.stop_reason is None and not self.interrupts
            if self.stop_reason is None:
                self.stop_reason = reason
        self.wake()
        return first

    def forward(self, signum: int) -> None:
        """Ask the runner to send ``signum`` to every instance. Safe in a signal handler
        (list.append is atomic; no lock taken)."""
        self._forwards.append(signum)
        self.wake()

    def take_forwards(self) -> list[int]:
        """The signals asked for since the last call, oldest first (the runner sends them)."""
        return _take(self._forwards)

    def dump(self, request: DumpRequest) -> None:
        """Ask the runner for every running instance's stacks (see :class:`DumpRequest`)."""
        self._dumped.clear()
        self.dump_signalled = False
        self._dumps.append(request)
        self.wake()

    def take_dumps(self) -> list[DumpRequest]:
        """The dumps asked for since the last call (the runner does them)."""
        return _take(self._dumps)

    def dumped(self, signalled: bool) -> None:
        """The runner has every stack it could get (``signalled``: SIGUSR1 went to some
        instance, whose faulthandler output may still be on its way)."""
        self.dump_signalled = signalled
        self._dumped.set()

    def wait_dumped(self, timeout: float) -> bool:
        """True once :meth:`dumped` was said, waiting up to ``timeout`` seconds."""
        return self._dumped.wait(timeout)

    def next_attempt(self) -> None:
        """A restart begins: disarm, forget the last attempt's rule stop and pending forwards
        (an interrupt is never forgotten: an interrupted job is not restarted)."""
        self.disarm()
        with self._lock:
            self.stop_reason = None
        self._forwards.clear()
        self._dumps.clear()
        self.drain()

    def ended(self, result: InstanceResult) -> None:
        """A runner reports one instance's end: every listener hears of it, then the policy
        decides what follows."""
        for listener in tuple(self._listeners):
            listener(result)
        if self.policy is not None:
            self.policy(self, result)

    @contextlib.contextmanager
    def listening(self, listener: Callable[[InstanceResult], None]) -> Iterator[None]:
        """``listener`` hears of every instance's end while this is active (one attempt)."""
        self._listeners.append(listener)
        try:
            yield
        finally:
            self._listeners.remove(listener)

    def wake(self) -> None:
        """Make :attr:`wake_fd` readable."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def drain(self) -> None:
        """Empty the wake-up pipe (the runner has seen the requests)."""
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass

    def close(self) -> None:
        """Close the wake-up pipe."""
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _take(queue: list[T]) -> list[T]:
    """Everything in ``queue``, oldest first, leaving it empty (appends may go on meanwhile:
    from a signal handler, or another thread)."""
    taken = []
    while queue:
        taken.append(queue.pop(0))
    return taken


@contextlib.contextmanager
def handling_signals(control: Control) -> Iterator[Control]:
    """SIGINT, SIGTERM and SIGHUP go to ``control`` while this is active (main thread only):
    an interrupt once the job runs, KeyboardInterrupt before. A closed terminal (SIGHUP) must
    not leave instances running either -- unless SIGHUP is forwarded (``control.forwarding``,
    ``--forward-signals``): then, like every forwarded signal, it goes to every instance while
    the job runs and is ignored before. SIGUSR1 and SIGUSR2 not forwarded are ignored (they do
    not kill poprun-py, nor reach any instance). Every signal also writes to ``control``'s
    wake-up pipe (:attr:`Control.signal_fd`) as it arrives, on whichever thread: Python runs
    its handlers in the main thread only, so a signal taken by a helper thread (the relay's,
    paramiko's) would otherwise wait until the runner's poll woke for something else."""
    if threading.current_thread() is not threading.main_thread():
        yield control
        return

    def on_signal(signum: int, frame: object) -> None:
        _RECEIVED.append(signum)
        if not control.armed:
            raise KeyboardInterrupt
        control.interrupt()

    def on_forward(signum: int, frame: object) -> None:
        if control.armed and signum in control.forwarding:
            control.forward(signum)

    old: dict[int, Any] = {}
    old_fd: int | None = None
    try:  # installed inside: a Ctrl-C meanwhile must not leave the pipe as the wake-up fd
        old_fd = signal.set_wakeup_fd(control.signal_fd, warn_on_full_buffer=False)
        forwarded = frozenset(control.forwarding)
        old.update({s: signal.signal(s, on_signal) for s in STOP_SIGNALS if s not in forwarded})
        old.update({s: signal.signal(s, on_forward) for s in forwarded | set(FORWARD_SIGNALS)})
        yield control
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if old_fd is not None:
            signal.set_wakeup_fd(old_fd)  # (warning again on a full buffer: the default)


@contextlib.contextmanager
def interrupting() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt while this is active (main thread
    only): for commands without a running job to stop gracefully (``exec``, ``sync``), whose
    own clean-up then stops what they started on every host."""
    control = Control(policy=None)
    try:
        with handling_signals(control):
            yield
    finally:
        control.close()


@contextlib.contextmanager
def deferring(note: Callable[[int], None] | None = None) -> Iterator[list[int]]:
    """SIGINT, SIGTERM and SIGHUP are held while this is active (main thread only): a clean-up
    that must finish (``launch --up --down`` tearing the cluster down) is not cut short by a
    second Ctrl-C. Each signal that arrives is recorded in the yielded list and passed to
    ``note`` (e.g. to say "still tearing down"); the old handlers come back afterwards."""
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return

    def on_signal(signum: int, frame: object) -> None:
        arrived.append(signum)
        _RECEIVED.append(signum)
        if note is not None:
            note(signum)

    old = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield arrived
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
