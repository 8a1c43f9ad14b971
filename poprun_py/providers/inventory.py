"""The inventory ``up`` writes: a cluster spec (same YAML schema as clusters/*.yaml) naming the
provisioned hosts, so ``poprun-py launch --cluster INVENTORY.yaml`` uses them directly.

It keeps what the source spec says about jobs (``defaults``, ``env``, ``workdir``, and each
host's ``topology``/``slots`` when a node has the same name) and replaces ``hosts`` with the
nodes, plus ``ssh.known_hosts`` holding their recorded host keys. The ``provider`` and ``setup``
blocks are left out: the inventory describes machines that exist.

Example:

    >>> from poprun_py.providers.records import Node, ProvisionRecord
    >>> from poprun_py.core.spec import ClusterSpec
    >>> record = ProvisionRecord("demo", "local", nodes=(Node("pa1", "198.18.3.11", "root"),),
    ...                          known_hosts="/state/demo.known_hosts")
    >>> print(inventory_text(ClusterSpec("demo", ()), record), end="")
    # poprun-py inventory of cluster demo (provider local); written by `poprun-py up`
    name: demo
    hosts:
    - name: pa1
      address: 198.18.3.11
      user: root
      port: 22
    ssh:
      known_hosts: /state/demo.known_hosts
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from poprun_py.core.spec import ClusterSpec, Defaults, HostSpec
from poprun_py.core.topology import NumaNode, Topology, format_cpulist, format_memory
from poprun_py.providers.records import Node, ProvisionRecord


def inventory_dict(spec: ClusterSpec, record: ProvisionRecord) -> dict[str, Any]:
    """The inventory as plain data (see the module docstring)."""
    declared = {h.name: h for h in spec.hosts}
    data: dict[str, Any] = {"name": spec.name}
    if spec.workdir:
        data["workdir"] = spec.workdir
    if spec.env:
        data["env"] = dict(spec.env)
    defaults = _defaults(spec.defaults)
    if defaults:
        data["defaults"] = defaults
    data["hosts"] = [_host(node, declared.get(node.name)) for node in record.nodes]
    ssh = {"known_hosts": record.known_hosts} if record.known_hosts else {}
    if spec.ssh_config:
        ssh["ssh_config"] = spec.ssh_config
    if ssh:
        data["ssh"] = ssh
    return data


def inventory_text(spec: ClusterSpec, record: ProvisionRecord) -> str:
    """The inventory as YAML text, with a one-line header comment."""
    import yaml

    header = (
        f"# poprun-py inventory of cluster {spec.name} (provider {record.provider}); "
        "written by `poprun-py up`\n"
    )
    body = yaml.safe_dump(inventory_dict(spec, record), sort_keys=False, default_flow_style=False)
    return header + body


def _defaults(defaults: Defaults) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(defaults):
        value = getattr(defaults, f.name)
        if value is None or value == ():
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _host(node: Node, declared: HostSpec | None) -> dict[str, Any]:
    host: dict[str, Any] = {"name": node.name, "address": node.address}
    if node.user:
        host["user"] = node.user
    host["port"] = node.port
    if node.identity_file:
        host["identity_file"] = node.identity_file
    if declared is not None and declared.topology is not None:
        host["topology"] = _topology(declared.topology)
    if declared is not None and declared.slots is not None:
        host["slots"] = declared.slots
    return host


def _topology(topology: Topology) -> dict[str, Any]:
    return {"numa_nodes": [_numa_node(n) for n in topology.numa_nodes]}


def _numa_node(node: NumaNode) -> dict[str, Any]:
    """One NUMA node as the spec writes it (``memory:`` where it is known)."""
    written: dict[str, Any] = {
        "id": node.id,
        "cpus": format_cpulist(node.cpus),
        "devices": list(node.devices),
    }
    if node.memory is not None:
        written["memory"] = format_memory(node.memory)
    return written
