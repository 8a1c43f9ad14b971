"""What a provider created, as the state file keeps it: nodes, resources, and the record of one
cluster (saved as JSON after every step, so a killed ``up`` never loses track of anything).

Example:

    >>> node = Node("n1", "198.18.0.11", user="root", identity_file="/k")
    >>> record = ProvisionRecord("demo", "static", nodes=(node,))
    >>> ProvisionRecord.from_dict(record.to_dict()) == record
    True
    >>> record.host_specs()[0].target
    '198.18.0.11'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from poprun_py.core.spec import HostSpec, ProviderSpec

SSH_PORT = 22


@dataclass(frozen=True)
class Node:
    """One machine of a provisioned cluster, as reachable over SSH."""

    name: str  # host name used in the inventory and by ``launch``
    address: str  # what SSH connects to
    user: str | None = None
    port: int = SSH_PORT
    identity_file: str | None = None
    resource_id: str = ""  # the provider's id: instance id, network namespace, host name
    state: str = "unknown"  # the provider's word: running, pending, stopped, static...

    def host_spec(self) -> HostSpec:
        """The node as a :class:`HostSpec` for the transport and the inventory."""
        return HostSpec(
            name=self.name,
            address=self.address,
            user=self.user,
            port=self.port,
            identity_file=self.identity_file,
        )


@dataclass(frozen=True)
class Resource:
    """Something a provider created and ``down`` must remove (``kind`` is provider-specific)."""

    kind: str  # e.g. "instance", "security-group", "key-pair", "testhosts-cluster"
    id: str


@dataclass(frozen=True)
class ProvisionRecord:
    """What exists for one cluster; saved as the cluster's state file after every step."""

    cluster: str
    provider: str
    nodes: tuple[Node, ...] = ()
    resources: tuple[Resource, ...] = ()
    known_hosts: str | None = None  # host keys of the nodes, for strict checking later
    ssh_config: str | None = None  # an ssh_config file the spec named (static nodes)
    phase: str = "creating"  # creating -> created -> ready
    setup_sha256: str | None = None  # digest of the setup script last run on every node
    settings: Mapping[str, Any] = field(default_factory=dict)  # the ProviderSpec used

    def with_resource(self, kind: str, rid: str) -> ProvisionRecord:
        """This record with one more resource (no duplicates)."""
        res = Resource(kind, rid)
        if res in self.resources:
            return self
        return replace(self, resources=(*self.resources, res))

    def provider_spec(self) -> ProviderSpec:
        """The ProviderSpec this record was made from (unknown keys ignored)."""
        known = set(ProviderSpec.__dataclass_fields__)
        return ProviderSpec(**{k: v for k, v in self.settings.items() if k in known})

    def host_specs(self) -> tuple[HostSpec, ...]:
        """Every node as a HostSpec."""
        return tuple(node.host_spec() for node in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        data = asdict(self)
        data["settings"] = dict(self.settings)
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ProvisionRecord:
        """The record stored by :meth:`to_dict` (KeyError/TypeError when malformed)."""
        return ProvisionRecord(
            cluster=str(data["cluster"]),
            provider=str(data["provider"]),
            nodes=tuple(Node(**n) for n in data.get("nodes", ())),
            resources=tuple(Resource(**r) for r in data.get("resources", ())),
            known_hosts=data.get("known_hosts"),
            ssh_config=data.get("ssh_config"),
            phase=str(data.get("phase", "creating")),
            setup_sha256=data.get("setup_sha256"),
            settings=dict(data.get("settings", {})),
        )
