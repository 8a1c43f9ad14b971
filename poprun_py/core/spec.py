"""What the user asked for: the cluster (hosts, topology, defaults) and the job (program, sizes).

These are plain frozen dataclasses with no I/O; ``specfile.load_cluster`` builds a
:class:`ClusterSpec` from YAML, and the CLI builds one from ``--hosts``.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    >>> [h.name for h in cluster.hosts], cluster.simulated
    (['h1', 'h2'], False)
    >>> EnvVar.parse("LR=0.1")
    EnvVar(name='LR', value='0.1', secret=False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from poprun_py.core.hosts import HostEntry
from poprun_py.core.topology import Topology
from poprun_py.errors import UsageError

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class HostSpec:
    """One host: how to reach it and, when declared, its topology."""

    name: str
    address: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    topology: Topology | None = None
    slots: int | None = None

    @property
    def target(self) -> str:
        """The address to connect to: ``address`` when given, else ``name``."""
        return self.address or self.name


@dataclass(frozen=True)
class ProviderSpec:
    """How ``up``/``down`` obtain the hosts (``local``, ``static`` or ``aws``)."""

    kind: str = "static"
    num_nodes: int | None = None
    host_prefix: str | None = None
    region: str | None = None
    instance_type: str | None = None
    image: str | None = None
    disk_gb: int | None = None
    spot: bool = False
    placement_group: bool = False
    ssh_user: str | None = None
    ssh_cidr: str | None = None
    endpoint_url: str | None = None


@dataclass(frozen=True)
class Defaults:
    """Launcher defaults a cluster spec may set; command-line flags override them."""

    backend: str | None = None
    replicas: int | None = None
    instances: int | None = None
    devices_per_replica: int | None = None
    numa_aware: bool | None = None
    group_size: int | None = None
    mpi_args: tuple[str, ...] = ()
    grace_period: float | None = None
    master_port: int | None = None
    python: str | None = None
    connect_timeout: float | None = None
    max_restarts: int | None = None
    restart_delay: float | None = None
    timeout: float | None = None  # seconds
    hang_timeout: float | None = None
    host_timeout: float | None = None  # seconds of silence after which a host is lost
    min_progress: int | None = None  # steps an attempt must advance to be restarted
    progress_file: str | None = None  # a checkpoint whose mtime says the attempt advanced
    forward_signals: str | None = None  # USR1,USR2,HUP: passed on to every instance
    strict_shards: bool | None = None  # refuse uneven input shards (--strict-shards)


@dataclass(frozen=True)
class ClusterSpec:
    """The hosts and everything shared by jobs on them."""

    name: str
    hosts: tuple[HostSpec, ...]
    source: str = ""
    simulated: bool = False
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)
    provider: ProviderSpec | None = None
    setup: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    ssh_client: str | None = None  # ssh.client: auto | paramiko | openssh
    network: str | None = None  # CIDR of the network instances talk on (spec ``network:``)
    spares: tuple[HostSpec, ...] = ()  # held back, put in place of a lost host on a restart

    def host(self, name: str) -> HostSpec:
        """The host called ``name`` (KeyError if absent)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    @property
    def all_local(self) -> bool:
        """True when every host runs on this machine (simulated or loopback names)."""
        return self.simulated or all(
            h.name in LOCAL_NAMES and (h.address is None or h.address in LOCAL_NAMES)
            for h in self.hosts
        )


@dataclass(frozen=True)
class EnvVar:
    """A ``--env`` setting. ``secret`` values came from the caller's environment by name only
    (``--env NAME``) and are never printed."""

    name: str
    value: str
    secret: bool = False

    @staticmethod
    def parse(text: str, environ: Mapping[str, str] | None = None) -> EnvVar:
        """Parse ``KEY=VALUE``, or ``KEY`` (value taken from ``environ``, marked secret)."""
        name, sep, value = text.partition("=")
        if not _ENV_NAME.match(name):
            raise UsageError(f"bad --env {text!r}: {name!r} is not a valid variable name")
        if sep:
            return EnvVar(name, value)
        if environ is None or name not in environ:
            raise UsageError(f"bad --env {text!r}: {name} is not set in this environment")
        return EnvVar(name, environ[name], secret=True)


def check_env_name(name: str, context: str) -> str:
    """Return ``name`` if it is a valid environment variable name."""
    if not _ENV_NAME.match(name):
        raise UsageError(f"bad {context} {name!r}: not a valid environment variable name")
    return name


@dataclass(frozen=True)
class JobSpec:
    """What to run and at what size. ``instances=None`` means the documented default."""

    program: tuple[str, ...]
    replicas: int = 1
    instances: int | None = None
    devices_per_replica: int = 1
    numa_aware: bool = True
    group_size: int | None = None
    env: tuple[EnvVar, ...] = ()
    workdir: str | None = None
    eval_pad: int | None = None
    master_port: int = 29500
    network: str | None = None
    device_env: str | None = None
    nic_affinity: bool = False


def cluster_from_hosts(
    entries: Sequence[HostEntry],
    *,
    name: str = "adhoc",
    simulated: bool = False,
    topology: Topology | None = None,
    base: ClusterSpec | None = None,
) -> ClusterSpec:
    """A cluster from ``--hosts`` entries; keeps what ``base`` (a spec file) says of each host
    and of the cluster (ssh settings, env, defaults, workdir), only the host list changes."""
    known = {h.name: h for h in base.hosts} if base else {}
    hosts = tuple(_merge_host(known.get(e.name), e, topology) for e in entries)
    if base is None:
        return ClusterSpec(name=name, hosts=hosts, simulated=simulated)
    # everything else the spec says (ssh settings, env, defaults...) applies to these hosts too
    return replace(base, hosts=hosts, simulated=base.simulated or simulated)


def _merge_host(known: HostSpec | None, entry: HostEntry, topology: Topology | None) -> HostSpec:
    if known is None:
        return HostSpec(name=entry.name, topology=topology, slots=entry.slots)
    return HostSpec(
        name=known.name,
        address=known.address,
        user=known.user,
        port=known.port,
        identity_file=known.identity_file,
        topology=known.topology or topology,
        slots=entry.slots or known.slots,
    )


@dataclass(frozen=True)
class SshOptions:
    """The SSH flags every remote command takes (``launch``, ``exec``, ``sync``...), as given."""

    known_hosts: str | None = None
    ssh_config: str | None = None
    identity: str | None = None
    user: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float | None = None
    ssh_client: str | None = None
    fanout: int | None = None
