"""Local discovery: this machine's NUMA topology, read from /sys (or ``lscpu``) and parsed by the
pure parsers in :mod:`poprun_py.core.topology`. Remote discovery over ssh reuses the same parsers.

Example:

    >>> topo = discover_local()
    >>> len(topo.cpus) >= 1
    True
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from poprun_py.core.topology import Topology, TopologyError, parse_lscpu, parse_sysfs_nodes

SYSFS_NODES = "/sys/devices/system/node"

REMOTE_TOPOLOGY_SCRIPT = (
    "for f in /sys/devices/system/node/node*/cpulist; do "
    'd=${f%/cpulist}; printf "%s %s\\n" "${d##*/}" "$(cat "$f")"; done'
)
"""A fixed shell snippet that prints ``nodeN <cpulist>`` lines; see :func:`parse_node_lines`."""


def parse_node_lines(text: str) -> Topology:
    """Parse ``nodeN <cpulist>`` lines (the output of :data:`REMOTE_TOPOLOGY_SCRIPT`)."""
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
    """This machine's topology: sysfs first, then ``lscpu -p``, then one node with every CPU."""
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
