"""NUMA topology of a host, and pure parsers for the text that describes it.

The parsers take text (the contents of ``/sys/devices/system/node/node*/cpulist`` or the output of
``lscpu -p``) and return a :class:`Topology`; they do no I/O, so local discovery (``probe.py``) and
remote discovery over ssh share them.

Example:

    >>> topo = parse_sysfs_nodes({"node0": "0-3", "node1": "4-7\\n"})
    >>> [n.cpus for n in topo.numa_nodes]
    [(0, 1, 2, 3), (4, 5, 6, 7)]
    >>> parse_cpulist("0-2,8,10-11")
    (0, 1, 2, 8, 10, 11)
    >>> [n.cpus for n in within(topo, (1, 2, 3)).numa_nodes]   # taskset -c 1-3, a cpuset
    [(1, 2, 3)]
    >>> parse_memory("48Gi"), format_memory(2 * parse_memory("48Gi"))   # a spec's memory:
    (51539607552, '96Gi')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from poprun_py.errors import UsageError


class TopologyError(UsageError):
    """Text that does not describe a topology."""


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id, its CPUs, the devices attached to it and its memory in bytes
    (None: not declared)."""

    id: int
    cpus: tuple[int, ...]
    devices: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()  # RDMA ports attached here, "mlx5_0:1"
    memory: int | None = None


@dataclass(frozen=True)
class Topology:
    """A host's NUMA nodes, in id order, and what its devices are: ``device_kind`` nvidia, amd
    or None (declared, generic), ``device_env`` the variable naming them (spec ``device_env:``),
    ``devices_placed`` false when the firmware did not say their NUMA nodes, ``cuda_ordinals``
    true when the ids are nvidia-smi's."""

    numa_nodes: tuple[NumaNode, ...]
    device_kind: str | None = None
    device_env: str | None = None
    devices_placed: bool = True
    cuda_ordinals: bool = False

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every CPU of the host, in NUMA-node order."""
        return tuple(c for n in self.numa_nodes for c in n.cpus)

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device of the host, in NUMA-node order."""
        return tuple(d for n in self.numa_nodes for d in n.devices)

    @property
    def memory(self) -> int | None:
        """The host's memory in bytes: its NUMA nodes' together, None unless every one's is
        known."""
        sizes = [n.memory for n in self.numa_nodes]
        if not sizes or any(m is None for m in sizes):
            return None
        return sum(m or 0 for m in sizes)

    def describe(self) -> str:
        """A short summary such as ``2 NUMA nodes, 16 CPUs, 4 devices``."""
        return (
            f"{len(self.numa_nodes)} NUMA node{'s' * (len(self.numa_nodes) != 1)}, "
            f"{len(self.cpus)} CPUs, {len(self.devices)} devices"
        )


_BINARY: Mapping[str, int] = {u: 1024**p for p, u in enumerate((f"{c}i" for c in "KMGTPE"), 1)}
_DECIMAL: Mapping[str, int] = {u: 1000**p for p, u in enumerate("kMGTPE", 1)}
_UNITS: Mapping[str, int] = {**_BINARY, **_DECIMAL, "K": 1000}
"""Kubernetes' quantity suffixes for a memory size (and ``K``, read as ``k``): binary first."""
_MEMORY = re.compile(rf"(\d+(?:\.\d+)?)({'|'.join(_UNITS)})?")


def parse_memory(value: int | str) -> int:
    """A memory size in bytes: an int is bytes; text is a number with an optional Kubernetes
    suffix (``96Gi``, ``512G``, ``1.5Ti``) that comes to a whole number of bytes.

    >>> parse_memory("96Gi"), parse_memory("512G"), parse_memory("1.5Ki"), parse_memory(4096)
    (103079215104, 512000000000, 1536, 4096)
    >>> parse_memory("96GB")
    Traceback (most recent call last):
    ...
    poprun_py.core.topology.TopologyError: '96GB' is not a memory size: bytes, or a number \
with a unit such as 96Gi or 512G (Ki Mi Gi Ti Pi Ei, k M G T P E)
    """
    if isinstance(value, bool):
        raise TopologyError(f"{value!r} is not a memory size")
    if isinstance(value, int):
        if value < 0:
            raise TopologyError(f"{value} is not a memory size: less than 0")
        return value
    match = _MEMORY.fullmatch(value)
    if not match:
        raise TopologyError(
            f"{value!r} is not a memory size: bytes, or a number with a unit such as 96Gi or "
            f"512G ({' '.join(_BINARY)}, {' '.join(_DECIMAL)})"
        )
    size = Fraction(match.group(1)) * _UNITS.get(match.group(2) or "", 1)
    if size.denominator != 1:
        raise TopologyError(f"{value!r} is not a whole number of bytes")
    return int(size)


def format_memory(size: int) -> str:
    """``size`` bytes as a Kubernetes quantity: the unit giving the smallest whole number, of
    the binary and the decimal ones (binary on a tie), plain bytes when none divides it.

    >>> [format_memory(n) for n in (103079215104, 512 * 10**9, 1536, 2**20 * 1000, 0)]
    ['96Gi', '512G', '1536', '1000Mi', '0']
    """
    best, text = size, str(size)
    for unit, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if size % factor == 0 and size // factor < best:
            best, text = size // factor, f"{size // factor}{unit}"
    return text


_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse a Linux cpulist (``0-3,8,10-15:2``) into a sorted tuple of CPU ids."""
    cpus: set[int] = set()
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            continue
        match = _RANGE.match(part)
        if not match:
            raise TopologyError(f"bad cpulist element {part!r} in {text.strip()!r}")
        lo, hi, step = match.group(1), match.group(2), match.group(3)
        first, last = int(lo), int(hi) if hi is not None else int(lo)
        if last < first:
            raise TopologyError(f"bad cpulist range {part!r}: end before start")
        cpus.update(range(first, last + 1, int(step) if step else 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids as a compact cpulist (``0-3,8``), the inverse of :func:`parse_cpulist`."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_sysfs_nodes(cpulists: Mapping[str, str]) -> Topology:
    """Build a topology from ``{"node0": "<cpulist text>", ...}`` (sysfs node directory names)."""
    nodes = []
    for name, text in cpulists.items():
        match = re.fullmatch(r"node(\d+)", name)
        if not match:
            raise TopologyError(f"bad NUMA node name {name!r}; expected nodeN")
        nodes.append(NumaNode(int(match.group(1)), parse_cpulist(text)))
    if not nodes:
        raise TopologyError("no NUMA nodes found")
    return Topology(tuple(sorted(nodes, key=lambda n: n.id)))


def parse_lscpu(text: str) -> Topology:
    """Build a topology from ``lscpu -p=CPU,NODE`` (or plain ``lscpu -p``) output.

    Lines starting with ``#`` are comments; the column order is taken from the last comment line
    that names the columns, and defaults to lscpu's ``CPU,Core,Socket,Node,...``.
    """
    columns = ["CPU", "CORE", "SOCKET", "NODE"]
    by_node: dict[int, list[int]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            fields = [f.strip().upper() for f in line.lstrip("#").split(",")]
            if "CPU" in fields:
                columns = fields
            continue
        if not line:
            continue
        values = line.split(",")
        try:
            cpu = int(values[columns.index("CPU")])
            node_text = values[columns.index("NODE")] if "NODE" in columns else "0"
            node = int(node_text) if node_text else 0
        except (ValueError, IndexError) as exc:
            raise TopologyError(f"bad lscpu line {line!r}") from exc
        by_node.setdefault(node, []).append(cpu)
    if not by_node:
        raise TopologyError("lscpu output lists no CPUs")
    return Topology(tuple(NumaNode(n, tuple(sorted(c))) for n, c in sorted(by_node.items())))


def uniform(num_nodes: int, cpus_per_node: int, devices_per_node: int = 0) -> Topology:
    """A regular topology: ``num_nodes`` nodes with consecutive CPUs and devices."""
    return Topology(
        tuple(
            NumaNode(
                i,
                tuple(range(i * cpus_per_node, (i + 1) * cpus_per_node)),
                tuple(range(i * devices_per_node, (i + 1) * devices_per_node)),
            )
            for i in range(num_nodes)
        )
    )


def within(topo: Topology, allowed: Iterable[int]) -> Topology:
    """``topo`` cut down to the CPUs a process may use there (its affinity: ``taskset``, a
    cgroup's cpuset, a Slurm allocation), as hwloc and Open MPI see a machine: each NUMA node
    keeps its allowed CPUs, and a node left with none is dropped unless devices are attached to
    it (a node that never had CPUs, memory only, stays). A binding outside them would fail
    (``numactl: <1> is invalid``). Unchanged when no CPU of ``topo`` is allowed: then ``allowed``
    describes another machine."""
    keep = set(allowed)
    if not keep & set(topo.cpus):
        return topo
    nodes = tuple(
        replace(n, cpus=tuple(c for c in n.cpus if c in keep))
        for n in topo.numa_nodes
        if not n.cpus or n.devices or keep & set(n.cpus)
    )
    return replace(topo, numa_nodes=nodes)
