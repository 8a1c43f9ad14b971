"""The ssh backend: every host's instances run under one agent started over that host's connection.

Per host, one channel on the host's existing connection runs :mod:`poprun_py.hostside.agent`
(its source travels over stdin, so nothing is installed remotely). :class:`AgentPool` starts the
agents and can first run preflight's commands through them (it answers ``map``/``run`` like a
:class:`~poprun_py.ssh.pool.ConnectionPool`), so a whole launch -- preflight, staging, start --
costs one login session per host. The agent then gets the host's part of the job as one JSON
line on stdin -- shard files, ``job.files`` and every instance's argv, environment and cwd, so
no environment value (secrets included) is ever in an argv or in ``ps`` -- writes the files
(0600), starts each instance in its own process group, reports ``p IDX PID`` first, then
streams tagged output lines and each exit. For other launchers (mpirun),
:func:`~poprun_py.agent.client.stage_job` writes the job's files through the same agents (``put``
requests), and
:mod:`poprun_py.agent.relay` gives each agent Open MPI's daemon as its job.

The local backend's rules apply across hosts: the first instance to fail (or a host lost)
makes every agent SIGTERM its instances' groups, and SIGKILL after the grace period;
SIGINT/SIGTERM to poprun-py do the same (a second one SIGKILLs at once); the forwarded signals
(``--forward-signals``: SIGUSR1/SIGUSR2 by default, SIGHUP if chosen) to poprun-py reach every
instance's process group (``sig N`` to every agent); a hung job's stacks
are dumped by every agent (``dump F``: ``py-spy dump`` where it is on the host's PATH, else
SIGUSR1 to those that registered faulthandler), each answering ``y IDX HOW``. Agents and poprun-py
send each other heartbeats: a host silent for ``liveness`` seconds (``--host-timeout``: dead,
or off the network; a closed connection is noticed at once) is reported ``lost`` -- as the
root cause, dated from when it was last heard -- and an agent that stops hearing poprun-py
(closed stdin, or silence) stops its instances by itself, so a SIGKILLed poprun-py or a
cut-off host leaves nothing running. Ctrl-Z of poprun-py tells the agents to wait
(:func:`~poprun_py.agent.client.pausing`).

Example::

    with ConnectionPool(hosts, settings) as pool:
        agents = AgentPool(pool)
        report = preflight(agents, plan)        # checks run by the agents
        result = SshBackend(agents).run(job, RunOptions(output_dir=Path("logs")))

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.agent.client import Timing
    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.render.job import render_job
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    >>> plan = make_plan(cluster, JobSpec(("prog",), replicas=2, instances=2))
    >>> job = render_job(plan, "ssh", job_dir="/tmp/j")
    >>> header = _host_header(job, "h2", "run-1", Timing(5.0, 0.5, 5.0, 10.0))  # h2's job line
    >>> [(i["index"], i["argv"]) for i in header["instances"]]
    [(1, ['prog'])]
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import selectors
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from poprun_py.agent.client import (
    HEARTBEAT,
    KILL_WAIT,
    START_TIMEOUT,
    AgentConnection,
    AgentLink,
    AgentPool,
    Timing,
    agent_header,
    host_files,
    pausing,
)
from poprun_py.backends.base import Defaults, run_to_end
from poprun_py.core.result import (
    InstanceResult,
    InstanceState,
    LaunchResult,
    RunOptions,
    RunSettings,
)
from poprun_py.hostside import protocol as P
from poprun_py.process.output import Output
from poprun_py.process.signals import Control, DumpRequest

log = logging.getLogger("poprun_py.launch")

if TYPE_CHECKING:
    from poprun_py.backends.session import RemoteSession
    from poprun_py.prepare.job import Prepared
    from poprun_py.render.job import InstanceCommand, RenderedJob
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import SshSettings


class SshBackend(Defaults):
    """Runs each host's instances over SSH; stops all of them on the first failure anywhere."""

    name = "ssh"

    def __init__(
        self,
        agents: AgentPool | None = None,
        *,
        heartbeat: float = HEARTBEAT,
        liveness: float | None = None,
        start_timeout: float = START_TIMEOUT,
    ):
        """Runs jobs on ``agents`` (the hosts' agents); without them (the registry's), it can
        only :meth:`open` a session, which makes its own. ``liveness`` None: the run's
        ``--host-timeout``. See also :meth:`over` and :func:`connect_and_run`."""
        self.agents = agents
        self.heartbeat, self.liveness = heartbeat, liveness
        self.start_timeout = start_timeout

    @classmethod
    def over(cls, pool: ConnectionPool) -> SshBackend:
        """On the agents of ``pool``'s connections, each started on first use."""
        return cls(AgentPool(pool))

    def with_agents(self, agents: AgentPool) -> SshBackend:
        """This backend's timings, on ``agents``."""
        return SshBackend(
            agents,
            heartbeat=self.heartbeat,
            liveness=self.liveness,
            start_timeout=self.start_timeout,
        )

    def open(self, prep: Prepared, settings: RunSettings) -> RemoteSession:
        """One connection and agent per host; the agents write the job's files first (a host
        where they cannot be written, e.g. a job root another user owns, fails preflight:
        nothing is started anywhere), then run the job."""
        from poprun_py.backends.session import RemoteSession

        return RemoteSession(prep, settings, self.with_agents, stages=True)

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Start (or reuse) every host's agent, supervise the job to the end, report all
        (fail-fast, with the signal handlers installed for this call)."""
        return run_to_end(self, job, options)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> SshRun:
        """Hand every host its part of the job; the returned run is waited on for the rest."""
        if self.agents is None:
            raise TypeError("SshBackend runs on the hosts' agents: SshBackend(agents) or .over")
        agents = self.agents
        agents.pool.open_all()  # PreflightError naming every unreachable host: nothing started
        liveness = options.host_timeout if self.liveness is None else self.liveness
        beat = P.heartbeat_for(len(job.plan.hosts), self.heartbeat, liveness)
        timing = Timing(options.grace_period, beat, liveness, self.start_timeout)
        output = Output(options, {c.index: c.host for c in job.instances})
        run = SshRun(job, agents, output, timing, control)
        run.start()
        return run


def connect_and_run(
    job: RenderedJob, options: RunOptions, settings: SshSettings | None = None
) -> LaunchResult:
    """Connect to ``job``'s hosts (``settings``, default :meth:`SshSettings.of`), run it on
    their agents to the end, and close the connections."""
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import SshSettings

    hosts = [h.spec for h in job.plan.hosts]
    with ConnectionPool(hosts, SshSettings.of() if settings is None else settings) as pool:
        return SshBackend.over(pool).run(job, options)


def _host_header(job: RenderedJob, host: str, run_id: str, timing: Timing) -> dict[str, Any]:
    """The agent's job on ``host``: files to write and instances to start (pure)."""
    instances = [
        {"index": c.index, "argv": list(c.argv), "env": dict(c.env), "cwd": c.cwd, **_bind(c)}
        for c in job.instances
        if c.host == host
    ]
    return agent_header(run_id, host, timing, instances, host_files(job, host))


def _bind(cmd: InstanceCommand) -> dict[str, list[int]]:
    """``cpus``/``mems`` for the agent to bind the instance to (nothing when unbound)."""
    if cmd.binding is None:
        return {}
    return {"cpus": list(cmd.binding.cpu_ids), "mems": list(cmd.binding.node_ids)}


class SshRun:
    """One supervised run across hosts: start the agents, route records, report every end to
    the Control (whose policy decides to stop), and stop on its requests."""

    def __init__(
        self,
        job: RenderedJob,
        agents: AgentPool,
        output: Output,
        timing: Timing,
        control: Control,
    ):
        self.job, self.agents, self.output = job, agents, output
        self.timing, self.control = timing, control
        self.run_id = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.hosts = {c.index: c.host for c in job.instances}
        by_host: dict[str, list[int]] = {}
        for c in job.instances:
            by_host.setdefault(c.host, []).append(c.index)
        self.links = {h: AgentLink(h, idx) for h, idx in by_host.items()}
        self.started: dict[int, float] = {}
        self.results: dict[int, InstanceResult] = {}
        self.sel = selectors.DefaultSelector()
        self.kill_at: float | None = None  # set when the stop begins
        self.lose_at: float | None = None  # set when SIGKILL was sent
        self.t0 = time.time()
        self.dumping: set[int] | None = None  # a stack dump under way: the instances not done
        self.dump_signalled = False
        self.stop_beating = threading.Event()
        self.paused = contextlib.ExitStack()  # Ctrl-Z handled while the job runs
        self.beater = threading.Thread(
            target=self.beat, args=(self.stop_beating,), daemon=True, name="poprun-heartbeat"
        )

    def start(self) -> None:
        """Start the heartbeats and hand every host its job; from now on Ctrl-Z tells the
        agents to wait (:func:`~poprun_py.agent.client.pausing`)."""
        self.sel.register(self.control.wake_fd, selectors.EVENT_READ, None)
        self.paused.enter_context(pausing())
        self.beater.start()
        try:
            self.start_all()
        except BaseException:
            self.close()
            raise

    def wait(self) -> LaunchResult:
        """Loop until every host is done, clean up, return every instance's result."""
        try:
            while not all(link.done for link in self.links.values()):
                for key, _ in self.sel.select(self.timeout()):
                    self.pump(key.data)
                self.tick(time.monotonic())
        finally:
            self.close()
        results = tuple(self.result(index) for index in sorted(self.hosts))
        return LaunchResult(results, self.control.interrupted, time.time() - self.t0)

    def close(self) -> None:
        """Stop the heartbeats, end every agent, close the selector and the logs."""
        self.stop_beating.set()
        if self.beater.is_alive():
            self.beater.join()
        self.paused.close()
        self.close_links()
        self.sel.close()
        self.output.close()

    def close_links(self, wait: float = 3.0) -> None:
        """End every host's agent: EOF on its stdin, then wait (together, at most ``wait``
        seconds) until each has exited -- its stdout closed -- before closing the streams, so
        no agent is still running on any host when the backend returns; except those that
        linger after their job (their session removes the job's directory through them, then
        ends them: :meth:`~poprun_py.agent.client.AgentPool.close`)."""
        agents = [
            link.agent
            for link in self.links.values()
            if link.agent is not None and not link.agent.serves_after_job()
        ]
        for agent in agents:
            agent.send_eof()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(a.exited() for a in agents):
            time.sleep(0.005)
        for link in self.links.values():
            link.close()

    def start_all(self) -> None:
        """Hand every host its job (starting agents not yet running) in parallel; a host
        whose agent cannot start is lost."""

        def start(agent: AgentConnection) -> None:
            link = self.links[agent.name]
            link.start(agent, _host_header(self.job, link.host, self.run_id, self.timing))

        outcomes = self.agents.each(start, list(self.links), connect=True)
        for host, link in self.links.items():
            got = outcomes.get(host)
            failure = got.fault if got is not None else None
            if link.agent is None or failure is not None:
                why = f"{failure}" if failure else "no connection"
                self.lose(link, f"cannot start the agent on host {host}: {why}")
            else:
                self.sel.register(link.agent.stream, selectors.EVENT_READ, link)

    def beat(self, stop: threading.Event) -> None:
        """Heartbeats to every agent, from a thread of their own: a main loop held up by a
        slow terminal must not make the agents think poprun-py is gone."""
        while not stop.wait(self.timing.heartbeat):
            self.send(P.HEARTBEAT_LINE)

    def timeout(self) -> float:
        """Seconds until the next liveness check or stop deadline (at most one heartbeat)."""
        live = [link for link in self.links.values() if not link.done]
        times = [time.monotonic() + self.timing.heartbeat]
        times += [link.heard + link.silence_limit(self.timing) for link in live]
        times += [t for t in (self.kill_at, self.lose_at) if t is not None]
        return max(0.0, min(times) - time.monotonic())

    def pump(self, link: AgentLink | None) -> None:
        """Handle what one stream (or the signal pipe, for None) has to say."""
        if link is None:
            self.control.drain()
            for signum in self.control.take_forwards():
                self.signal(signum)
            for request in self.control.take_dumps():
                self.dump_stacks(request)
            return
        records, ended = link.receive()
        for record in records:
            self.record(link, record)
        if ended and not link.done:
            self.lose(link, link.why_lost())

    def record(self, link: AgentLink, record: bytes) -> None:
        """Act on one agent record (see :mod:`poprun_py.hostside.agent`)."""
        kind, index, text = P.parse(record)
        if kind == P.DONE:
            self.forget(link)
            return
        if index not in link.indexes:
            return  # a heartbeat, or noise
        if kind in (P.STDOUT, P.STDERR):
            self.output.emit(index, "stdout" if kind == P.STDOUT else "stderr", text)
        elif kind == P.STARTED:
            self.started[index] = time.time()
        elif kind in (P.EXITED, P.KILLED) and text.isdigit():
            self.exited(index, int(text), by_signal=kind == P.KILLED)
        elif kind == P.STACKS:
            self.stacks_dumped(link, index, text)
        elif kind in (P.FAILED, P.NOT_STARTED):
            detail = text.decode("utf-8", "replace")
            failed = kind == P.FAILED
            state = InstanceState.EXITED if failed else InstanceState.NOT_STARTED
            code = 127 if failed else None
            self.finish(InstanceResult(index, link.host, code, None, state, detail=detail))

    def exited(self, index: int, value: int, by_signal: bool) -> None:
        """An instance ended; it is "stopped" if we had signalled it and it did not exit 0."""
        stopped = self.kill_at is not None and (by_signal or value != 0)
        self.finish(
            InstanceResult(
                index,
                self.hosts[index],
                exit_code=None if by_signal else value,
                signal=value if by_signal else None,
                state=InstanceState.STOPPED if stopped else InstanceState.EXITED,
            )
        )

    def finish(self, result: InstanceResult) -> None:
        """Record an outcome (with times); a failure stops everything."""
        now = time.time()
        ended = result.ended or now
        started = self.started.get(result.index, ended)
        self.results[result.index] = replace(result, started=started, ended=ended)
        self.control.ended(self.results[result.index])
        self.stacks_dumped(None, result.index, b"")

    def lose(self, link: AgentLink, reason: str, when: float | None = None) -> None:
        """A host is gone: its unfinished instances are lost, dated when it was last heard
        (so a host that died is the root cause of the failures it caused elsewhere)."""
        self.forget(link)
        link.close()
        for index in link.indexes:
            if index not in self.results:
                lost = InstanceResult(index, link.host, state=InstanceState.LOST, detail=reason)
                self.finish(replace(lost, ended=when or link.heard_wall))

    def forget(self, link: AgentLink) -> None:
        """The host is done: stop watching its stream."""
        link.done = True
        if link.agent is not None and link.agent.stream in self.sel.get_map():
            self.sel.unregister(link.agent.stream)

    def stop(self) -> None:
        """SIGTERM everywhere now; SIGKILL after the grace period (``stop``: the job failed or
        was interrupted, so no agent lingers after it to remove the job's directory)."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.timing.grace
            self.send(P.STOP_LINE)

    def signal(self, signum: int) -> None:
        """Every agent sends ``signum`` to its instances' process groups (``sig N``)."""
        self.send(b"sig %d" % signum)

    def dump_stacks(self, request: DumpRequest) -> None:
        """Every agent dumps its running instances' stacks (``dump F``: py-spy where it is on
        the host's PATH, else SIGUSR1 to those that registered faulthandler); the Control
        hears once every unfinished instance was answered for."""
        self.dumping = {i for i in self.hosts if i not in self.results}
        self.dump_signalled = False
        self.send(P.dump_line(request.faulthandler))
        self.stacks_dumped(None, -1, b"")

    def stacks_dumped(self, link: AgentLink | None, index: int, how: bytes) -> None:
        """Instance ``index`` is answered for (``how``: its ``y`` record, b"" when it ended)."""
        if self.dumping is None:
            return
        self.dumping.discard(index)
        self.dump_signalled |= how == P.STACKS_FAULTHANDLER
        if how == P.STACKS_NONE and link is not None:
            log.warning(
                "no stacks of instance %d: py-spy is not on PATH on host %s (or could not "
                "dump it) and it did not register faulthandler (import poprun_py.dist)",
                index,
                link.host,
            )
        if not self.dumping:
            self.dumping = None
            self.control.dumped(self.dump_signalled)

    def send(self, line: bytes) -> None:
        """Send a control line to every live agent."""
        for link in self.links.values():
            link.send(line)

    def tick(self, now: float) -> None:
        """Interrupts, liveness, and the SIGKILL and give-up deadlines."""
        if self.control.stopping:
            self.stop()
        if self.control.kill_now and self.kill_at is not None:
            self.kill_at = min(self.kill_at, now)
        for link in self.links.values():
            silence = link.silence(now)
            if not link.done and silence > link.silence_limit(self.timing) and not link.pending():
                self.lose(link, link.why_lost(silence))
        if self.kill_at is not None and now >= self.kill_at and self.lose_at is None:
            self.lose_at = now + KILL_WAIT  # set first: a send that raises does not resend
            self.send(P.KILL_LINE)
            # Each host's KILL_WAIT counts from the end of the fan-out, not its start: the
            # sends are serial, and at 256 hosts under load they took 0.92 s (3.6 ms each).
            self.lose_at = time.monotonic() + KILL_WAIT
        if self.lose_at is not None and now >= self.lose_at:
            now_wall = time.time()
            for link in self.links.values():
                if not link.done:
                    self.lose(link, f"host {link.host} did not report after SIGKILL", now_wall)

    def result(self, index: int) -> InstanceResult:
        """The outcome of one instance (lost if its agent never said)."""
        if index in self.results:
            return self.results[index]
        return InstanceResult(
            index, self.hosts[index], state=InstanceState.LOST, detail="no report"
        )
