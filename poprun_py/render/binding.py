"""Instance bindings as data: which CPUs and NUMA nodes each instance is bound to.

The render step turns the plan's per-instance CPUs and NUMA nodes into a :class:`Binding`,
kept only where it changes something on the machine that runs the instance (:class:`Binder`).
The backends apply it themselves (:mod:`poprun_py.hostside.binding`); templates see it as
``inst.binding`` and ``inst.numactl``.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.topology import uniform
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1"), topology=uniform(2, 4)),
    ...                  JobSpec(("prog",), replicas=2, instances=2))
    >>> Binder(plan, {})(plan.instances[1])
    Binding(cpus='4-7', nodes='1', cpu_ids=(4, 5, 6, 7), node_ids=(1,))
    >>> binds_itself(("numactl", "--physcpubind=0", "prog"))
    True
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poprun_py.core.plan import InstancePlan, LaunchPlan, binds
from poprun_py.core.topology import Topology, format_cpulist


@dataclass(frozen=True)
class Binding:
    """The CPUs and NUMA nodes an instance is bound to: ``cpus``/``nodes`` as cpulists (for
    templates), ``cpu_ids``/``node_ids`` as ids (for the backends); ``nodes`` is empty when no
    memory binding applies."""

    cpus: str
    nodes: str
    cpu_ids: tuple[int, ...] = ()
    node_ids: tuple[int, ...] = ()


def binding_dict(binding: Binding | None) -> dict[str, list[int]] | None:
    """The binding as JSON-ready data (``render --format json``), None when unbound."""
    if binding is None:
        return None
    return {"cpus": list(binding.cpu_ids), "numa_nodes": list(binding.node_ids)}


def binds_itself(argv: Sequence[str]) -> bool:
    """True when a command binds itself (a template's numactl prefix)."""
    return bool(argv) and posixpath.basename(argv[0]) == "numactl"


class Binder:
    """Bindings, restricted to the CPUs and NUMA nodes the real machine has; None where the
    plan does not bind (:func:`poprun_py.core.plan.binds`) or nothing of it exists there, or
    where it would hold every CPU and NUMA node of the real machine (a binding that changes
    nothing)."""

    def __init__(self, plan: LaunchPlan, available: Mapping[str, Topology | None]):
        self.plan, self.enabled = plan, plan.numa_aware
        self.real: dict[str, tuple[frozenset[int], frozenset[int]]] = {}
        for name, topo in available.items():
            if topo is not None:
                self.real[name] = (frozenset(topo.cpus), frozenset(n.id for n in topo.numa_nodes))
        self.cache: dict[tuple[str, tuple[int, ...], tuple[int, ...]], Binding | None] = {}

    def __call__(self, inst: InstancePlan) -> Binding | None:
        """The binding of ``inst`` (cached per host, CPUs and nodes), or None."""
        if not self.enabled or not binds(self.plan, inst):
            return None
        host = inst.host if inst.host in self.real else ""
        key = (host, inst.cpus, inst.numa_nodes)
        if key not in self.cache:
            self.cache[key] = self._binding(*key)
        return self.cache[key]

    def _binding(self, host: str, cpus: tuple[int, ...], nodes: tuple[int, ...]) -> Binding | None:
        if host in self.real:
            have_cpus, have_nodes = self.real[host]
            cpus = tuple(c for c in cpus if c in have_cpus)
            nodes = tuple(n for n in nodes if n in have_nodes)
            if set(cpus) == have_cpus and set(nodes) in (set(), have_nodes):
                return None  # every CPU and node of the machine: binding changes nothing
        if not cpus:
            return None
        return Binding(format_cpulist(cpus), format_cpulist(nodes), cpus, nodes)
