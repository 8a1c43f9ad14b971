"""The two ways a backend takes hold of its hosts: on this machine (:class:`LocalSession`) or
over SSH with one agent per host (:class:`RemoteSession`), each wrapping a runner.

A remote session opens one connection per host and starts one agent on it; preflight (which
also discovers undeclared topologies), ``--sync``, staging and the job itself share those
agents: one login session per host for the whole launch. ``close`` waits until every host's
agent has exited.

Example:

    >>> from poprun_py.backends.local import LocalBackend
    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="localhost", program=("true",)), environ={})
    >>> session = LocalSession(LocalBackend())
    >>> sorted(session.preflight(prep).topologies)
    ['localhost']
    >>> session.close()
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from poprun_py.backends.base import Checked, Runner, Running
from poprun_py.core.result import RunOptions, RunSettings
from poprun_py.errors import Fault, PreflightError

if TYPE_CHECKING:
    from poprun_py.agent.client import AgentPool
    from poprun_py.core.topology import Topology
    from poprun_py.preflight.probes import PreflightReport
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control
    from poprun_py.render.job import RenderedJob
    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import SshSettings

log = logging.getLogger("poprun_py")
TIDY_TIMEOUT = 30.0  # seconds for one host to remove a job's directory


def local_topologies(prep: Prepared) -> dict[str, Topology | None]:
    """For jobs on this machine: every host's real topology is this machine's."""
    topo = prep.local_topology
    if topo is None:
        from poprun_py.prepare.discover import discover_local

        topo = discover_local()
    return {h.name: topo for h in prep.plan.hosts}


def ssh_settings(prep: Prepared) -> SshSettings:
    """The transport settings for this job: the launch's SSH flags, then the cluster spec
    (:func:`~poprun_py.ssh.settings.settings_for`)."""
    from poprun_py.ssh.settings import settings_for

    return settings_for(prep.plan.cluster, prep.options.ssh)


def with_topologies(
    prep: Prepared,
    found: Mapping[str, Topology | None],
    interfaces: Mapping[str, tuple[str, str]] | None = None,
) -> Prepared:
    """The prepared job re-planned with discovered topologies where the spec declared none
    (and with each host's interface in ``--network``)."""
    from poprun_py.core.plan import replan_with_topologies

    return replace(prep, plan=replan_with_topologies(prep.plan, found, interfaces))


class LocalSession:
    """Every instance runs on this machine: preflight checks the tools here."""

    def __init__(self, runner: Runner, tools: Mapping[str, str] | None = None):
        self.runner, self.tools = runner, dict(tools or {})

    def preflight(self, prep: Prepared) -> Checked:
        """The launcher's tools are on PATH; the working directory and the program are here;
        the topology is this machine's."""
        from poprun_py.preflight.probes import check_here

        check_tools(self.tools)
        plan = prep.plan
        faults = check_here(plan)
        if plan.network and not plan.interfaces:
            faults.append(Fault("localhost", "network", f"no address in {plan.network} here"))
        if faults:
            raise PreflightError(faults)
        return Checked(prep, local_topologies(prep))

    def sync(self, paths: Sequence[str], timeout: float | None = None) -> None:
        """Nothing to push: the files are here."""

    def tidy(self, job_dir: str) -> None:
        """Nothing on other hosts: the launcher removes this machine's directory."""

    def stage(self, job: RenderedJob) -> None:
        """The runner writes the job's files itself."""
        check_numactl(job)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> Running:
        """Start the job on this machine."""
        return self.runner.start(job, options, control)

    def close(self) -> None:
        """Nothing is held."""


def check_tools(tools: Mapping[str, str]) -> None:
    """PreflightError (exit 3, nothing started) naming every tool missing on this machine
    (``tools``: name -> what to say when it is missing)."""
    faults = [
        Fault("localhost", tool, why) for tool, why in tools.items() if not shutil.which(tool)
    ]
    if faults:
        raise PreflightError(faults)


def check_numactl(job: RenderedJob) -> None:
    """PreflightError (exit 3, nothing started) when an instance is bound through numactl and
    numactl is not on its PATH."""
    from poprun_py.preflight.probes import NUMACTL_MISSING

    for cmd in job.instances:
        if cmd.argv and os.path.basename(cmd.argv[0]) == "numactl":
            path = cmd.env.get("PATH") or os.environ.get("PATH")
            if shutil.which(cmd.argv[0], path=path) is None:
                raise PreflightError([Fault("localhost", "numactl", NUMACTL_MISSING)])
            return
    launcher = (*job.launcher, *job.files.get("appfile", "").split())  # ranks under numactl
    if "numactl" in launcher and shutil.which("numactl") is None:
        raise PreflightError([Fault("localhost", "numactl", NUMACTL_MISSING)])


MPI_BEHIND_JUMP = "the MPI daemons must connect back to this machine directly; use --backend ssh"


class RemoteSession:
    """One connection and one agent per host, shared by preflight, sync, staging and the job.

    ``runner_for`` makes the runner from the agents (the ssh backend runs the job on them, the
    mpirun backend starts Open MPI's daemons through them); ``tools`` must be on this machine's
    PATH (the launcher: mpirun, mpiexec.hydra); ``direct_only``, when set, says why every host
    must be reached without a jump host (MPI daemons connect back); ``stages`` says whether the
    job's files must be written through the agents before it starts (the ssh backend's agents
    write them as part of the job); ``pool``, when given, is the hosts' pool (per-node mode's
    joined nodes: :class:`~poprun_py.pernode.coordinator.JoinedPool`), else one is opened."""

    def __init__(
        self,
        prep: Prepared,
        settings: RunSettings,
        runner_for: Callable[[AgentPool], Runner],
        *,
        stages: bool,
        tools: Mapping[str, str] | None = None,
        direct_only: str | None = None,
        pool: ConnectionPool | None = None,
    ):
        from poprun_py.agent.client import AgentPool
        from poprun_py.ssh.pool import ConnectionPool

        self.pool: ConnectionPool = pool or ConnectionPool(
            list(prep.plan.cluster.hosts), ssh_settings(prep)
        )
        tidies = not (settings.output_dir or settings.keep_job_dir)
        self.agents: AgentPool = AgentPool(self.pool, linger=tidies)
        self.runner_for, self.stages, self.tools = runner_for, stages, dict(tools or {})
        self.direct_only = direct_only
        self.backend = prep.backend
        self.templates = prep.templates
        self.report: PreflightReport | None = None

    def preflight(self, prep: Prepared) -> Checked:
        """Every host, every fault at once, through the agents; re-plan with what was found."""
        from poprun_py.core.backends import capabilities
        from poprun_py.preflight.probes import checks_for_plan, preflight
        from poprun_py.process import phases

        check_tools(self.tools)  # the launcher runs here: before any host is contacted
        if self.direct_only:
            self.pool.require_direct(self.direct_only)  # PreflightError: nothing started
        self._warm_up_renderer()  # while preflight waits for the hosts
        with phases.phase((phases.CONNECTING, "preflight"), self._names):
            names = capabilities(prep.backend).resolves_host_names
            report = preflight(
                self.agents, prep.plan, replace(checks_for_plan(prep.plan), names=names)
            )
        self.report = report
        found = with_topologies(prep, report.topologies, report.interfaces(prep.plan.network))
        return Checked(found, report.topologies)

    def sync(self, paths: Sequence[str], timeout: float | None = None) -> None:
        """``--sync``: push ``paths`` over the same connections, within ``timeout``."""
        from poprun_py.process import phases
        from poprun_py.ssh.sync import sync

        with phases.phase("sync", self._names):
            sync(self.pool, list(paths), timeout=timeout)

    def stage(self, job: RenderedJob) -> None:
        """Write the shard files and job files on every host, through the agents (once numactl
        is known to be there for the commands that use it)."""
        from poprun_py.preflight.probes import check_numactl as check_remote_numactl

        if self.report is not None:
            check_remote_numactl(job, self.report)
        if self.stages:
            from poprun_py.agent.client import stage_job
            from poprun_py.process import phases

            with phases.phase("staging", self._names):
                stage_job(self.agents, job)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> Running:
        """Start the job through the agents."""
        from poprun_py.process import phases

        with phases.phase("starting", self._names):
            return self.runner_for(self.agents).start(job, options, control)

    @property
    def _names(self) -> list[str]:
        return [h.name for h in self.pool.hosts]

    def tidy(self, job_dir: str) -> None:
        """Remove ``job_dir`` on every host (one ``rm`` each, in parallel) through the job's
        agent where it lingers (no new login session), else over the connection; a host that
        cannot is warned about: the job itself succeeded."""

        def remove(conn: Connection) -> str:
            via = self.agents.lingering(conn.name) or conn
            done = via.run(["rm", "-rf", "--", job_dir], timeout=TIDY_TIMEOUT)
            return (done.stderr.strip() or f"exit {done.exit_code}") if done.exit_code else ""

        for host, outcome in self.pool.each(remove).items():
            if why := outcome.fault or outcome.value:
                log.warning("could not remove the job directory %s on %s: %s", job_dir, host, why)

    def close(self) -> None:
        """End every agent (waiting until each has exited), then every connection."""
        try:
            self.agents.close()
        finally:
            self.pool.close()

    def _warm_up_renderer(self) -> None:
        """Import Jinja2 and load the templates on a thread of their own: preflight spends
        seconds waiting for the hosts' login shells, and rendering follows it."""
        from poprun_py.render.environment import warm_up

        args = (self.backend, self.templates)
        threading.Thread(target=warm_up, args=args, daemon=True, name="poprun-warm-up").start()
