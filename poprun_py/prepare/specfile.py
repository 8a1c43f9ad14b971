"""Cluster specs in YAML: checked against a strict schema, every fault named by file, line and
key.

Unknown keys are errors, types are strict (``replicas: "4"`` is refused), duplicate keys are
refused, and host names may be node ranges. The result is a
:class:`poprun_py.core.spec.ClusterSpec`.

Example:

    >>> text = '''
    ... name: demo
    ... hosts:
    ...   - name: node[1-2]
    ...     address: 198.18.0.[11-12]
    ... '''
    >>> spec = parse_cluster(text, "demo.yaml")
    >>> [(h.name, h.address) for h in spec.hosts]
    [('node1', '198.18.0.11'), ('node2', '198.18.0.12')]
    >>> parse_cluster("name: x\\nhosts: []\\nreplica: 4\\n", "x.yaml")
    Traceback (most recent call last):
    ...
    poprun_py.errors.SpecError: x.yaml:3: replica: unknown key
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from poprun_py.core.hosts import check_unique, expand_names
from poprun_py.core.options import SPEC_DEFAULTS, Flag
from poprun_py.core.schema import (
    Bool,
    Either,
    Float,
    Int,
    ListOf,
    MapOf,
    Obj,
    OneOf,
    Record,
    SchemaFault,
    Spec,
    Str,
    check,
)
from poprun_py.core.spec import ClusterSpec, Defaults, HostSpec, ProviderSpec, check_env_name
from poprun_py.core.topology import NumaNode, Topology, parse_cpulist, parse_memory
from poprun_py.errors import SpecError, UsageError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built in: ~15x faster

_ABSENT: Any = object()  # the default of an optional object that should stay absent


@dataclass(frozen=True)
class _Memory(Spec):
    """A NUMA node's ``memory:``, in bytes: an integer, or ``96Gi``, ``512G`` (parse_memory)."""

    def check(self, value: Any, path: tuple[str | int, ...]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise SchemaFault(path, f"expected a memory size (96Gi, 512G or bytes), got {value!r}")
        try:
            return parse_memory(value)
        except UsageError as exc:
            raise SchemaFault(path, str(exc)) from None


_PORT = Int(ge=1, le=65535)
_NUMA = Obj(
    {
        "id": Int(ge=0),
        "cpus": Either((Str(), ListOf(Int(ge=0)))),
        "devices": ListOf(Int(ge=0), default=()),
        "memory": _Memory(),
    },
    required=("cpus",),
)
_TOPOLOGY = Obj(
    {"numa_nodes": ListOf(_NUMA, min_len=1), "device_env": Str(min_len=1)},
    required=("numa_nodes",),
)
_HOST = Obj(
    {
        "name": Str(min_len=1),
        "address": Str(min_len=1),
        "user": Str(min_len=1),
        "port": _PORT,
        "identity_file": Str(min_len=1),
        "topology": Either((Str(min_len=1), _TOPOLOGY)),
        "slots": Int(ge=1),
    },
    required=("name",),
)
_DURATION = Either((Float(), Str(min_len=1)))  # seconds, or 90s/45m/2h: see _defaults


def _default(f: Flag) -> Spec:
    """The schema of a ``defaults:`` key, from its catalog entry."""
    if f.duration:
        return _DURATION
    if f.choices:
        return OneOf(f.choices)
    if f.words:
        return ListOf(Str(), default=())
    if f.base is int:
        return Int(ge=f.least, le=f.most)
    return Bool() if f.base is bool else Str(min_len=1)


_DEFAULTS = Obj({key: _default(f) for key, f in SPEC_DEFAULTS.items()})
_SSH = Obj(
    {
        "user": Str(min_len=1),
        "port": _PORT,
        "identity_file": Str(min_len=1),
        "known_hosts": Str(min_len=1),
        "ssh_config": Str(min_len=1),
        "client": Str(min_len=1),
    }
)
_PROVIDER = Obj(
    {
        "kind": OneOf(("local", "static", "aws")),
        "num_nodes": Int(ge=1),
        "host_prefix": Str(min_len=1),
        "region": Str(min_len=1),
        "instance_type": Str(min_len=1),
        "image": Str(min_len=1),
        "disk_gb": Int(ge=1),
        "spot": Bool(default=False),
        "placement_group": Bool(default=False),
        "ssh_user": Str(min_len=1),
        "ssh_cidr": Str(min_len=1),
        "endpoint_url": Str(min_len=1),
    },
    required=("kind",),
    default=_ABSENT,
)
_CLUSTER = Obj(
    {
        "name": Str(min_len=1, pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]*"),
        "simulated": Bool(default=False),
        "workdir": Str(min_len=1),
        "env": MapOf(Str(), default={}),
        "defaults": _DEFAULTS,
        "ssh": _SSH,
        "topologies": MapOf(_TOPOLOGY, default={}),
        "hosts": ListOf(_HOST, default=()),
        "spares": ListOf(_HOST, default=()),
        "provider": _PROVIDER,
        "setup": Str(),
        "network": Str(min_len=1),
    },
    required=("name",),
)


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """Read and validate a cluster spec file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such cluster spec file", source) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read cluster spec: {exc}", source) from None
    return parse_cluster(text, source)


def parse_cluster(text: str, source: str = "<spec>") -> ClusterSpec:
    """Validate the YAML ``text`` of a cluster spec; ``source`` names it in errors."""
    data, lines = _load_yaml(text, source)
    where = _Where(source, lines)
    try:
        model = check(_CLUSTER, data)
    except SchemaFault as fault:
        raise where.fault(fault.message, fault.path) from None
    return _to_spec(model, where)


def _load_yaml(text: str, source: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    loader = _Loader(text)  # one pass: the node tree (for lines) is also what builds the data
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"malformed YAML: {problem}", source, line) from None
    finally:
        loader.dispose()
    if node is None:
        raise SpecError("the spec is empty", source)
    if not isinstance(data, dict):
        raise SpecError("the spec must be a mapping of keys to values", source, 1)
    lines: dict[tuple[Any, ...], int] = {}
    _index_lines(node, (), lines, source)
    return data, lines


def _index_lines(
    node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int], source: str
) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise SpecError("duplicate key", source, key_node.start_mark.line + 1, str(key))
            seen.add(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            _index_lines(value_node, (*path, key), lines, source)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, i), lines, source)


@dataclass(frozen=True)
class _Where:
    """Where one spec's keys stand (``lines``: a key path's line), to name them in errors."""

    source: str
    lines: dict[tuple[Any, ...], int]

    def fault(self, message: str, path: tuple[Any, ...]) -> SpecError:
        """A SpecError at ``path`` (its line: the nearest enclosing key's)."""
        line = next(
            (self.lines[path[:e]] for e in range(len(path), -1, -1) if path[:e] in self.lines), None
        )
        return SpecError(message, self.source, line, ".".join(str(p) for p in path))

    def guard(self, check: Any, path: tuple[Any, ...]) -> Any:
        """``check()``, its UsageError made a SpecError at ``path``."""
        try:
            return check()
        except SpecError:
            raise
        except UsageError as exc:
            raise self.fault(str(exc), path) from None


def _to_spec(model: Record, where: _Where) -> ClusterSpec:
    topologies = {
        name: _topology(t, where, ("topologies", name)) for name, t in model.topologies.items()
    }
    for name in model.env:
        where.guard(lambda n=name: check_env_name(n, "env name"), ("env", name))
    hosts: list[HostSpec] = []
    for i, host in enumerate(model.hosts):
        hosts.extend(_hosts(host, model.ssh, topologies, where, ("hosts", i)))
    spares: list[HostSpec] = []
    for i, host in enumerate(model.spares):
        spares.extend(_hosts(host, model.ssh, topologies, where, ("spares", i)))
    names = [h.name for h in hosts]
    where.guard(lambda: check_unique(names), ("hosts",))
    where.guard(lambda: check_unique(names + [h.name for h in spares]), ("spares",))
    return ClusterSpec(
        name=model.name,
        hosts=tuple(hosts),
        source=where.source,
        simulated=model.simulated,
        workdir=model.workdir,
        env=dict(model.env),
        defaults=Defaults(**_defaults(model.defaults, where)),
        spares=tuple(spares),
        provider=ProviderSpec(**model.provider) if model.provider is not _ABSENT else None,
        setup=model.setup,
        known_hosts=_expand(model.ssh.known_hosts),
        ssh_config=_expand(model.ssh.ssh_config),
        ssh_client=model.ssh.client,
        network=where.guard(lambda: _network(model.network), ("network",)),
    )


def _defaults(d: Record, where: _Where) -> dict[str, Any]:
    """``defaults:`` by key: a duration in seconds (a number, or text as on the command line:
    ``90s``, ``45m``, ``2h``; 0 only where its entry allows it), a list of words as a tuple."""
    found = {}
    for key, f in SPEC_DEFAULTS.items():
        value = getattr(d, key)
        if f.duration:
            value = where.guard(functools.partial(_seconds, value, f.least == 0), ("defaults", key))
        found[key] = tuple(value) if f.words else value
    return found


def _seconds(value: float | str | None, zero: bool) -> float | None:
    """``value`` in seconds; UsageError when it is not a duration in range (0 too: ``zero``)."""
    from poprun_py.core.duration import duration_seconds

    if value is None:
        return None
    seconds = duration_seconds(value, "") if isinstance(value, str) else float(value)
    if seconds < 0 or (seconds == 0 and not zero):
        raise UsageError(f"{value!r} must be {'0 or more' if zero else 'more than 0'}")
    return seconds


def _network(text: str | None) -> str | None:
    from poprun_py.core.hardware import parse_cidr

    return str(parse_cidr(text)) if text is not None else None


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


def _topology(model: Record, where: _Where, path: tuple[Any, ...]) -> Topology:
    nodes = [
        _numa(numa, i, where, (*path, "numa_nodes", i)) for i, numa in enumerate(model.numa_nodes)
    ]
    ids = [n.id for n in nodes]
    if len(set(ids)) != len(ids):
        raise where.fault("NUMA node ids repeat", path)
    devices = [d for n in nodes for d in n.devices]
    if len(set(devices)) != len(devices):
        raise where.fault("a device is attached to two NUMA nodes", path)
    if model.device_env is not None:
        check_device_env = functools.partial(check_env_name, model.device_env, "device_env")
        where.guard(check_device_env, (*path, "device_env"))
    _check_memory(nodes, where, path)
    return Topology(tuple(nodes), device_env=model.device_env)


def _numa(numa: Record, index: int, where: _Where, path: tuple[Any, ...]) -> NumaNode:
    cpus = (
        where.guard(lambda: parse_cpulist(numa.cpus), (*path, "cpus"))
        if isinstance(numa.cpus, str)
        else tuple(sorted(set(numa.cpus)))
    )
    node_id = numa.id if numa.id is not None else index
    return NumaNode(node_id, cpus, tuple(numa.devices), memory=numa.memory)


def _check_memory(nodes: list[NumaNode], where: _Where, path: tuple[Any, ...]) -> None:
    """``memory:`` on every NUMA node of a topology or on none (a host's is their sum), and
    not 0 on them all."""
    known = [n.memory is not None for n in nodes]
    if any(known) and not all(known):
        other = nodes[known.index(True)].id
        message = (
            f"no memory, but NUMA node {other} has: declare memory on every NUMA node of a "
            "topology or on none"
        )
        raise where.fault(message, (*path, "numa_nodes", known.index(False)))
    if all(known) and not sum(n.memory or 0 for n in nodes):
        message = "0 on every NUMA node: a host with memory has some"
        raise where.fault(message, (*path, "numa_nodes", 0, "memory"))


def _hosts(
    host: Record,
    ssh: Record,
    topologies: dict[str, Topology],
    where: _Where,
    path: tuple[Any, ...],
) -> list[HostSpec]:
    names = where.guard(lambda: expand_names(host.name), (*path, "name"))
    addresses: list[str | None] = [None] * len(names)
    if host.address is not None:
        at = (*path, "address")
        addrs = where.guard(lambda: expand_names(host.address or "", "address"), at)
        if len(addrs) != len(names):
            raise where.fault(f"{len(names)} host name(s) but {len(addrs)} address(es)", at)
        addresses = list(addrs)
    topo = _host_topology(host, topologies, where, path)
    return [
        HostSpec(
            name=name,
            address=addr,
            user=host.user or ssh.user,
            port=host.port or ssh.port,
            identity_file=_expand(host.identity_file or ssh.identity_file),
            topology=topo,
            slots=host.slots,
        )
        for name, addr in zip(names, addresses, strict=True)
    ]


def _host_topology(
    host: Record, topologies: dict[str, Topology], where: _Where, path: tuple[Any, ...]
) -> Topology | None:
    if host.topology is None:
        return None
    if isinstance(host.topology, str):
        if host.topology not in topologies:
            known = ", ".join(sorted(topologies)) or "none defined"
            message = f"unknown topology {host.topology!r} (known: {known})"
            raise where.fault(message, (*path, "topology"))
        return topologies[host.topology]
    return _topology(host.topology, where, (*path, "topology"))


def target_cluster(hosts: str | None, cluster: str | None) -> ClusterSpec:
    """The hosts named by ``--hosts`` (with what ``--cluster`` says of them) or ``--cluster``."""
    from poprun_py.core.hosts import parse_hosts, read_hostfile
    from poprun_py.core.spec import cluster_from_hosts

    base = load_cluster(cluster) if cluster else None
    if hosts:
        spec = cluster_from_hosts(parse_hosts(hosts, read=read_hostfile), base=base)
    elif base is not None:
        spec = base
    else:
        raise UsageError("name the hosts: --hosts h1,h2 | node[01-16] | @hostfile, or --cluster")
    if spec.simulated:
        raise UsageError(f"cluster {spec.name!r} is simulated: it has no hosts to reach")
    return spec
