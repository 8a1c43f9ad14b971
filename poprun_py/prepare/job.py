"""From command-line options to a plan: the I/O edge that reads spec files, hostfiles, the
Slurm allocation, input globs and manifests, and this machine's topology, then calls the pure
planner. Flags override the cluster spec's ``defaults``, which override built-in defaults.

Example:

    >>> opts = LaunchOptions(hosts="localhost", replicas=4, program=("train.py",))
    >>> prepared = prepare(opts, environ={})
    >>> prepared.backend, prepared.plan.num_instances, prepared.plan.instances_source
    ('local', 1, 'default: one instance per host')
    >>> settings = ssh_settings(prepared.plan.cluster, SshOptions(user="ops", connect_timeout=3))
    >>> settings.user, settings.connect_timeout, settings.known_hosts
    ('ops', 3.0, None)
"""

from __future__ import annotations

import gc
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypeVar

from poprun_py.core.backends import capabilities, check_backend
from poprun_py.core.env import check_user_env
from poprun_py.core.hosts import HostEntry, parse_hosts, read_hostfile, slurm_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import HOST_TIMEOUT
from poprun_py.core.shard import InputSet, refuse_uneven
from poprun_py.core.spec import (
    ClusterSpec,
    EnvVar,
    HostSpec,
    JobSpec,
    SshOptions,
    check_env_name,
    cluster_from_hosts,
)
from poprun_py.core.topology import Topology
from poprun_py.errors import UsageError
from poprun_py.prepare.program import resolve_program, simulated_note
from poprun_py.process.signals import FORWARD_SIGNALS, forward_signals
from poprun_py.ssh.settings import (
    DEFAULT_CONNECT_TIMEOUT,
    check_connect_timeout,
    connect_timeout_for,
    settings_for,
)

DEFAULT_MASTER_PORT = 29500
DEFAULT_GRACE_PERIOD = 5.0
DEFAULT_HOST_TIMEOUT = HOST_TIMEOUT  # see poprun_py.core.result and the README
T = TypeVar("T")


ssh_settings = settings_for
"""How to reach a cluster's hosts: :func:`poprun_py.ssh.settings.settings_for`, by this name."""


@dataclass(frozen=True)
class LaunchOptions:
    """Every option of ``plan``, ``render`` and ``launch`` that prepares the job, as given (None =
    not given): one field per entry of :data:`poprun_py.core.options.OPTIONS` marked ``field``
    (tests/unit/test_option_catalog.py checks both ways)."""

    program: tuple[str, ...] = ()
    hosts: str | None = None
    cluster: str | None = None
    replicas: int | None = None
    instances: int | None = None
    devices_per_replica: int | None = None
    numa_aware: bool | None = None
    group_size: int | None = None
    inputs: tuple[str, ...] = ()
    eval_pad: int | None = None
    env: tuple[str, ...] = ()
    backend: str | None = None
    workdir: str | None = None
    master_port: int | None = None
    mpi_args: str | None = None
    templates: str | None = None
    grace_period: float | None = None
    connect_timeout: float | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    ssh_client: str | None = None
    fanout: int | None = None
    identity: str | None = None
    user: str | None = None
    accept_new_host_keys: bool = False
    slurm_time: str | None = None
    slurm_partition: str | None = None
    slurm_account: str | None = None
    network: str | None = None
    device_env: str | None = None
    nic_affinity: bool | None = None
    exclude: str | None = None
    max_restarts: int | None = None
    restart_delay: float | None = None
    timeout: str | None = None
    hang_timeout: float | None = None
    spare_hosts: str | None = None
    host_timeout: str | None = None  # a duration (90s, 45m, 2h, or seconds), parsed here
    strict_shards: bool | None = None
    min_progress: int | None = None
    progress_file: str | None = None
    forward_signals: str | None = None  # USR1,USR2,HUP (parsed here)
    node_rank: int | None = None  # per-node mode (poprun_py.pernode.identity)
    nnodes: int | None = None
    coordinator: str | None = None  # HOST[:PORT]
    per_node: bool = False
    join_timeout: float = 120.0  # seconds
    secret_file: str | None = None  # a path: the secret itself never passes through argv

    @property
    def ssh(self) -> SshOptions:
        """The SSH flags among these options."""
        return SshOptions(**{f.name: getattr(self, f.name) for f in fields(SshOptions)})


@dataclass(frozen=True)
class LongRun:
    """How a long run survives: whole-job restarts, spares, its clocks (None: no limit)."""

    max_restarts: int = 0
    restart_delay: float = 0.0
    timeout: float | None = None
    hang_timeout: float | None = None
    spares: tuple[HostSpec, ...] = ()
    min_progress: int | None = None  # steps an attempt must advance to be restarted
    progress_file: str | None = None  # or this file's mtime advanced during the attempt
    check_timeout: float | None = None  # --check: a spare passes the check before it is used
    check_torch: bool = False  # --check-torch: that check runs torch's Gloo all-reduce too
    forward_signals: tuple[int, ...] = FORWARD_SIGNALS  # passed on to every instance


@dataclass(frozen=True)
class Prepared:
    """A plan and the settings resolved alongside it."""

    plan: LaunchPlan
    backend: str
    mpi_args: tuple[str, ...]
    grace_period: float
    connect_timeout: float
    templates: Path | None
    local_topology: Topology | None
    options: LaunchOptions
    long_run: LongRun = field(default_factory=LongRun)
    host_timeout: float = DEFAULT_HOST_TIMEOUT  # seconds of silence after which a host is lost
    job: JobSpec | None = None  # what the plan was made from (a spare's plan is made again)
    inputs: InputSet | None = None


def prepare(opts: LaunchOptions, environ: Mapping[str, str] | None = None) -> Prepared:
    """Resolve options against the spec and the environment, and plan the job.

    The cyclic garbage collector is paused meanwhile: planning a million input files allocates
    millions of small acyclic objects, and collecting them repeatedly costs more than the work.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _prepare(opts, os.environ if environ is None else environ)
    finally:
        if gc_was_enabled:
            gc.enable()


def _prepare(opts: LaunchOptions, env: Mapping[str, str]) -> Prepared:
    _check_positive(opts)
    base = _load_base(opts.cluster)
    cluster = _with_spares(_with_ssh_flags(_cluster(opts, base, env), opts), opts.spare_hosts)
    d = cluster.defaults
    backend = check_backend(opts.backend or d.backend or _default_backend(cluster, env))
    here = capabilities(backend).runs_on_this_machine  # the hosts are simulated here
    local = here or cluster.all_local
    local_topo = _local_topology() if local else None
    job = _job(opts, cluster, env, backend)
    check_user_env([*cluster.env, *(v.name for v in job.env)])
    run = resolve_program(job, cluster, here=local)  # a .py file: the instance's Python
    job = replace(job, program=run.program)
    inputs = _inputs(opts.inputs, job.workdir)
    plan = make_plan(
        cluster,
        job,
        inputs,
        default_topology=local_topo,
        default_topology_source="this machine" if here else "assumed",
        interfaces=_local_interfaces(cluster, job.network) if local else None,
    )
    plan = _checked(plan, opts, backend, run.note, declared=bool(base and base.simulated))
    mpi_args = _split_mpi_args(opts.mpi_args) if opts.mpi_args else d.mpi_args
    return Prepared(
        plan=plan,
        backend=backend,
        mpi_args=mpi_args,
        grace_period=float(_given(opts.grace_period, d.grace_period, DEFAULT_GRACE_PERIOD)),
        connect_timeout=float(
            connect_timeout_for(cluster, opts.connect_timeout) or DEFAULT_CONNECT_TIMEOUT
        ),
        templates=Path(opts.templates) if opts.templates else None,
        local_topology=local_topo,
        options=opts,
        long_run=_long_run(opts, cluster, plan, backend),
        host_timeout=_host_timeout(opts, cluster),
        job=job,
        inputs=inputs,
    )


def _checked(
    plan: LaunchPlan, opts: LaunchOptions, backend: str, note: str | None, *, declared: bool
) -> LaunchPlan:
    """The plan with the launch's own notes (a ``.py`` run by Python; hosts the local backend
    simulates); InputError (exit 2) for uneven shards with ``--strict-shards`` (or the spec's
    ``defaults.strict_shards``)."""
    strict = _given(opts.strict_shards, plan.cluster.defaults.strict_shards, False)
    if strict and opts.inputs:
        refuse_uneven([i.shard for i in plan.instances])
    notes = [note] if note else []
    here = capabilities(backend).runs_on_this_machine
    simulated = simulated_note(plan.cluster, declared) if here else None
    notes += [simulated] if simulated else []
    return replace(plan, notes=(*plan.notes, *notes)) if notes else plan


def with_hosts_replaced(prep: Prepared, replaced: Mapping[str, str]) -> Prepared:
    """The job planned again with spare ``replaced[lost]`` in the place of each lost host: the
    same instances and replicas on each, the spare's own address and settings; the spares used
    are no longer spares. PlanError if the job cannot be planned again."""
    if not replaced:
        return prep
    cluster = prep.plan.cluster
    spares = {s.name: s for s in prep.long_run.spares}
    hosts = tuple(
        _in_place_of(h, spares[replaced[h.name]]) if h.name in replaced else h
        for h in cluster.hosts
    )
    left = tuple(s for s in prep.long_run.spares if s.name not in replaced.values())
    cluster = replace(cluster, hosts=hosts, spares=left)
    assert prep.job is not None, "a prepared job keeps its JobSpec"
    plan = make_plan(
        cluster,
        prep.job,
        prep.inputs,
        default_topology=prep.local_topology,
        default_topology_source=(
            "this machine" if capabilities(prep.backend).runs_on_this_machine else "assumed"
        ),
    )
    return replace(prep, plan=plan, long_run=replace(prep.long_run, spares=left))


def _long_run(
    opts: LaunchOptions, cluster: ClusterSpec, plan: LaunchPlan, backend: str = "local"
) -> LongRun:
    """Restarts, spares and clocks: flags over the spec's ``defaults``/``spares``; UsageError
    (exit 2, nothing started) for a negative count, a bad duration, a spare that is planned."""
    from poprun_py.core.duration import parse_duration

    d = cluster.defaults
    restarts = _given(opts.max_restarts, d.max_restarts, 0)
    if restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {restarts}")
    delay = _given(opts.restart_delay, d.restart_delay, 0.0)
    if delay < 0:
        raise UsageError(f"--restart-delay must be 0 or more, got {delay}")
    hang = _given(opts.hang_timeout, d.hang_timeout, None)
    if hang is not None and hang <= 0:
        raise UsageError(f"--hang-timeout must be more than 0, got {hang:g}")
    timeout = parse_duration(opts.timeout, "--timeout") if opts.timeout else d.timeout
    progress = _given(opts.min_progress, d.min_progress, None)
    if progress is not None and progress < 1:
        raise UsageError(f"--min-progress must be 1 or more, got {progress}")
    watched = opts.progress_file or d.progress_file
    watched = os.path.abspath(watched) if watched else None
    forward = forward_signals(opts.forward_signals or d.forward_signals, backend)
    spares = cluster.spares
    run = LongRun(restarts, float(delay), timeout, hang, spares, progress, watched)
    return replace(run, forward_signals=forward)


def _host_timeout(opts: LaunchOptions, cluster: ClusterSpec) -> float:
    """``--host-timeout`` (a duration), else the spec's ``defaults.host_timeout``, else
    :data:`DEFAULT_HOST_TIMEOUT`; UsageError (exit 2, nothing started) if not a duration."""
    from poprun_py.core.duration import parse_duration

    given = opts.host_timeout
    flag = parse_duration(given, "--host-timeout") if given is not None else None
    return _given(flag, cluster.defaults.host_timeout, DEFAULT_HOST_TIMEOUT)


def spares_only(prep: Prepared) -> Prepared | None:
    """The job planned on its spares alone (one instance each), for preflighting them with the
    others before the launch; None without spares."""
    spares = prep.long_run.spares
    if not spares or prep.job is None:
        return None
    one_each = tuple(replace(s, slots=None) for s in spares)  # slots would ask for more
    cluster = replace(prep.plan.cluster, hosts=one_each, spares=())
    job = replace(prep.job, instances=len(spares), replicas=len(spares), group_size=None)
    job = replace(job, eval_pad=None)  # planned without the inputs
    return replace(prep, plan=make_plan(cluster, job, default_topology=prep.local_topology))


def _in_place_of(lost: HostSpec, spare: HostSpec) -> HostSpec:
    """A spare taking a lost host's place runs the lost host's instances (its slots: the plan
    must stay the same), with the lost host's topology unless it declares its own."""
    return replace(spare, slots=lost.slots, topology=spare.topology or lost.topology)


def _with_spares(cluster: ClusterSpec, given: str | None) -> ClusterSpec:
    """The cluster with its spares: ``--spare-hosts N`` holds back the last N hosts given,
    ``--spare-hosts H`` names them (host syntax), else the spec's ``spares:``. UsageError for
    a spare that is also a planned host, or more spares than hosts to spare."""
    if given is not None and given.strip().isdigit():
        count, hosts = int(given), cluster.hosts
        if count >= len(hosts):
            raise UsageError(
                f"--spare-hosts {count}: more spares than the {len(hosts)} host(s) given can spare"
            )
        if count:
            cluster = replace(cluster, hosts=hosts[:-count], spares=hosts[-count:])
    elif given is not None:
        known = replace(cluster, hosts=(*cluster.hosts, *cluster.spares))
        spares = cluster_from_hosts(parse_hosts(given, read=read_hostfile), base=known).hosts
        cluster = replace(cluster, spares=spares)
    planned = {h.name for h in cluster.hosts}
    names = [s.name for s in cluster.spares]
    for name in names:
        if name in planned:
            raise UsageError(f"spare host {name} is also a planned host")
    if len(set(names)) != len(names):
        raise UsageError("a spare host is listed twice")
    return cluster


def _split_mpi_args(text: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"bad --mpi-args {text!r}: {exc}") from None


def _check_positive(opts: LaunchOptions) -> None:
    if opts.grace_period is not None and opts.grace_period < 0:
        raise UsageError(f"--grace-period must be 0 or more, got {opts.grace_period}")
    check_connect_timeout(opts.connect_timeout)


def _load_base(path: str | None) -> ClusterSpec | None:
    if path is None:
        return None
    from poprun_py.prepare.specfile import load_cluster

    return load_cluster(path)


def _cluster(opts: LaunchOptions, base: ClusterSpec | None, env: Mapping[str, str]) -> ClusterSpec:
    entries: list[HostEntry] | None = None
    if opts.hosts is not None:
        entries = parse_hosts(opts.hosts, read=read_hostfile)
    elif base is None or not base.hosts:
        entries = slurm_hosts(env) or [HostEntry("localhost")]
    if base is None:
        assert entries is not None
        simulated = capabilities(opts.backend).runs_on_this_machine  # None, unknown: False
        return _excluded(cluster_from_hosts(entries, simulated=simulated), opts)
    if entries is None:
        return _excluded(base, opts)
    return _excluded(cluster_from_hosts(entries, base=base), opts)


def _excluded(cluster: ClusterSpec, opts: LaunchOptions) -> ClusterSpec:
    """The cluster without the hosts of ``--exclude`` (names or node ranges)."""
    if not opts.exclude:
        return cluster
    from poprun_py.core.hosts import expand_names

    names = expand_names(opts.exclude, "--exclude")
    known = {h.name for h in cluster.hosts}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--exclude {unknown[0]}: not one of the hosts")
    hosts = tuple(h for h in cluster.hosts if h.name not in set(names))
    if not hosts:
        raise UsageError(f"--exclude {opts.exclude} removes every host: nothing left to run on")
    return replace(cluster, hosts=hosts)


def _local_interfaces(
    cluster: ClusterSpec, network: str | None
) -> dict[str, tuple[str, str]] | None:
    """Every host is this machine: its interface in ``network`` for all of them."""
    if network is None:
        return None
    from poprun_py.prepare.discover import discover_hardware

    found = discover_hardware(addresses=True).interface_in(network)
    return {h.name: found for h in cluster.hosts} if found else None


def _with_ssh_flags(cluster: ClusterSpec, opts: LaunchOptions) -> ClusterSpec:
    """The cluster with ``--ssh-config``/``--known-hosts`` in place of its own, so that whatever
    reaches the hosts (agents, Open MPI's own ssh) uses the same files."""
    if not (opts.ssh_config or opts.known_hosts):
        return cluster
    return replace(
        cluster,
        ssh_config=opts.ssh_config or cluster.ssh_config,
        known_hosts=opts.known_hosts or cluster.known_hosts,
    )


def _default_backend(cluster: ClusterSpec, env: Mapping[str, str]) -> str:
    if cluster.all_local:
        return "local"
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST"):
        return "slurm"
    return "ssh"


def _local_topology() -> Topology:
    from poprun_py.prepare.discover import discover_machine

    return discover_machine()


def _job(
    opts: LaunchOptions, cluster: ClusterSpec, env: Mapping[str, str], backend: str
) -> JobSpec:
    d = cluster.defaults
    instances = _given(opts.instances, d.instances, None)
    fallback = instances if instances is not None else _default_instances(cluster)
    replicas = _given(opts.replicas, d.replicas, fallback)
    return JobSpec(
        program=opts.program,
        replicas=replicas,
        instances=opts.instances,
        devices_per_replica=_given(opts.devices_per_replica, d.devices_per_replica, 1),
        numa_aware=_given(opts.numa_aware, d.numa_aware, True),
        group_size=_given(opts.group_size, d.group_size, None),
        env=tuple(EnvVar.parse(e, env) for e in opts.env),
        workdir=opts.workdir or cluster.workdir,
        eval_pad=opts.eval_pad,
        master_port=_master_port(opts, cluster, backend),
        network=_network(opts.network, cluster.network),
        device_env=check_env_name(opts.device_env, "--device-env") if opts.device_env else None,
        nic_affinity=bool(opts.nic_affinity),
    )


def _network(flag: str | None, spec: str | None) -> str | None:
    """``--network`` (else the spec's ``network:``) as a normalized CIDR."""
    if flag is None:
        return spec
    from poprun_py.core.hardware import parse_cidr
    from poprun_py.core.topology import TopologyError

    try:
        return str(parse_cidr(flag))
    except TopologyError:
        raise UsageError(f"bad --network {flag!r}: not a CIDR such as 10.0.0.0/16") from None


def _given(flag: T | None, spec: T | None, builtin: T) -> T:
    """The flag's value, else the spec's ``defaults``, else the built-in one."""
    return flag if flag is not None else spec if spec is not None else builtin


def _default_instances(cluster: ClusterSpec) -> int:
    slots = [h.slots for h in cluster.hosts]
    if all(s is not None for s in slots):
        return sum(s for s in slots if s is not None)
    return len(cluster.hosts)


def _master_port(opts: LaunchOptions, cluster: ClusterSpec, backend: str) -> int:
    if opts.master_port is not None and not 1 <= opts.master_port <= 65535:
        raise UsageError(f"--master-port must be 1-65535, got {opts.master_port}")
    port = _given(opts.master_port, cluster.defaults.master_port, None)
    if port is not None:
        return port
    here = capabilities(backend).runs_on_this_machine or cluster.all_local
    return free_port() if here else DEFAULT_MASTER_PORT


def free_port() -> int:
    """A TCP port free on this machine right now (for local jobs' MASTER_PORT)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _inputs(patterns: tuple[str, ...], workdir: str | None) -> InputSet | None:
    if not patterns:
        return None
    from poprun_py.prepare.inputs import collect_inputs

    return collect_inputs(patterns, cwd=workdir if workdir and os.path.isdir(workdir) else None)
