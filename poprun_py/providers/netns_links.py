"""The network plumbing of test clusters (:mod:`poprun_py.providers.netns`): the commands that
create, find and remove their namespaces, veth pairs and bridges, and the processes inside.

A cluster's bridge carries the gateway of its /24 in 198.18.0.0/15; each host's namespace has
``eth0`` (the far end of a veth pair on that bridge) and ``lo`` up, and no default route. The
/24s in use are those of the recorded clusters and of every address of the root namespace in
198.18.x.x. Removal is by name (:mod:`poprun_py.providers.netns_layout`): TERM, then KILL,
every process of the cluster's namespaces, then the links and the namespaces.

Example (reading runs unprivileged):

    >>> host_pids("poprun-no-such-cluster-h1")
    []
    >>> cluster_netns("no-such-cluster")
    []
    >>> try_run(["false"])
    False
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from poprun_py.errors import ProvisionError
from poprun_py.process.commands import command_output
from poprun_py.process.proctree import alive
from poprun_py.providers import netns_data
from poprun_py.providers.netns_files import etc_hosts_lines
from poprun_py.providers.netns_layout import (
    NETNS_PREFIX,
    Layout,
    bridge_name,
    recorded_subnet_index,
    split_netns,
    veth_name,
)

NETNS_DIR = Path("/run/netns")
KILL_GRACE = 2.0


def run(argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run ``argv``; return stdout, or raise ProvisionError with the last stderr line."""
    return command_output(argv, ProvisionError, timeout=timeout)


def try_run(argv: Sequence[str]) -> bool:
    """Run ``argv`` for cleanup; a failure (usually: already gone) is not an error."""
    try:
        run(argv)
    except ProvisionError:
        return False
    return True


# ---------------------------------------------------------------- discovery


def all_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def cluster_netns(cluster: str) -> list[str]:
    return [ns for ns in all_netns() if (split_netns(ns) or ("", ""))[0] == cluster]


def _links() -> list[str]:
    """Interface names in the root namespace."""
    out = run(["ip", "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def cluster_links(cluster: str) -> list[str]:
    names = (bridge_name(cluster), netns_data.data_bridge_name(bridge_name(cluster)))
    return [link for link in _links() for b in names if link == b or link.startswith(f"{b}-")]


def _used_subnet_indexes(state_root: Path) -> set[int]:
    recorded = (recorded_subnet_index(p) for p in state_root.glob("*/cluster.json"))
    used = {index for index in recorded if index is not None}
    out = run(["ip", "-o", "-4", "addr", "show"])
    used.update(int(m) for m in re.findall(r"inet 198\.18\.(\d+)\.", out))
    return used


def free_subnet_index(state_root: Path) -> int:
    used = _used_subnet_indexes(state_root)
    free = [index for index in range(256) if index not in used]
    if not free:
        raise ProvisionError("no free /24 left in 198.18.0.0/24-198.18.255.0/24")
    return free[0]


def _hosts_file_names() -> set[str]:
    names: set[str] = set()
    for line in etc_hosts_lines():
        names.update(line.split("#", 1)[0].split()[1:])
    return names


def check_free(layout: Layout, state_root: Path) -> None:
    name = layout.name
    if layout.state_dir.exists() or cluster_netns(name) or cluster_links(name):
        raise ProvisionError(f"test cluster {name!r} already exists; destroy it first")
    taken = {(split_netns(ns) or ("", ""))[1] for ns in all_netns()} | _hosts_file_names()
    clash = sorted(taken.intersection(layout.host_names))
    if clash:
        raise ProvisionError(f"host name {clash[0]!r} is already in use; pick another host_prefix")
    if layout.subnet_index in _used_subnet_indexes(state_root):
        raise ProvisionError(f"subnet {layout.subnet} is already in use")


def host_pids(host_netns: str) -> list[int]:
    """Processes inside the namespace ``host_netns`` (``ip netns pids``); [] once it is gone."""
    if host_netns not in all_netns():
        return []
    try:
        out = run(["ip", "netns", "pids", host_netns])
    except ProvisionError:
        if host_netns not in all_netns():
            return []
        raise
    return sorted(int(token) for token in out.split())


def probe_netns() -> str | None:
    """Try a namespace with a veth pair and a bridge inside it; leave nothing behind."""
    probe = f"{NETNS_PREFIX}probe{os.getpid()}-p"
    try:
        run(["ip", "netns", "add", probe])
        run(["ip", "-n", probe, "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"])
        run(["ip", "-n", probe, "link", "add", "pb0", "type", "bridge"])
    except ProvisionError as exc:
        return f"network namespaces not usable here: {exc}"
    finally:
        if probe in all_netns():
            try_run(["ip", "netns", "del", probe])
    return None


# ---------------------------------------------------------------- creation


def create_bridge(layout: Layout) -> None:
    run(["ip", "link", "add", layout.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{layout.gateway}/24", "dev", layout.bridge])
    run(["ip", "link", "set", layout.bridge, "up"])
    if layout.data:
        netns_data.create_data_bridge(run, layout.bridge, layout.subnet_index)


def create_netns(layout: Layout, index: int, netns: str) -> None:
    veth = veth_name(layout.name, index + 1)
    run(["ip", "netns", "add", netns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", veth, "master", layout.bridge, "up"])
    inside = ["ip", "-n", netns]
    run([*inside, "addr", "add", f"{layout.address(index)}/24", "dev", "eth0"])
    run([*inside, "link", "set", "eth0", "up"])
    run([*inside, "link", "set", "lo", "up"])
    if layout.data:
        netns_data.attach_data(run, layout.bridge, layout.subnet_index, index, netns)


# ---------------------------------------------------------------- removal


def kill_namespaces(namespaces: Sequence[str]) -> None:
    """SIGTERM every process in ``namespaces``, SIGKILL what is left after KILL_GRACE."""
    for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
        pids = _live_pids(namespaces)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        _wait_dead(pids, KILL_GRACE)
    if _live_pids(namespaces):
        raise ProvisionError(f"processes survive SIGKILL in {', '.join(namespaces)}")


def _live_pids(namespaces: Sequence[str]) -> set[int]:
    pids = {pid for ns in namespaces for pid in host_pids(ns)} - {os.getpid()}
    return alive(pids)  # zombies count as dead: our PID 1 may never reap daemons


def _wait_dead(pids: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
