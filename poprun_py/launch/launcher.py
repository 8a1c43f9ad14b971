"""Orchestration: prepared plan → (preflight, sync) → render → backend → LaunchResult.

The remote backends open one SSH connection per host here and start one agent per host on it
(:class:`~poprun_py.backends.ssh.AgentPool`), which runs preflight (which also discovers
undeclared topologies and re-plans with them) and stages the job's files; the backend gets the
same agents: the ssh backend runs the job on them, the mpirun backend starts Open MPI's daemons
through them. One login session per host for the whole launch. Agents and connections are
closed in ``finally``.

Example:

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="localhost", program=("true",)), environ={})
    >>> result = launch(prep, RunSettings())
    >>> result.ok, [r.exit_code for r in result.instances]
    (True, [0])
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from poprun_py.backends import BackendContext, get_backend
from poprun_py.backends.base import LaunchResult, OutputSink, RunOptions
from poprun_py.core.plan import LaunchPlan, replan_with_topologies
from poprun_py.core.topology import Topology
from poprun_py.errors import UsageError
from poprun_py.prepare.job import Prepared
from poprun_py.render.job import RenderedJob

JOBS_ROOT = "/tmp/poprun-py/jobs"
NON_SSH_BACKENDS = ("local", "slurm")
"""Backends that never open SSH connections themselves (slurm reaches nodes through srun)."""


@dataclass(frozen=True)
class RunSettings:
    """Run-time settings that do not change the plan."""

    output_dir: str | None = None
    only_output_from: int | None = None
    sink: OutputSink | None = None
    accept_new_host_keys: bool = False
    known_hosts: str | None = None
    sync: bool = False


def job_dir_for(plan: LaunchPlan, output_dir: str | None) -> str:
    """Where a job's files (shard lists, hostfile) go: ``--output-dir`` or a fresh temp dir."""
    if output_dir:
        return str(Path(output_dir).resolve())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{JOBS_ROOT}/{plan.cluster.name}-{stamp}-{os.getpid()}"


def is_remote(prep: Prepared) -> bool:
    """True when the backend reaches hosts over SSH (not local, not all-local mpirun)."""
    if prep.backend in NON_SSH_BACKENDS:
        return False
    return not prep.plan.cluster.all_local


def render(prep: Prepared, job_dir: str, available: Mapping[str, Topology | None]) -> RenderedJob:
    """Render the prepared plan for its backend."""
    from poprun_py.render.job import render_job

    plan = prep.plan
    return render_job(
        plan,
        prep.backend,
        job_dir=job_dir,
        templates_dir=prep.templates,
        available=available,
        mpi_args=mpi_args_for(prep),
        mpi_subnet=mpi_subnet(plan, prep.mpi_args),
        as_root=_as_root(plan),
    )


def mpi_args_for(prep: Prepared) -> tuple[str, ...]:
    """The user's mpirun options, plus how Open MPI starts its daemons on remote hosts: through
    poprun-py's agents (:func:`poprun_py.agent.rsh_shim.mpirun_args`) unless the user chose
    otherwise; else with its own ssh, given ``plm_rsh_args -F <ssh_config>`` when the cluster names
    an ssh_config, so that it uses the same user, key and known_hosts."""
    if prep.backend != "mpirun":
        return prep.mpi_args
    if is_remote(prep):
        from poprun_py.agent.rsh_shim import mpirun_args

        relay = mpirun_args(prep.mpi_args)
        if relay:
            return (*prep.mpi_args, *relay)
    config = prep.plan.cluster.ssh_config
    if not config or "plm_rsh_args" in " ".join(prep.mpi_args):
        return prep.mpi_args
    if any(c.isspace() for c in config):
        raise UsageError(f"ssh_config path {config!r} has whitespace: Open MPI splits plm_rsh_args")
    return (*prep.mpi_args, "--mca", "plm_rsh_args", f"-F {config}")


def local_available(prep: Prepared) -> dict[str, Topology | None]:
    """For jobs on this machine: every host's real topology is this machine's."""
    topo = prep.local_topology
    if topo is None:
        from poprun_py.prepare.discover import discover_local

        topo = discover_local()
    return {h.name: topo for h in prep.plan.hosts}


def _as_root(plan: LaunchPlan) -> bool:
    return os.geteuid() == 0 or any(h.spec.user == "root" for h in plan.hosts)


def mpi_subnet(plan: LaunchPlan, mpi_args: tuple[str, ...]) -> str | None:
    """Open MPI's interface selection (avoids start-up hangs on the wrong NIC): the smallest IPv4
    network holding every host address and -- when that is within a /16 -- this machine's own
    address towards them: mpirun's daemon runs here, and Open MPI ignores (with a warning) a
    selection that matches none of the machine's interfaces. None when the user chose already
    or the hosts are not all IPv4 addresses."""
    if any("if_include" in a or "if_exclude" in a for a in mpi_args):
        return None
    if plan.cluster.all_local or len(plan.hosts) < 2:
        return None
    try:
        addrs = [ipaddress.IPv4Address(h.spec.target) for h in plan.hosts]
    except ipaddress.AddressValueError:
        return None
    net = _covering(addrs)
    here = source_address(str(addrs[0]))
    if here is not None and here not in net:
        wider = _covering([*addrs, here])
        net = wider if wider.prefixlen >= 16 else net
    return str(net)


def _covering(addrs: list[ipaddress.IPv4Address]) -> ipaddress.IPv4Network:
    net = ipaddress.IPv4Network(f"{addrs[0]}/32")
    while not all(a in net for a in addrs):
        net = net.supernet()
    return net


def source_address(target: str) -> ipaddress.IPv4Address | None:
    """This machine's address on the route to ``target`` (a UDP connect sends nothing)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return ipaddress.IPv4Address(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def launch(prep: Prepared, settings: RunSettings) -> LaunchResult:
    """Run the prepared job to the end and return every instance's outcome."""
    if prep.backend == "slurm":
        return _launch_slurm(prep, settings)
    if not is_remote(prep):
        job_dir = job_dir_for(prep.plan, settings.output_dir)
        job = render(prep, job_dir, local_available(prep))
        return _run(prep, job, settings, BackendContext())
    return _launch_remote(prep, settings)


def _run(
    prep: Prepared, job: RenderedJob, settings: RunSettings, ctx: BackendContext
) -> LaunchResult:
    options = RunOptions(
        output_dir=Path(settings.output_dir) if settings.output_dir else None,
        only_output_from=settings.only_output_from,
        grace_period=prep.grace_period,
        sink=settings.sink,
        connect_timeout=prep.connect_timeout,
    )
    return get_backend(prep.backend, ctx).run(job, options)


def ssh_settings(prep: Prepared, settings: RunSettings) -> Any:
    """The transport settings for this job: the launch's SSH flags, then the cluster spec."""
    from poprun_py.prepare.job import ssh_settings as resolve

    flags = prep.options.ssh
    flags = replace(
        flags,
        known_hosts=settings.known_hosts or flags.known_hosts,
        accept_new_host_keys=settings.accept_new_host_keys or flags.accept_new_host_keys,
        connect_timeout=prep.connect_timeout,
    )
    return resolve(prep.plan.cluster, flags)


def _launch_remote(prep: Prepared, settings: RunSettings) -> LaunchResult:
    from poprun_py.backends.ssh import AgentPool, stage_job
    from poprun_py.launch.preflight import preflight
    from poprun_py.ssh.transport import ConnectionPool

    with ConnectionPool(list(prep.plan.cluster.hosts), ssh_settings(prep, settings)) as pool:
        # one agent session per host serves preflight, staging and the job (ssh) or mpirun's
        # daemons: one login session per host for the whole launch
        agents = AgentPool(pool)
        _warm_up_renderer(prep)  # while preflight waits for the hosts
        try:
            # every host, all faults at once; AgentPool answers map/run as a ConnectionPool does
            report = preflight(agents, prep.plan)
            prep = with_topologies(prep, report.topologies)
            if settings.sync:
                from poprun_py.ssh.sync import sync

                sync(pool, [sync_root(prep.plan)])
            job = render(prep, job_dir_for(prep.plan, settings.output_dir), report.topologies)
            if prep.backend != "ssh":
                stage_job(agents, job)  # shard files and job files on every host
            return _run(prep, job, settings, BackendContext(pool=agents))
        finally:
            agents.close()  # waits until every host's agent has exited


def _warm_up_renderer(prep: Prepared) -> None:
    """Import Jinja2 and load the templates on a thread of their own: preflight spends seconds
    waiting for the hosts' login shells, and rendering follows it."""
    from poprun_py.render.job import warm_up

    args = (prep.backend, prep.templates)
    threading.Thread(target=warm_up, args=args, daemon=True, name="poprun-warm-up").start()


def sync_root(plan: LaunchPlan) -> str:
    """What ``--sync`` pushes: the directory of the program's script (the first argument that is
    an existing file, e.g. ``train.py`` of ``python train.py --out /tmp``), else the working
    directory. Never a directory named only as an argument, nor its parent."""
    for candidate in plan.program:
        if os.path.isfile(candidate) and candidate != shutil.which(candidate):
            return str(Path(candidate).resolve().parent)
    return plan.workdir or os.getcwd()


def with_topologies(prep: Prepared, found: Mapping[str, Topology | None]) -> Prepared:
    """The prepared job re-planned with discovered topologies where the spec declared none."""
    return replace(prep, plan=replan_with_topologies(prep.plan, found))


def slurm_request(prep: Prepared) -> Any:
    """The allocation a slurm job needs: its hosts (when named), tasks and limits."""
    from poprun_py.backends.slurm_alloc import SlurmRequest

    plan, opts = prep.plan, prep.options
    named = tuple(h.name for h in plan.hosts if h.name != "localhost")
    return SlurmRequest(
        nodes=len(plan.hosts),
        tasks=plan.num_instances,
        time=opts.slurm_time,
        partition=opts.slurm_partition,
        account=opts.slurm_account,
        nodelist=named if len(named) == len(plan.hosts) else (),
    ).check()


def _launch_slurm(prep: Prepared, settings: RunSettings) -> LaunchResult:
    """Run inside the current allocation, or inside one asked for with salloc (and released)."""
    from poprun_py.backends.slurm_alloc import allocated

    with allocated(slurm_request(prep)) as alloc:
        job_dir = job_dir_for(prep.plan, settings.output_dir)
        job = render(prep, job_dir, {})
        return _run(prep, job, settings, BackendContext(environ=alloc.environ))
