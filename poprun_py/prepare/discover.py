"""Local discovery: this machine's NUMA topology, read from /sys (or ``lscpu``) and parsed by the
pure parsers in :mod:`poprun_py.core.topology`. Remote discovery over ssh reuses the same parsers.

GPUs, RDMA NICs and interfaces come from :func:`discover_hardware`, which runs the same
shell snippet preflight runs on remote hosts (:data:`poprun_py.core.hardware.DISCOVERY_SCRIPT`)
and parses its text with the same parser.

Example:

    >>> topo = discover_local()
    >>> len(topo.cpus) >= 1
    True
    >>> hw = discover_hardware(addresses=True)
    >>> hw.interface_in("127.0.0.0/8")
    ('lo', '127.0.0.1')
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from poprun_py.core.hardware import DISCOVERY_SCRIPT, Hardware, parse_discovery, with_hardware
from poprun_py.core.topology import (
    Topology,
    TopologyError,
    parse_lscpu,
    parse_sysfs_nodes,
    within,
)

SYSFS_NODES = "/sys/devices/system/node"


def parse_node_lines(text: str) -> Topology:
    """Parse ``nodeN <cpulist>`` lines (each NUMA node's ``cpulist`` in sysfs)."""
    cpulists = {}
    for line in text.splitlines():
        name, _, cpulist = line.strip().partition(" ")
        if name:
            cpulists[name] = cpulist
    return parse_sysfs_nodes(cpulists)


def read_sysfs(root: str | os.PathLike[str] = SYSFS_NODES) -> Topology:
    """Read ``node*/cpulist`` under ``root`` (a sysfs tree or a fixture copy of one)."""
    base = Path(root)
    cpulists = {
        entry.name: (entry / "cpulist").read_text()
        for entry in sorted(base.glob("node[0-9]*"))
        if (entry / "cpulist").is_file()
    }
    return parse_sysfs_nodes(cpulists)


def discover_local(root: str | os.PathLike[str] = SYSFS_NODES) -> Topology:
    """This machine's topology as this process may use it (:func:`_here`): sysfs first, then
    ``lscpu -p``, then one node with every CPU."""
    return _here(_read_nodes(root), root)


def _read_nodes(root: str | os.PathLike[str]) -> Topology:
    try:
        return read_sysfs(root)
    except (OSError, TopologyError):
        pass
    try:
        out = subprocess.run(
            ["lscpu", "-p=CPU,NODE"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
        return parse_lscpu(out)
    except (OSError, subprocess.SubprocessError, TopologyError):
        cpus = sorted(os.sched_getaffinity(0))
        return parse_sysfs_nodes({"node0": ",".join(map(str, cpus))})


def _here(topo: Topology, root: str | os.PathLike[str]) -> Topology:
    """``topo`` within this process's CPUs (``taskset``, a cpuset: a binding outside them fails)
    when it is this machine's; a fixture tree describes another machine and is left whole."""
    return within(topo, os.sched_getaffinity(0)) if str(root) == SYSFS_NODES else topo


def discovery_argv(sys_root: str = "", addresses: bool = False) -> list[str]:
    """The argv running :data:`DISCOVERY_SCRIPT` (``sys_root``: a fixture tree's root)."""
    return ["sh", "-c", DISCOVERY_SCRIPT, "sh", sys_root, "1" if addresses else "0"]


def discover_hardware(
    sys_root: str = "", addresses: bool = False, environ: dict[str, str] | None = None
) -> Hardware:
    """This machine's GPUs, RDMA NICs and interfaces (and their IPv4 addresses if asked)."""
    try:
        out = subprocess.run(
            discovery_argv(sys_root, addresses),
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env=environ,
        ).stdout
        return parse_discovery(out)
    except (OSError, subprocess.SubprocessError, TopologyError):
        return Hardware()


def discover_machine(sys_root: str = "", environ: dict[str, str] | None = None) -> Topology:
    """This machine's NUMA topology with its GPUs and RDMA NICs attached."""
    nodes = f"{sys_root}/sys/devices/system/node" if sys_root else SYSFS_NODES
    found = with_hardware(_read_nodes(nodes), discover_hardware(sys_root, environ=environ))
    return _here(found, nodes)  # after the devices: a GPU keeps its node
