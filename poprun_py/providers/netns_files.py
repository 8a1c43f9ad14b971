"""What a test host is, and the plain files around a test cluster: the client-side
``known_hosts`` and ``ssh_config`` that reach it, and its lines in ``/etc/hosts`` (tagged
``# poprun-py testhosts <cluster>``, so they are found and removed by name).

Example:

    >>> from pathlib import Path
    >>> host = TestHost("d1", "198.18.9.11", "poprun-demo-d1", sshd_pid=1)
    >>> cluster = TestCluster("demo", (host,), "198.18.9.0/24", "pr-demo", "198.18.9.1",
    ...                       Path("/s"), Path("/s/id"), Path("/s/kh"), Path("/s/cfg"))
    >>> print(ssh_config_text(cluster).splitlines()[2])
    Host d1 198.18.9.11
    >>> is_cluster_line("198.18.9.11 d1 # poprun-py testhosts demo", "demo")
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SSH_PORT = 22
ETC_HOSTS = Path("/etc/hosts")
HOSTS_MARKER = "poprun-py testhosts"


@dataclass(frozen=True)
class TestHost:
    """One test host: a network namespace with its own address, hostname and sshd."""

    __test__ = False  # not a pytest test class

    name: str
    address: str
    netns: str
    sshd_pid: int
    port: int = SSH_PORT
    data_address: str | None = None  # on the data network (netns_data), when it has one
    data_interface: str | None = None


@dataclass(frozen=True)
class TestCluster:
    """A set of test hosts on one bridge, with the client-side ssh files to reach them."""

    __test__ = False  # not a pytest test class

    name: str
    hosts: tuple[TestHost, ...]
    subnet: str
    bridge: str
    gateway: str
    state_dir: Path
    identity_file: Path
    known_hosts: Path
    ssh_config: Path
    data_subnet: str | None = None  # the data network's CIDR, when the cluster has one

    @property
    def host_names(self) -> tuple[str, ...]:
        """The host names in order, e.g. ``("h1", "h2")``."""
        return tuple(host.name for host in self.hosts)


def write_known_hosts(cluster: TestCluster) -> None:
    lines = []
    for host in cluster.hosts:
        pub = cluster.state_dir / "hosts" / host.name / "ssh_host_ed25519_key.pub"
        key_type, key = pub.read_text().split()[:2]
        lines.append(f"{host.name},{host.address} {key_type} {key}\n")
    cluster.known_hosts.write_text("".join(lines))


def ssh_config_text(cluster: TestCluster) -> str:
    parts = [f"# {HOSTS_MARKER} {cluster.name}: generated, use with ssh -F\n"]
    for host in cluster.hosts:
        parts.append(
            f"\nHost {host.name} {host.address}\n"
            f"    HostName {host.address}\n"
            f"    Port {host.port}\n"
            "    User root\n"
            f"    IdentityFile {cluster.identity_file}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {cluster.known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 5\n"
            "    LogLevel ERROR\n"
        )
    return "".join(parts)


# ---------------------------------------------------------------- /etc/hosts


def marker(cluster: str) -> str:
    return f"# {HOSTS_MARKER} {cluster}"


def is_cluster_line(line: str, cluster: str) -> bool:
    return "#" in line and line.split("#", 1)[1].strip() == marker(cluster)[2:]


def rewrite_etc_hosts(lines: list[str]) -> None:
    """Rewrite in place (no rename): /etc/hosts is often a bind mount in containers."""
    with open(ETC_HOSTS, "w") as handle:
        handle.write("".join(lines))
        handle.flush()
        os.fsync(handle.fileno())


def etc_hosts_lines() -> list[str]:
    """The lines of /etc/hosts (none when a bare root has no such file)."""
    try:
        return ETC_HOSTS.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return []


def add_hosts_lines(cluster: TestCluster) -> None:
    lines = etc_hosts_lines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    tag = marker(cluster.name)
    lines += [f"{host.address} {host.name} {tag}\n" for host in cluster.hosts]
    rewrite_etc_hosts(lines)


def remove_hosts_lines(cluster: str) -> None:
    lines = etc_hosts_lines()
    kept = [line for line in lines if not is_cluster_line(line, cluster)]
    if len(kept) != len(lines):
        rewrite_etc_hosts(kept)
