"""Fakes at the seams: a :class:`FakeBackend` and a :class:`FakeProvider` that satisfy the real
interfaces, for unit tests of what drives them (as ``fabric.testing`` and Invoke's
``MockContext`` do). They run no process and open no connection, but they keep real time and
honour the real :class:`~poprun_py.process.signals.Control`, so the launcher's rules (fail-fast,
root cause, exit codes, signals) are exercised as they are with real backends.

A fake instance is scripted with :class:`Script`: exit with a code after some seconds, hang
until stopped, ignore SIGTERM (then it ends only at the SIGKILL after the grace period), or lose
its host. Every call is recorded in ``calls``.

Example:

    >>> from poprun_py.launch.launcher import RunSettings, launch
    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="h1,h2", program=("t",)), environ={})
    >>> fake = FakeBackend({0: Script(exit_code=3, after=0.01), 1: Script(hang=True)})
    >>> result = launch(prep, RunSettings(), backend=fake)
    >>> result.root_cause.index, result.exit_code, [r.state.value for r in result.instances]
    (0, 3, ['exited', 'stopped'])
    >>> fake.calls
    ['open', 'preflight', 'stage', 'start', 'wait', 'close']
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poprun_py.backends.base import Checked, Defaults
from poprun_py.core.backends import Capabilities
from poprun_py.core.result import (
    InstanceResult,
    InstanceState,
    LaunchResult,
    RunOptions,
    RunSettings,
)
from poprun_py.errors import Fault, PreflightError
from poprun_py.hostside.supervision import readable
from poprun_py.process.progress import FAULTHANDLER, is_marker
from poprun_py.providers.base import ProvisionContext
from poprun_py.providers.records import Node, ProvisionRecord, Resource

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec
    from poprun_py.core.topology import Topology
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control, DumpRequest
    from poprun_py.render.job import RenderedJob

SIGKILL = 9
SIGUSR1 = 10


@dataclass(frozen=True)
class Script:
    """What one fake instance does once started."""

    exit_code: int = 0
    after: float = 0.0  # seconds from the start until it exits (or its host is lost)
    hang: bool = False  # never ends by itself
    lost: bool = False  # its host stops answering at ``after``
    ignores_term: bool = False  # a stop ends it only at SIGKILL, after the grace period
    output: tuple[str, ...] = ()  # stdout lines it prints when it starts
    faulthandler: bool = False  # registers faulthandler: SIGUSR1 prints a stack on stderr
    pyspy: bool = False  # py-spy can dump it (installed on its host, ptrace allowed)


@dataclass
class FakeBackend(Defaults):
    """A backend whose instances follow their :class:`Script` (default: exit 0 at once)."""

    scripts: Mapping[int, Script] = field(default_factory=dict)
    faults: Sequence[Fault] = ()  # preflight faults to raise (exit 3)
    topologies: Mapping[str, Topology | None] = field(default_factory=dict)
    name: str = "fake"
    calls: list[str] = field(default_factory=list)
    started_jobs: list[RenderedJob] = field(default_factory=list)
    attempts: Sequence[Mapping[int, Script]] = ()  # scripts of attempt k (the last repeats)
    down: Sequence[str] = ()  # hosts failing the preflight of every session but their first
    refuse: Sequence[str] = ()  # hosts failing every preflight
    signals: list[tuple[int, int]] = field(default_factory=list)  # (attempt, signum) sent
    dumps: list[tuple[int, int, str]] = field(default_factory=list)  # (attempt, index, how)
    opened: list[tuple[str, ...]] = field(default_factory=list)  # each session's plan hosts

    def open(self, prep: Prepared, settings: RunSettings) -> FakeSession:
        """Record the call; the session is this backend's."""
        self.calls.append("open")
        self.opened.append(tuple(h.name for h in prep.plan.hosts))
        return FakeSession(self)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> FakeRunning:
        """Start every instance of ``job`` as scripted."""
        self.calls.append("start")
        self.started_jobs.append(job)
        return FakeRunning(self, job, options, control)

    def scripts_of(self, attempt: int) -> Mapping[int, Script]:
        """The scripts of attempt ``attempt`` (``attempts``, else ``scripts``)."""
        if not self.attempts:
            return self.scripts
        return self.attempts[min(attempt, len(self.attempts) - 1)]


@contextlib.contextmanager
def registered(backend: FakeBackend, can: Capabilities) -> Iterator[FakeBackend]:
    """``backend`` registered under its name with the capabilities ``can`` for the block:
    prepare, render, jobs and cli ask it what they ask a real backend, and ``get_backend``
    returns it."""
    from poprun_py.backends import BACKENDS
    from poprun_py.core.backends import REGISTRY, Registered

    assert backend.name not in REGISTRY, f"{backend.name} is a real backend's name"
    REGISTRY[backend.name] = Registered("", can)
    BACKENDS[backend.name] = lambda: backend
    try:
        yield backend
    finally:
        del REGISTRY[backend.name], BACKENDS[backend.name]


class FakeSession:
    """The fake's hold on its hosts: preflight raises the scripted faults."""

    def __init__(self, backend: FakeBackend):
        self.backend = backend

    def preflight(self, prep: Prepared) -> Checked:
        """Raise the scripted faults, else pass with the scripted topologies."""
        self.backend.calls.append("preflight")
        if self.backend.faults:
            raise PreflightError(self.backend.faults)
        opened = self.backend.opened
        again = [h for h in self.backend.down if sum(h in names for names in opened) > 1]
        failing = [*self.backend.refuse, *again]
        down = [h.name for h in prep.plan.hosts if h.name in failing]
        if down:
            raise PreflightError([Fault(h, "connect", "no answer") for h in down])
        return Checked(prep, dict(self.backend.topologies))

    def sync(self, paths: Sequence[str], timeout: float | None = None) -> None:
        """Record the call."""
        self.backend.calls.append("sync")

    def stage(self, job: RenderedJob) -> None:
        """Record the call."""
        self.backend.calls.append("stage")

    def tidy(self, job_dir: str) -> None:
        """Record the call."""
        self.backend.calls.append("tidy")

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> FakeRunning:
        """Start through the backend."""
        return self.backend.start(job, options, control)

    def close(self) -> None:
        """Record the call."""
        self.backend.calls.append("close")


class FakeRunning:
    """Scripted instances on a real clock, stopped through the real Control."""

    def __init__(self, backend: FakeBackend, job: RenderedJob, options: RunOptions, c: Control):
        self.backend, self.options, self.control = backend, options, c
        self.attempt = len(backend.started_jobs) - 1
        self.t0 = time.monotonic()
        self.hosts = {cmd.index: cmd.host for cmd in job.instances}
        self.results: dict[int, InstanceResult] = {}
        self.stop_at: float | None = None
        for index in self.hosts:
            if self.script(index).faulthandler:
                self._say(index, "stderr", FAULTHANDLER.decode())
            for line in self.script(index).output:
                self._say(index, "stdout", line)

    def script(self, index: int) -> Script:
        """The script of instance ``index`` (exit 0 at once when none was given)."""
        return self.backend.scripts_of(self.attempt).get(index, Script())

    def signal(self, signum: int) -> None:
        """Record the signal; instances with faulthandler print a stack on SIGUSR1."""
        self.backend.signals.append((self.attempt, signum))
        for index in self.hosts:
            if index not in self.results and signum == SIGUSR1 and self.script(index).faulthandler:
                self._say(index, "stderr", f"Thread 0x1 (most recent call first): fake {index}")

    def dump_stacks(self, request: DumpRequest) -> None:
        """py-spy's dump for instances scripted ``pyspy``, else SIGUSR1 to those in
        ``request.faulthandler`` (they print a stack); recorded in the backend's ``dumps``."""
        signalled = False
        for index in sorted(i for i in self.hosts if i not in self.results):
            how = "none"
            if self.script(index).pyspy:
                self._say(index, "stderr", f'Thread {index} (idle): "MainThread"')
                self._say(index, "stderr", f"    hang (fake.py:{index})")
                how = "py-spy"
            elif index in request.faulthandler:
                self._say(index, "stderr", f"Thread 0x1 (most recent call first): fake {index}")
                how, signalled = "faulthandler", True
            self.backend.dumps.append((self.attempt, index, how))
        self.control.dumped(signalled)

    def _say(self, index: int, stream: str, line: str) -> None:
        if self.options.progress is not None:
            self.options.progress.seen(index, line)
        if self.options.sink is not None and not is_marker(line.encode()):
            self.options.sink(index, stream, line)

    def wait(self) -> LaunchResult:
        """Run the scripts to the end, honouring every stop request."""
        self.backend.calls.append("wait")
        while len(self.results) < len(self.hosts):
            now = time.monotonic()
            self._end_due(now)
            if self.control.stopping and self.stop_at is None:
                self._stop(now)
            if self.stop_at is not None and (now >= self.stop_at or self.control.kill_now):
                self._kill()
            if len(self.results) == len(self.hosts):
                break
            readable([self.control.wake_fd], self._timeout())  # poll: fds above 1023 too
            self.control.drain()
            for signum in self.control.take_forwards():
                self.signal(signum)
            for request in self.control.take_dumps():
                self.dump_stacks(request)
        ordered = tuple(self.results[i] for i in sorted(self.results))
        return LaunchResult(ordered, self.control.interrupted, time.monotonic() - self.t0)

    def _due(self, index: int) -> float | None:
        script = self.script(index)
        return None if script.hang else self.t0 + script.after

    def _end_due(self, now: float) -> None:
        for index in sorted(self.hosts, key=lambda i: self._due(i) or float("inf")):
            due = self._due(index)
            if index in self.results or due is None or due > now:
                continue
            script = self.script(index)
            if script.lost:
                self._end(
                    index, state=InstanceState.LOST, detail=f"lost contact with {self.hosts[index]}"
                )
            else:
                self._end(index, exit_code=script.exit_code)

    def _stop(self, now: float) -> None:
        self.stop_at = now + self.options.grace_period
        for index in self.hosts:
            if index not in self.results and not self.script(index).ignores_term:
                self._end(index, signal=15, state=InstanceState.STOPPED)

    def _kill(self) -> None:
        for index in self.hosts:
            if index not in self.results:
                self._end(index, signal=SIGKILL, state=InstanceState.STOPPED)

    def _end(self, index: int, **outcome: object) -> None:
        result = InstanceResult(index, self.hosts[index], ended=time.time(), **outcome)  # type: ignore[arg-type]
        self.results[index] = result
        self.control.ended(result)

    def _timeout(self) -> float:
        now = time.monotonic()
        times = [self._due(i) for i in self.hosts if i not in self.results]
        times += [self.stop_at]
        pending = [t - now for t in times if t is not None]
        return max(0.0, min(pending, default=0.05))


@dataclass
class FakeProvider:
    """A provider whose nodes exist only in its record: ``create`` makes ``num_nodes`` nodes
    (addresses in 198.18.0.0/15), ``terminate`` removes them; ``fail_on`` names a method that
    raises ProvisionError. Every call is recorded in ``calls``."""

    name: str = "fake"
    fail_on: str | None = None
    cost: str | None = None
    calls: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)

    def _call(self, what: str) -> None:
        from poprun_py.errors import ProvisionError

        self.calls.append(what)
        if self.fail_on == what:
            raise ProvisionError(f"fake provider: {what} failed (scripted)")

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        """The scripted cost notice."""
        self._call("cost_notice")
        return self.cost

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        """Nodes ``<cluster>-<i>`` at 198.18.250.<10+i>, saved in the state like a real one."""
        self._call("create")
        count = (spec.provider.num_nodes if spec.provider else None) or 1
        nodes = tuple(
            Node(f"{spec.name}-{i}", f"198.18.250.{10 + i}", resource_id=f"fake-{i}")
            for i in range(1, count + 1)
        )
        self.created = [n.resource_id for n in nodes]
        resources = tuple(Resource("fake-node", n.resource_id) for n in nodes)
        record = ProvisionRecord(spec.name, self.name, nodes, resources, phase="created")
        ctx.state.save(record)
        return record

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        """The record's nodes, running while created."""
        self._call("list_nodes")
        return tuple(
            Node(n.name, n.address, resource_id=n.resource_id, state="running")
            for n in record.nodes
            if n.resource_id in self.created
        )

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        """No SSH to wait for."""
        self._call("wait_until_reachable")
        return False

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        """Remove every node created; harmless when nothing exists."""
        self._call("terminate")
        removed = tuple(Resource("fake-node", rid) for rid in self.created)
        self.created = []
        return removed
