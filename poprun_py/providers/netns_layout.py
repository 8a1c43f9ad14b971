"""A test cluster's layout (:mod:`poprun_py.providers.netns`): the names, addresses and state
files that follow from its request alone, before anything exists.

Every name derives from the cluster's name (the bridge ``pr-<tag>``, the veths ``pr-<tag>-N``,
the namespaces ``poprun-<cluster>-<host>``), so a cluster can be found and removed by its name
even when its state directory is gone. The cluster's record (``cluster.json`` in its state
directory) keeps what cannot be derived: the subnet index and the host names.

Example:

    >>> from pathlib import Path
    >>> layout = Layout("demo", 9, ("d1", "d2"), Path("/s/demo"))
    >>> layout.subnet, layout.gateway, layout.address(1)
    ('198.18.9.0/24', '198.18.9.1', '198.18.9.12')
    >>> netns_name("demo", "d2"), split_netns("poprun-demo-d2")
    ('poprun-demo-d2', ('demo', 'd2'))
    >>> bridge_name("demo") == layout.bridge, veth_name("demo", 1) == f"{layout.bridge}-1"
    (True, True)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from poprun_py.errors import ProvisionError

NETNS_PREFIX = "poprun-"
MAX_HOSTS = 240  # addresses .11 to .250 of the cluster's /24

CLUSTER_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]*")
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9_./+-]*")


@dataclass(frozen=True)
class Layout:
    """Everything about a cluster that follows from its request, before anything exists."""

    name: str
    subnet_index: int
    host_names: tuple[str, ...]
    state_dir: Path
    data: bool = False  # a second, data network (netns_data)

    @property
    def subnet(self) -> str:
        return f"198.18.{self.subnet_index}.0/24"

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet_index}.1"

    @property
    def bridge(self) -> str:
        return bridge_name(self.name)

    def address(self, index: int) -> str:
        return f"198.18.{self.subnet_index}.{11 + index}"


def _tag(cluster: str) -> str:
    return hashlib.sha1(cluster.encode(), usedforsecurity=False).hexdigest()[:8]


def bridge_name(cluster: str) -> str:
    return f"pr-{_tag(cluster)}"  # interface names have at most 15 characters


def veth_name(cluster: str, index: int) -> str:
    return f"{bridge_name(cluster)}-{index}"


def netns_name(cluster: str, host: str) -> str:
    return f"{NETNS_PREFIX}{cluster}-{host}"


def split_netns(netns: str) -> tuple[str, str] | None:
    """``poprun-<cluster>-<host>`` -> (cluster, host); host names contain no hyphen."""
    if not netns.startswith(NETNS_PREFIX) or "-" not in netns[len(NETNS_PREFIX) :]:
        return None
    cluster, host = netns[len(NETNS_PREFIX) :].rsplit("-", 1)
    return cluster, host


def host_dir(layout: Layout, host: str) -> Path:
    return layout.state_dir / "hosts" / host


def validate(name: str, num_hosts: int, host_prefix: str) -> None:
    if not CLUSTER_RE.fullmatch(name) or len(name) > 40:
        raise ProvisionError(f"bad test cluster name {name!r}: use [a-z0-9-], at most 40 chars")
    if not _PREFIX_RE.fullmatch(host_prefix) or len(host_prefix) > 20:
        raise ProvisionError(f"bad host prefix {host_prefix!r}: use a letter then [a-z0-9]")
    if not 1 <= num_hosts <= MAX_HOSTS:
        raise ProvisionError(f"a test cluster has 1 to {MAX_HOSTS} hosts, not {num_hosts}")


def safe_path(path: Path) -> Path:
    """An absolute path that ssh_config and sshd_config can hold without quoting."""
    resolved = path.resolve()
    if not _SAFE_PATH_RE.fullmatch(str(resolved)):
        raise ProvisionError(f"state_root {str(resolved)!r} must match [A-Za-z0-9_./+-]")
    return resolved


def write_record(layout: Layout) -> None:
    record = {
        "name": layout.name,
        "subnet_index": layout.subnet_index,
        "host_names": list(layout.host_names),
        "data_network": layout.data,
    }
    (layout.state_dir / "cluster.json").write_text(json.dumps(record, indent=2) + "\n")


def recorded_subnet_index(record_file: Path) -> int | None:
    try:
        return int(json.loads(record_file.read_text())["subnet_index"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a record being written or damaged: its bridge address still counts
