"""Real test hosts on one machine: network namespaces on a bridge, each with its own sshd.

As root, every host of a cluster is a network namespace ``poprun-<cluster>-<host>`` joined to the
root namespace by a veth pair whose root-side end sits on one Linux bridge. The bridge holds the
gateway address of the cluster's /24 inside 198.18.0.0/15 (reserved for test networks), so the
root namespace reaches every host and the hosts reach each other; there is no default route, so no
host can send traffic anywhere else. Each host runs its own sshd in its own UTS namespace (so
``hostname`` answers the host's name), with its own host key, accepting one fresh client key,
logging to ``<state dir>/hosts/<host>/sshd.log`` at level VERBOSE (one ``Starting session:`` line
per login session, which tests count).
``/etc/hosts`` gets one line per host, tagged ``# poprun-py testhosts <cluster>``, because Open MPI
resolves every host name itself (an unresolvable name stalls ~5 s on the DNS timeout).

Resource names are derived from the cluster name alone, so :func:`destroy_cluster` can remove a
cluster whose creation was killed halfway or whose state directory is gone.

This module is the public face (create, destroy, list, load); the parts are beside it: the names,
addresses and record that follow from a request (:mod:`~poprun_py.providers.netns_layout`), the
namespaces, veths, bridges and their processes (:mod:`~poprun_py.providers.netns_links`), one
host's key, namespace and sshd (:mod:`~poprun_py.providers.netns_sshd`), the client-side files and
``/etc/hosts`` lines (:mod:`~poprun_py.providers.netns_files`) and the optional data network
(:mod:`~poprun_py.providers.netns_data`).

Example (as root)::

    >>> from poprun_py.providers.netns import create_cluster, destroy_cluster
    >>> cluster = create_cluster("demo", 4, host_prefix="d")  # doctest: +SKIP
    >>> [h.name for h in cluster.hosts]  # doctest: +SKIP
    ['d1', 'd2', 'd3', 'd4']
    >>> import subprocess
    >>> subprocess.run(["ssh", "-F", str(cluster.ssh_config), "d2", "hostname"],
    ...                capture_output=True, text=True).stdout  # doctest: +SKIP
    'd2\\n'
    >>> destroy_cluster("demo")  # doctest: +SKIP

Sessions started by these sshds get the ``PATH`` of the process that created the cluster, so
``ssh d1 python`` finds the same interpreter as the caller (all hosts share one filesystem).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import TypeVar

from poprun_py.errors import ProvisionError
from poprun_py.providers import netns_data
from poprun_py.providers.netns_files import (
    TestCluster,
    TestHost,
    add_hosts_lines,
    remove_hosts_lines,
    ssh_config_text,
    write_known_hosts,
)
from poprun_py.providers.netns_layout import (
    CLUSTER_RE,
    Layout,
    bridge_name,
    host_dir,
    safe_path,
    split_netns,
    validate,
    write_record,
)
from poprun_py.providers.netns_links import (
    all_netns,
    check_free,
    cluster_links,
    cluster_netns,
    create_bridge,
    free_subnet_index,
    host_pids,
    kill_namespaces,
    probe_netns,
    try_run,
)
from poprun_py.providers.netns_sshd import PRIVSEP_DIR, SSHD, as_test_host, keygen, start_host

__all__ = [
    "DEFAULT_STATE_ROOT",
    "TestCluster",
    "TestHost",
    "can_create_hosts",
    "create_cluster",
    "destroy_cluster",
    "host_pids",
    "list_clusters",
    "load_cluster",
]

DEFAULT_STATE_ROOT = Path("/var/lib/poprun-py/testhosts")
TOOLS = ("ip", "unshare", "ssh", "ssh-keygen", "hostname")

_T = TypeVar("_T")
_R = TypeVar("_R")


def _parallel(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(x) for x in items]`` on threads; every call finishes before the first error raises."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(len(items), 16)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        wait(futures)
    return [future.result() for future in futures]


@contextlib.contextmanager
def _lock(state_root: Path) -> Iterator[None]:
    """Serialize subnet choice and /etc/hosts edits between processes."""
    state_root.mkdir(parents=True, exist_ok=True)
    with open(state_root / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def list_clusters(state_root: Path = DEFAULT_STATE_ROOT) -> list[str]:
    """Names of clusters with a state directory or any ``poprun-<cluster>-<host>`` namespace."""
    names = {p.parent.name for p in state_root.glob("*/cluster.json")}
    names.update(split[0] for ns in all_netns() if (split := split_netns(ns)))
    return sorted(names)


def can_create_hosts() -> str | None:
    """None if this process can create test hosts, else the reason it cannot."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, bridges, /etc/hosts)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"`{tool}` not found (run scripts/install-deps.sh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (apt-get install openssh-server)"
    return probe_netns()


# ---------------------------------------------------------------- creation


def create_cluster(
    name: str,
    num_hosts: int,
    *,
    state_root: Path = DEFAULT_STATE_ROOT,
    subnet_index: int | None = None,
    host_prefix: str = "h",
    data_network: bool = False,
) -> TestCluster:
    """Create ``num_hosts`` hosts named ``<host_prefix>1..N``, each running sshd; see the module.
    With ``data_network`` each host also gets a data interface (:mod:`netns_data`).

    Host names must be unique across clusters (they go into /etc/hosts). On any failure the
    partly created cluster is destroyed again and ProvisionError is raised.
    """
    validate(name, num_hosts, host_prefix)
    state_root = safe_path(state_root)
    names = tuple(f"{host_prefix}{i}" for i in range(1, num_hosts + 1))
    layout = _reserve(name, names, state_root, subnet_index, data_network)
    try:
        return _build(layout, state_root)
    except BaseException:
        with contextlib.suppress(ProvisionError):  # the original error says more
            destroy_cluster(name, state_root=state_root)
        raise


def _reserve(
    name: str, names: tuple[str, ...], state_root: Path, index: int | None, data: bool
) -> Layout:
    """Under the lock: pick the subnet, check nothing is taken, create state dir and bridge."""
    with _lock(state_root):
        index = free_subnet_index(state_root) if index is None else index
        if not 0 <= index <= 255:
            raise ProvisionError(f"subnet_index must be 0..255, not {index}")
        layout = Layout(name, index, names, state_root / name, data)
        check_free(layout, state_root)
        layout.state_dir.mkdir(parents=True)
        try:
            write_record(layout)
            create_bridge(layout)
        except BaseException:
            with contextlib.suppress(ProvisionError):
                _destroy_unlocked(name, state_root)
            raise
    return layout


def _build(layout: Layout, state_root: Path) -> TestCluster:
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    identity = layout.state_dir / "id_ed25519"
    keygen(identity, f"poprun-py testhosts {layout.name} client")
    authorized = layout.state_dir / "authorized_keys"
    authorized.write_text(identity.with_suffix(".pub").read_text())
    hosts = tuple(_parallel(lambda i: start_host(layout, i), range(len(layout.host_names))))
    cluster = _cluster(layout, hosts)
    write_known_hosts(cluster)
    cluster.ssh_config.write_text(ssh_config_text(cluster))
    with _lock(state_root):
        add_hosts_lines(cluster)
    return cluster


# ---------------------------------------------------------------- destruction


def destroy_cluster(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> None:
    """Remove every trace of cluster ``name``: processes, namespaces, links, /etc/hosts, state.

    Idempotent, and works from the name alone, also after a creation killed halfway.
    """
    if not CLUSTER_RE.fullmatch(name):
        raise ProvisionError(f"bad test cluster name {name!r}")
    state_root = state_root.resolve()
    with _lock(state_root):
        _destroy_unlocked(name, state_root)


def _destroy_unlocked(name: str, state_root: Path) -> None:
    namespaces = cluster_netns(name)
    kill_namespaces(namespaces)
    for link in cluster_links(name):
        if link != bridge_name(name):
            try_run(["ip", "link", "del", link])
    for netns in namespaces:
        try_run(["ip", "netns", "del", netns])
    try_run(["ip", "link", "del", bridge_name(name)])
    remove_hosts_lines(name)
    shutil.rmtree(state_root / name, ignore_errors=True)
    _check_gone(name, state_root)


def _check_gone(name: str, state_root: Path) -> None:
    left = cluster_netns(name) + cluster_links(name)
    if (state_root / name).exists():
        left.append(str(state_root / name))
    if left:
        raise ProvisionError(f"test cluster {name!r} not fully removed: {', '.join(left)}")


# ---------------------------------------------------------------- reading back


def load_cluster(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> TestCluster:
    """The TestCluster of an existing cluster, read back from its state directory."""
    state_dir = state_root.resolve() / name
    try:
        record = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"no test cluster {name!r} under {state_root}") from exc
    index, names = int(record["subnet_index"]), tuple(record["host_names"])
    layout = Layout(name, index, names, state_dir, bool(record.get("data_network")))
    hosts = tuple(_load_host(layout, i) for i in range(len(layout.host_names)))
    return _cluster(layout, hosts)


def _cluster(layout: Layout, hosts: tuple[TestHost, ...]) -> TestCluster:
    """The cluster of ``layout`` with ``hosts``; its client-side files in its state directory."""
    return TestCluster(
        name=layout.name,
        hosts=hosts,
        subnet=layout.subnet,
        bridge=layout.bridge,
        gateway=layout.gateway,
        state_dir=layout.state_dir,
        identity_file=layout.state_dir / "id_ed25519",
        known_hosts=layout.state_dir / "known_hosts",
        ssh_config=layout.state_dir / "ssh_config",
        data_subnet=netns_data.data_subnet(layout.subnet_index) if layout.data else None,
    )


def _load_host(layout: Layout, index: int) -> TestHost:
    host = layout.host_names[index]
    pid_file = host_dir(layout, host) / "sshd.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"test host {host!r} has no sshd pid file {pid_file}") from exc
    return as_test_host(layout, index, pid)
