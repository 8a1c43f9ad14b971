"""The launch plan: which instance runs on which host, NUMA nodes, CPUs, devices, replicas,
communication groups and input shard. Pure: data in, data out.

Rules (PopRun's, plus poprun-py's own checks):

- replicas are split evenly over instances; instances go to hosts by their slots (hostfile
  ``slots=N``, spec ``slots:``; every host or none has slots, and they add up to
  ``--instances``), else evenly;
- ``--instances`` defaults to the cluster's default, else the sum of the slots, else one
  instance per host; ``--replicas`` defaults to the cluster's default, else one per instance;
- with NUMA awareness each host's NUMA nodes are divided evenly among its instances (PopRun's
  ``spreadnuma``); instances sharing a node split its CPUs; an instance that would hold every
  CPU of its host (one NUMA node holding them all, or one instance a host) is not bound
  (:func:`binds`): the binding would change nothing, and the plan's notes say so;
- each instance takes ``local replicas x devices per replica`` devices from its host, in order;
- ``--group-size G`` makes replica groups of G consecutive replicas, kept within a host when the
  host's replica count is a multiple of G (the plan says so when it is not).

Example:

    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.topology import uniform
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(2, 4))
    >>> plan = make_plan(cluster, JobSpec(program=("train.py",), replicas=8, instances=4))
    >>> [(i.host, i.replica_offset, i.num_local_replicas, i.numa_nodes) for i in plan.instances]
    [('h1', 0, 2, (0,)), ('h1', 2, 2, (1,)), ('h2', 4, 2, (0,)), ('h2', 6, 2, (1,))]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from poprun_py.core.shard import EMPTY_SHARD, InputSet, Shard, assign_shards, uneven_shards
from poprun_py.core.spec import ClusterSpec, EnvVar, HostSpec, JobSpec
from poprun_py.core.topology import Topology
from poprun_py.errors import PlanError


@dataclass(frozen=True)
class InstancePlan:
    """One instance: where it runs, what it drives, and what it reads."""

    index: int
    host: str
    host_index: int
    local_index: int
    num_local_instances: int
    replica_offset: int
    num_local_replicas: int
    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]
    devices: tuple[int, ...]
    groups: tuple[int, ...]
    shard: Shard


@dataclass(frozen=True)
class HostPlan:
    """One host of the plan, its topology (and where that came from) and its instances."""

    index: int
    spec: HostSpec
    topology: Topology | None
    topology_source: str
    instances: tuple[int, ...]

    @property
    def name(self) -> str:
        """The host's name."""
        return self.spec.name


@dataclass(frozen=True)
class LaunchPlan:
    """The whole plan: sizes, hosts, instances, groups, and what every instance runs."""

    cluster: ClusterSpec
    program: tuple[str, ...]
    num_replicas: int
    num_instances: int
    devices_per_replica: int
    numa_aware: bool
    instances_source: str
    hosts: tuple[HostPlan, ...]
    instances: tuple[InstancePlan, ...]
    group_size: int | None
    groups_cross_hosts: bool
    env: tuple[EnvVar, ...]
    workdir: str | None
    master_addr: str
    master_port: int
    eval_pad: int | None
    notes: tuple[str, ...]
    network: str | None = None
    interfaces: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    device_env: str | None = None
    nic_affinity: bool = False

    @property
    def replicas_per_instance(self) -> int:
        """Replicas driven by each instance (uniform by construction)."""
        return self.num_replicas // self.num_instances


def make_plan(
    cluster: ClusterSpec,
    job: JobSpec,
    inputs: InputSet | None = None,
    *,
    default_topology: Topology | None = None,
    default_topology_source: str = "assumed",
    discovered: Mapping[str, Topology | None] | None = None,
    interfaces: Mapping[str, tuple[str, str]] | None = None,
) -> LaunchPlan:
    """Plan ``job`` on ``cluster``; raise PlanError with one clear line if it is impossible."""
    hosts = cluster.hosts
    if not hosts:
        raise PlanError("no hosts to run on")
    instances, source = _num_instances(cluster, job)
    _check_sizes(job.replicas, instances, job)
    counts = host_counts(cluster, instances, source)
    host_plans, notes = _host_plans(
        hosts, counts, default_topology, default_topology_source, discovered or {}
    )
    per_instance = job.replicas // instances
    shards = _shards(inputs, instances, job.eval_pad)
    plans = _instance_plans(host_plans, per_instance, job, shards)
    host_replicas = [c * per_instance for c in counts]
    crosses = _groups_cross(job.group_size, host_replicas)
    notes += _plan_notes(job, host_plans, plans, host_replicas if crosses else None)
    notes += uneven_shards(shards) if inputs is not None and inputs.paths else []
    found = {h.name: interfaces[h.name] for h in hosts if interfaces and h.name in interfaces}
    return LaunchPlan(
        cluster=cluster,
        program=job.program,
        num_replicas=job.replicas,
        num_instances=instances,
        devices_per_replica=job.devices_per_replica,
        numa_aware=job.numa_aware,
        instances_source=source,
        hosts=tuple(host_plans),
        instances=tuple(plans),
        group_size=job.group_size,
        groups_cross_hosts=crosses,
        env=tuple(_merge_env(cluster, job)),
        workdir=job.workdir or cluster.workdir,
        master_addr=_master_addr(cluster, found),
        master_port=job.master_port,
        eval_pad=job.eval_pad,
        notes=tuple(notes),
        network=job.network,
        interfaces=found,
        device_env=job.device_env,
        nic_affinity=job.nic_affinity,
    )


def _instance_plans(
    host_plans: Sequence[HostPlan], per_instance: int, job: JobSpec, shards: Sequence[Shard]
) -> list[InstancePlan]:
    """Every instance, host by host: its binding, replicas, groups and shard."""
    plans = []
    for hp in host_plans:
        count = len(hp.instances)
        for local, (nodes, cpus, devices) in enumerate(_bind(hp, count, per_instance, job)):
            index = hp.instances[local]
            offset = index * per_instance
            groups = _groups(offset, per_instance, job.group_size)
            plans.append(
                InstancePlan(
                    index,
                    hp.name,
                    hp.index,
                    local,
                    count,
                    offset,
                    per_instance,
                    nodes,
                    cpus,
                    devices,
                    groups,
                    shards[index],
                )
            )
    return plans


def _plan_notes(
    job: JobSpec,
    host_plans: Sequence[HostPlan],
    plans: Sequence[InstancePlan],
    crossing: Sequence[int] | None,
) -> list[str]:
    """The plan's notes after the hosts' own, in order: replica groups that cross hosts (given
    as the hosts' replica counts), slots, NUMA binding, device placement."""
    notes = []
    if crossing is not None:
        notes.append(_cross_note(job.group_size or 1, crossing, host_plans))
    notes += _slots_note(host_plans)
    if not job.numa_aware:
        notes.append("NUMA binding is off (--no-numa-aware): instances are not bound")
    notes += _unbound_notes(host_plans, plans) if job.numa_aware else []
    notes += _placement_notes(host_plans)
    return notes


def _master_addr(cluster: ClusterSpec, interfaces: Mapping[str, tuple[str, str]]) -> str:
    first = cluster.hosts[0]
    if first.name in interfaces:
        return interfaces[first.name][1]
    return "127.0.0.1" if cluster.simulated else first.target


def network_choice(plan: LaunchPlan) -> str:
    """Which network the instances talk on, and why (one line for the plan's summary)."""
    cluster = plan.cluster
    if plan.network is None:
        first = cluster.hosts[0]
        where = "this machine" if cluster.all_local else f"{first.name}'s SSH address"
        return (
            f"none chosen (no --network): MASTER_ADDR is {where} ({plan.master_addr}); "
            "Gloo and NCCL pick their own interface"
        )
    if not plan.interfaces:
        return f"{plan.network} (--network): each host's interface in it is found in preflight"
    names = sorted({name for name, _ in plan.interfaces.values()})
    return (
        f"{plan.network} (--network): interface(s) {', '.join(names)}; "
        f"MASTER_ADDR {plan.master_addr}"
    )


def _first_three(names: Sequence[str]) -> str:
    """``h1, h2, h3 (+5)``: a note's hosts: the first three, then how many more."""
    return ", ".join(names[:3]) + (f" (+{len(names) - 3})" * (len(names) > 3))


def _placement_notes(hosts: Sequence[HostPlan]) -> list[str]:
    unknown = [h.name for h in hosts if h.topology is not None and not h.topology.devices_placed]
    if not unknown:
        return []
    return [
        f"devices of {_first_three(unknown)}: the firmware "
        "reports numa_node -1; spread over the NUMA nodes in order"
    ]


def _num_instances(cluster: ClusterSpec, job: JobSpec) -> tuple[int, str]:
    if job.instances is not None:
        return job.instances, "--instances"
    if cluster.defaults.instances is not None:
        return cluster.defaults.instances, f"default of cluster {cluster.name}"
    slots = [h.slots for h in cluster.hosts]
    if all(s is not None for s in slots):
        return sum(s for s in slots if s is not None), "default: hostfile slots"
    return len(cluster.hosts), "default: one instance per host"


def host_counts(cluster: ClusterSpec, instances: int, source: str) -> tuple[int, ...]:
    """How many of the ``instances`` each host runs: its slots when the hosts have slots (they
    must add up), else an even share. PlanError (one line) otherwise.

    >>> from poprun_py.core.spec import ClusterSpec, HostSpec
    >>> host_counts(ClusterSpec("c", (HostSpec("a", slots=3), HostSpec("b", slots=1))), 4, "")
    (3, 1)
    """
    hosts = cluster.hosts
    slots = [h.slots for h in hosts]
    if all(s is None for s in slots):
        if instances % len(hosts):
            raise PlanError(
                f"{_asked(instances, source)} is not a multiple of the number of hosts "
                f"({len(hosts)})"
            )
        return (instances // len(hosts),) * len(hosts)
    if any(s is None for s in slots):
        given = next(h.name for h in hosts if h.slots is not None)
        bare = next(h.name for h in hosts if h.slots is None)
        raise PlanError(
            f"host {given} has slots but host {bare} has none: give every host slots, or none"
        )
    total = sum(s for s in slots if s is not None)
    if total != instances:
        raise PlanError(
            f"the hosts' slots add up to {total} ({_each(hosts, slots)}), "
            f"not to {_asked(instances, source)}"
        )
    return tuple(s for s in slots if s is not None)


def _asked(instances: int, source: str) -> str:
    """How the instance count was asked for, in the user's own terms."""
    if source == "--instances":
        return f"--instances {instances}"
    return f"{instances} instances ({source})"


def _each(hosts: Sequence[HostSpec], counts: Sequence[int | None]) -> str:
    """``h1 3, h2 1`` (the first four hosts)."""
    shown = ", ".join(f"{h.name} {n}" for h, n in zip(hosts[:4], counts, strict=False))
    return shown + ", ..." * (len(hosts) > 4)


def _check_sizes(replicas: int, instances: int, job: JobSpec) -> None:
    if replicas < 1:
        raise PlanError(f"--replicas must be at least 1, got {replicas}")
    if instances < 1:
        raise PlanError(f"--instances must be at least 1, got {instances}")
    if job.devices_per_replica < 0:
        raise PlanError(f"--devices-per-replica must be 0 or more, got {job.devices_per_replica}")
    if instances > replicas:
        raise PlanError(f"more instances ({instances}) than replicas ({replicas})")
    if replicas % instances:
        raise PlanError(f"--replicas {replicas} is not a multiple of --instances {instances}")
    if job.group_size is not None:
        if job.group_size < 1:
            raise PlanError(f"--group-size must be at least 1, got {job.group_size}")
        if replicas % job.group_size:
            raise PlanError(
                f"--replicas {replicas} is not a multiple of --group-size {job.group_size}"
            )


def _host_plans(
    hosts: Sequence[HostSpec],
    counts: Sequence[int],
    default: Topology | None,
    default_source: str,
    discovered: Mapping[str, Topology | None],
) -> tuple[list[HostPlan], list[str]]:
    plans, assumed = [], []
    firsts = [0, *itertools.accumulate(counts)]  # each host's first instance
    for index, host in enumerate(hosts):
        topo, source = host.topology, "declared"
        if topo is None and discovered.get(host.name) is not None:
            topo, source = discovered[host.name], "discovered"
        if topo is None:
            topo, source = default, default_source if default is not None else "unknown"
            assumed.append(host.name)
        first = firsts[index]
        ids = tuple(range(first, first + counts[index]))
        plans.append(HostPlan(index, host, topo, source, ids))
    notes = []
    if assumed and default is not None and default_source == "assumed":
        notes.append(
            f"topology of {len(assumed)} host(s) not declared; assumed to match this machine "
            f"({default.describe()})"
        )
    return plans, notes


_Binding = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _bind(hp: HostPlan, per_host: int, per_instance: int, job: JobSpec) -> list[_Binding]:
    topo = hp.topology
    need = per_instance * job.devices_per_replica
    devices = topo.devices if topo else ()
    if devices and need * per_host > len(devices):
        raise PlanError(
            f"host {hp.name} has {len(devices)} devices; {per_host} instance(s) x "
            f"{per_instance} replica(s) x {job.devices_per_replica} device(s) need "
            f"{need * per_host}"
        )
    numa = _shared_split(topo, per_host) if (job.numa_aware and topo) else None
    by_node = bool(numa and topo and topo.devices_placed and devices and need)
    result = []
    for local in range(per_host):
        mine = devices[local * need : (local + 1) * need] if devices else ()
        nodes, cpus = numa[local] if numa else ((), ())
        if by_node and topo and numa:
            sets = [n for n, _ in numa]
            mine = _node_devices(hp.name, topo, node_sets=sets, local=local, need=need, job=job)
        result.append((nodes, cpus, tuple(mine)))
    return result


def _node_devices(
    host: str,
    topo: Topology,
    *,
    node_sets: list[tuple[int, ...]],
    local: int,
    need: int,
    job: JobSpec,
) -> tuple[int, ...]:
    """The devices of an instance's own NUMA nodes (taken in order by the instances bound to
    the same nodes); PlanError when they are fewer than it needs."""
    nodes = node_sets[local]
    sharers = [k for k, other in enumerate(node_sets) if other == nodes]
    pool = [d for n in topo.numa_nodes if n.id in nodes for d in n.devices]
    part = sharers.index(local)
    share = pool[part * need : (part + 1) * need]  # in order, as without NUMA awareness
    if len(share) < need:
        where = ",".join(map(str, nodes))
        raise PlanError(
            f"host {host}: NUMA node(s) {where} give {len(pool) // len(sharers)} device(s) per "
            f"instance; {need // max(job.devices_per_replica, 1)} replica(s) x "
            f"{job.devices_per_replica} device(s) need {need} "
            "(fewer devices per replica, or fewer instances per host)"
        )
    return tuple(share[:need])


_Split = list[tuple[tuple[int, ...], tuple[int, ...]]]
_SPLITS: dict[tuple[int, int], tuple[Topology, _Split]] = {}


def _shared_split(topo: Topology, count: int) -> _Split:
    """:func:`_numa_split`, made once per topology object and count (hosts share them)."""
    hit = _SPLITS.get((id(topo), count))
    if hit is None or hit[0] is not topo:
        if len(_SPLITS) >= 256:
            _SPLITS.clear()
        hit = _SPLITS[(id(topo), count)] = (topo, _numa_split(topo, count))
    return hit[1]


def _numa_split(topo: Topology, count: int) -> _Split:
    """Divide a host's NUMA nodes among ``count`` instances (PopRun's spreadnuma)."""
    nodes = topo.numa_nodes
    n = len(nodes)
    if count <= n:
        blocks = [nodes[i * n // count : (i + 1) * n // count] for i in range(count)]
        return [(tuple(x.id for x in b), tuple(c for x in b for c in x.cpus)) for b in blocks]
    result: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for local in range(count):
        node_pos = local * n // count
        sharers = [k for k in range(count) if k * n // count == node_pos]
        cpus = nodes[node_pos].cpus
        part = sharers.index(local)
        mine = cpus[part * len(cpus) // len(sharers) : (part + 1) * len(cpus) // len(sharers)]
        result.append(((nodes[node_pos].id,), mine or cpus))
    return result


UNBOUND_NOTE = "binding would change nothing"


def binds(plan: LaunchPlan, inst: InstancePlan) -> bool:
    """True when the plan binds ``inst``: NUMA-aware, and its CPUs are not every CPU of its
    host's topology (then a binding would change nothing, and none is made)."""
    if not plan.numa_aware or not inst.cpus:
        return False
    return not _holds_every_cpu(plan.hosts[inst.host_index], inst.cpus)


def _holds_every_cpu(hp: HostPlan, cpus: tuple[int, ...]) -> bool:
    return hp.topology is not None and _every_cpu(hp.topology).issubset(cpus)


_CPU_SETS: dict[int, tuple[Topology, frozenset[int]]] = {}


def _every_cpu(topo: Topology) -> frozenset[int]:
    """Every CPU of ``topo``, as a set: made once per topology object (thousands of hosts
    share one), not once per instance (:attr:`Topology.cpus` builds its tuple each time)."""
    hit = _CPU_SETS.get(id(topo))
    if hit is None or hit[0] is not topo:
        if len(_CPU_SETS) >= 256:
            _CPU_SETS.clear()
        hit = _CPU_SETS[id(topo)] = (topo, frozenset(topo.cpus))
    return hit[1]


def _unbound_notes(hosts: Sequence[HostPlan], instances: Sequence[InstancePlan]) -> list[str]:
    """One note for the hosts whose instances are left unbound: they would hold every CPU."""
    unbound = {
        i.host_index for i in instances if i.cpus and _holds_every_cpu(hosts[i.host_index], i.cpus)
    }
    whole = [hp for hp in hosts if hp.index in unbound]
    if not whole:
        return []
    names = _first_three([hp.name for hp in whole])
    one_node = all(hp.topology is not None and len(hp.topology.numa_nodes) == 1 for hp in whole)
    why = "one NUMA node holds every CPU" if one_node else "an instance holds every CPU"
    return [f"{UNBOUND_NOTE} on {names} ({why}): those instances are not bound"]


def _groups(offset: int, count: int, size: int | None) -> tuple[int, ...]:
    if size is None:
        return ()
    return tuple(range(offset // size, (offset + count - 1) // size + 1))


def _groups_cross(size: int | None, host_replicas: Sequence[int]) -> bool:
    """True when a replica group of ``size`` spans hosts: some host's replica count is not a
    multiple of it (hosts' replicas are consecutive, so their offsets then are not either)."""
    return size is not None and len(host_replicas) > 1 and any(n % size for n in host_replicas)


def _cross_note(size: int, host_replicas: Sequence[int], hosts: Sequence[HostPlan]) -> str:
    if len(set(host_replicas)) == 1:
        per_host = host_replicas[0]
        if size > per_host:
            why = f"each host has only {per_host} replica(s)"
        else:
            why = f"{per_host} replicas per host is not a multiple of {size}"
    else:
        k = next(k for k, n in enumerate(host_replicas) if n % size)
        why = f"host {hosts[k].name} has {host_replicas[k]} replica(s), not a multiple of {size}"
    return f"replica groups of {size} cross host boundaries: {why}"


def _slots_note(hosts: Sequence[HostPlan]) -> list[str]:
    """One note when hosts run different numbers of instances (their slots)."""
    counts = [len(h.instances) for h in hosts]
    if len(set(counts)) < 2:
        return []
    each = _each([h.spec for h in hosts], counts)
    return [f"instances per host follow the hosts' slots: {each} (LOCAL_WORLD_SIZE differs)"]


def _shards(inputs: InputSet | None, instances: int, eval_pad: int | None) -> list[Shard]:
    if inputs is None or not inputs.paths:
        if eval_pad is not None:
            raise PlanError("--eval-pad needs input files (--input)")
        return [EMPTY_SHARD] * instances
    return assign_shards(inputs, instances, eval_pad)


def _merge_env(cluster: ClusterSpec, job: JobSpec) -> list[EnvVar]:
    merged = {k: EnvVar(k, v) for k, v in cluster.env.items()}
    merged.update({e.name: e for e in job.env})
    return list(merged.values())


def replan_with_topologies(
    plan: LaunchPlan,
    found: Mapping[str, Topology | None],
    interfaces: Mapping[str, tuple[str, str]] | None = None,
) -> LaunchPlan:
    """``plan`` again with discovered topologies for the hosts whose spec declared none, and
    with each host's interface in ``--network`` (``interfaces``: host -> (name, address)).

    Sizes, shards and notes that do not concern topology or network are kept."""
    cluster = plan.cluster
    same_net = not interfaces or dict(interfaces) == dict(plan.interfaces)
    if same_net and all(h.topology is not None or found.get(h.name) is None for h in cluster.hosts):
        return plan
    job = JobSpec(
        program=plan.program,
        replicas=plan.num_replicas,
        instances=plan.num_instances,
        devices_per_replica=plan.devices_per_replica,
        numa_aware=plan.numa_aware,
        group_size=plan.group_size,
        workdir=plan.workdir,
        master_port=plan.master_port,
        network=plan.network,
        device_env=plan.device_env,
        nic_affinity=plan.nic_affinity,
    )
    fresh = make_plan(cluster, job, discovered=found, interfaces=interfaces or plan.interfaces)
    kept = ("assumed", UNBOUND_NOTE, "numa_node -1")
    return replace(
        fresh,
        env=plan.env,
        instances_source=plan.instances_source,
        eval_pad=plan.eval_pad,
        instances=tuple(
            replace(new, shard=old.shard)
            for new, old in zip(fresh.instances, plan.instances, strict=True)
        ),
        notes=tuple(n for n in plan.notes if not any(k in n for k in kept))
        + tuple(n for n in fresh.notes if any(k in n for k in kept[1:])),
    )
