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
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from poprun_py.errors import ProvisionError
from poprun_py.process.commands import command_output, last_line
from poprun_py.process.proctree import alive
from poprun_py.providers import netns_data
from poprun_py.providers.netns_files import (
    HOSTS_MARKER,
    SSH_PORT,
    TestCluster,
    TestHost,
    add_hosts_lines,
    etc_hosts_lines,
    remove_hosts_lines,
    ssh_config_text,
    write_known_hosts,
)

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
SSHD = "/usr/sbin/sshd"
NETNS_DIR = Path("/run/netns")
PRIVSEP_DIR = Path("/run/sshd")
NETNS_PREFIX = "poprun-"
MAX_HOSTS = 240  # addresses .11 to .250 of the cluster's /24
READY_TIMEOUT = 10.0
KILL_GRACE = 2.0
TOOLS = ("ip", "unshare", "ssh", "ssh-keygen", "hostname")

_CLUSTER_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]*")
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9_./+-]*")
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True)
class _Layout:
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
        return _bridge_name(self.name)

    def address(self, index: int) -> str:
        return f"198.18.{self.subnet_index}.{11 + index}"


# ---------------------------------------------------------------- names and small helpers


def _tag(cluster: str) -> str:
    return hashlib.sha1(cluster.encode(), usedforsecurity=False).hexdigest()[:8]


def _bridge_name(cluster: str) -> str:
    return f"pr-{_tag(cluster)}"  # interface names have at most 15 characters


def _veth_name(cluster: str, index: int) -> str:
    return f"{_bridge_name(cluster)}-{index}"


def _netns_name(cluster: str, host: str) -> str:
    return f"{NETNS_PREFIX}{cluster}-{host}"


def _split_netns(netns: str) -> tuple[str, str] | None:
    """``poprun-<cluster>-<host>`` -> (cluster, host); host names contain no hyphen."""
    if not netns.startswith(NETNS_PREFIX) or "-" not in netns[len(NETNS_PREFIX) :]:
        return None
    cluster, host = netns[len(NETNS_PREFIX) :].rsplit("-", 1)
    return cluster, host


def _validate(name: str, num_hosts: int, host_prefix: str) -> None:
    if not _CLUSTER_RE.fullmatch(name) or len(name) > 40:
        raise ProvisionError(f"bad test cluster name {name!r}: use [a-z0-9-], at most 40 chars")
    if not _PREFIX_RE.fullmatch(host_prefix) or len(host_prefix) > 20:
        raise ProvisionError(f"bad host prefix {host_prefix!r}: use a letter then [a-z0-9]")
    if not 1 <= num_hosts <= MAX_HOSTS:
        raise ProvisionError(f"a test cluster has 1 to {MAX_HOSTS} hosts, not {num_hosts}")


def _run(argv: Sequence[str], timeout: float = 30.0) -> str:
    """Run ``argv``; return stdout, or raise ProvisionError with the last stderr line."""
    return command_output(argv, ProvisionError, timeout=timeout)


def _try(argv: Sequence[str]) -> bool:
    """Run ``argv`` for cleanup; a failure (usually: already gone) is not an error."""
    try:
        _run(argv)
    except ProvisionError:
        return False
    return True


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


# ---------------------------------------------------------------- discovery


def _all_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _cluster_netns(cluster: str) -> list[str]:
    return [ns for ns in _all_netns() if (_split_netns(ns) or ("", ""))[0] == cluster]


def _links() -> list[str]:
    """Interface names in the root namespace."""
    out = _run(["ip", "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _cluster_links(cluster: str) -> list[str]:
    names = (_bridge_name(cluster), netns_data.data_bridge_name(_bridge_name(cluster)))
    return [link for link in _links() for b in names if link == b or link.startswith(f"{b}-")]


def _recorded_subnet_index(record_file: Path) -> int | None:
    try:
        return int(json.loads(record_file.read_text())["subnet_index"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a record being written or damaged: its bridge address still counts


def _used_subnet_indexes(state_root: Path) -> set[int]:
    recorded = (_recorded_subnet_index(p) for p in state_root.glob("*/cluster.json"))
    used = {index for index in recorded if index is not None}
    out = _run(["ip", "-o", "-4", "addr", "show"])
    used.update(int(m) for m in re.findall(r"inet 198\.18\.(\d+)\.", out))
    return used


def _free_subnet_index(state_root: Path) -> int:
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


def _check_free(layout: _Layout, state_root: Path) -> None:
    name = layout.name
    if layout.state_dir.exists() or _cluster_netns(name) or _cluster_links(name):
        raise ProvisionError(f"test cluster {name!r} already exists; destroy it first")
    taken = {(_split_netns(ns) or ("", ""))[1] for ns in _all_netns()} | _hosts_file_names()
    clash = sorted(taken.intersection(layout.host_names))
    if clash:
        raise ProvisionError(f"host name {clash[0]!r} is already in use; pick another host_prefix")
    if layout.subnet_index in _used_subnet_indexes(state_root):
        raise ProvisionError(f"subnet {layout.subnet} is already in use")


def list_clusters(state_root: Path = DEFAULT_STATE_ROOT) -> list[str]:
    """Names of clusters with a state directory or any ``poprun-<cluster>-<host>`` namespace."""
    names = {p.parent.name for p in state_root.glob("*/cluster.json")}
    names.update(split[0] for ns in _all_netns() if (split := _split_netns(ns)))
    return sorted(names)


def host_pids(host_netns: str) -> list[int]:
    """Processes inside the namespace ``host_netns`` (``ip netns pids``); [] once it is gone."""
    if host_netns not in _all_netns():
        return []
    try:
        out = _run(["ip", "netns", "pids", host_netns])
    except ProvisionError:
        if host_netns not in _all_netns():
            return []
        raise
    return sorted(int(token) for token in out.split())


def can_create_hosts() -> str | None:
    """None if this process can create test hosts, else the reason it cannot."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces, bridges, /etc/hosts)"
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"`{tool}` not found (run scripts/install-deps.sh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (apt-get install openssh-server)"
    return _probe_netns()


def _probe_netns() -> str | None:
    """Try a namespace with a veth pair and a bridge inside it; leave nothing behind."""
    probe = f"{NETNS_PREFIX}probe{os.getpid()}-p"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "-n", probe, "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"])
        _run(["ip", "-n", probe, "link", "add", "pb0", "type", "bridge"])
    except ProvisionError as exc:
        return f"network namespaces not usable here: {exc}"
    finally:
        if probe in _all_netns():
            _try(["ip", "netns", "del", probe])
    return None


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
    _validate(name, num_hosts, host_prefix)
    state_root = _safe_path(state_root)
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
) -> _Layout:
    """Under the lock: pick the subnet, check nothing is taken, create state dir and bridge."""
    with _lock(state_root):
        index = _free_subnet_index(state_root) if index is None else index
        if not 0 <= index <= 255:
            raise ProvisionError(f"subnet_index must be 0..255, not {index}")
        layout = _Layout(name, index, names, state_root / name, data)
        _check_free(layout, state_root)
        layout.state_dir.mkdir(parents=True)
        try:
            _write_record(layout)
            _create_bridge(layout)
        except BaseException:
            with contextlib.suppress(ProvisionError):
                _destroy_unlocked(name, state_root)
            raise
    return layout


def _safe_path(path: Path) -> Path:
    """An absolute path that ssh_config and sshd_config can hold without quoting."""
    resolved = path.resolve()
    if not _SAFE_PATH_RE.fullmatch(str(resolved)):
        raise ProvisionError(f"state_root {str(resolved)!r} must match [A-Za-z0-9_./+-]")
    return resolved


def _write_record(layout: _Layout) -> None:
    record = {
        "name": layout.name,
        "subnet_index": layout.subnet_index,
        "host_names": list(layout.host_names),
        "data_network": layout.data,
    }
    (layout.state_dir / "cluster.json").write_text(json.dumps(record, indent=2) + "\n")


def _create_bridge(layout: _Layout) -> None:
    _run(["ip", "link", "add", layout.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{layout.gateway}/24", "dev", layout.bridge])
    _run(["ip", "link", "set", layout.bridge, "up"])
    if layout.data:
        netns_data.create_data_bridge(_run, layout.bridge, layout.subnet_index)


def _build(layout: _Layout, state_root: Path) -> TestCluster:
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    identity = layout.state_dir / "id_ed25519"
    _keygen(identity, f"poprun-py testhosts {layout.name} client")
    authorized = layout.state_dir / "authorized_keys"
    authorized.write_text(identity.with_suffix(".pub").read_text())
    hosts = tuple(_parallel(lambda i: _start_host(layout, i), range(len(layout.host_names))))
    cluster = TestCluster(
        name=layout.name,
        hosts=hosts,
        subnet=layout.subnet,
        bridge=layout.bridge,
        gateway=layout.gateway,
        state_dir=layout.state_dir,
        identity_file=identity,
        known_hosts=layout.state_dir / "known_hosts",
        ssh_config=layout.state_dir / "ssh_config",
        data_subnet=netns_data.data_subnet(layout.subnet_index) if layout.data else None,
    )
    write_known_hosts(cluster)
    cluster.ssh_config.write_text(ssh_config_text(cluster))
    with _lock(state_root):
        add_hosts_lines(cluster)
    return cluster


def _keygen(path: Path, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _host_dir(layout: _Layout, host: str) -> Path:
    return layout.state_dir / "hosts" / host


def _start_host(layout: _Layout, index: int) -> TestHost:
    host = layout.host_names[index]
    host_dir = _host_dir(layout, host)
    host_dir.mkdir(parents=True)
    _keygen(host_dir / "ssh_host_ed25519_key", f"poprun-py testhosts {host}")
    netns = _netns_name(layout.name, host)
    _create_netns(layout, index, netns)
    config = host_dir / "sshd_config"
    config.write_text(_sshd_config_text(layout, index))
    pid = _start_sshd(netns, host, config, host_dir)
    _wait_accepting(layout.address(index), host_dir / "sshd.log", time.monotonic() + READY_TIMEOUT)
    return _test_host(layout, index, pid)


def _test_host(layout: _Layout, index: int, pid: int) -> TestHost:
    data = layout.data
    return TestHost(
        name=layout.host_names[index],
        address=layout.address(index),
        netns=_netns_name(layout.name, layout.host_names[index]),
        sshd_pid=pid,
        data_address=netns_data.data_address(layout.subnet_index, index) if data else None,
        data_interface=netns_data.data_interface(index) if data else None,
    )


def _create_netns(layout: _Layout, index: int, netns: str) -> None:
    veth = _veth_name(layout.name, index + 1)
    _run(["ip", "netns", "add", netns])
    _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    _run(["ip", "link", "set", veth, "master", layout.bridge, "up"])
    inside = ["ip", "-n", netns]
    _run([*inside, "addr", "add", f"{layout.address(index)}/24", "dev", "eth0"])
    _run([*inside, "link", "set", "eth0", "up"])
    _run([*inside, "link", "set", "lo", "up"])
    if layout.data:
        netns_data.attach_data(_run, layout.bridge, layout.subnet_index, index, netns)


def _sshd_config_text(layout: _Layout, index: int) -> str:
    host_dir = _host_dir(layout, layout.host_names[index])
    path_env = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    lines = [
        f"# {HOSTS_MARKER} {layout.name}: sshd of {layout.host_names[index]}",
        f"ListenAddress {layout.address(index)}",
        f"Port {SSH_PORT}",
        f"HostKey {host_dir / 'ssh_host_ed25519_key'}",
        f"PidFile {host_dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {layout.state_dir / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel VERBOSE",  # logs every session it starts: tests count login sessions
        f'SetEnv "PATH={path_env}"' if '"' not in path_env else "",
        "Subsystem sftp internal-sftp",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _start_sshd(netns: str, host: str, config: Path, host_dir: Path) -> int:
    """Start a daemonizing sshd in ``netns`` and a fresh UTS namespace; return its pid."""
    script = 'hostname "$1" && exec "$2" -f "$3" -E "$4"'
    log = host_dir / "sshd.log"
    argv = ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c", script, "sh"]
    try:
        _run([*argv, host, SSHD, str(config), str(log)])
    except ProvisionError as exc:
        raise ProvisionError(f"sshd of test host {host} did not start: {last_line(log)}") from exc
    return _read_pid(host_dir / "sshd.pid", log, time.monotonic() + READY_TIMEOUT)


def _read_pid(pid_file: Path, log: Path, deadline: float) -> int:
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(pid_file.read_text().strip())
        if time.monotonic() > deadline:
            raise ProvisionError(f"sshd wrote no pid file {pid_file}: {last_line(log)}")
        time.sleep(0.01)


def _wait_accepting(address: str, log: Path, deadline: float) -> None:
    while True:
        try:
            with socket.create_connection((address, SSH_PORT), timeout=0.2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                detail = f"{exc}; sshd log: {last_line(log)}"
                raise ProvisionError(f"sshd on {address} not accepting: {detail}") from exc
            time.sleep(0.02)


# ---------------------------------------------------------------- destruction


def destroy_cluster(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> None:
    """Remove every trace of cluster ``name``: processes, namespaces, links, /etc/hosts, state.

    Idempotent, and works from the name alone, also after a creation killed halfway.
    """
    if not _CLUSTER_RE.fullmatch(name):
        raise ProvisionError(f"bad test cluster name {name!r}")
    state_root = state_root.resolve()
    with _lock(state_root):
        _destroy_unlocked(name, state_root)


def _destroy_unlocked(name: str, state_root: Path) -> None:
    namespaces = _cluster_netns(name)
    _kill_namespaces(namespaces)
    for link in _cluster_links(name):
        if link != _bridge_name(name):
            _try(["ip", "link", "del", link])
    for netns in namespaces:
        _try(["ip", "netns", "del", netns])
    _try(["ip", "link", "del", _bridge_name(name)])
    remove_hosts_lines(name)
    shutil.rmtree(state_root / name, ignore_errors=True)
    _check_gone(name, state_root)


def _check_gone(name: str, state_root: Path) -> None:
    left = _cluster_netns(name) + _cluster_links(name)
    if (state_root / name).exists():
        left.append(str(state_root / name))
    if left:
        raise ProvisionError(f"test cluster {name!r} not fully removed: {', '.join(left)}")


def _kill_namespaces(namespaces: Sequence[str]) -> None:
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


# ---------------------------------------------------------------- reading back


def load_cluster(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> TestCluster:
    """The TestCluster of an existing cluster, read back from its state directory."""
    state_dir = state_root.resolve() / name
    try:
        record = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"no test cluster {name!r} under {state_root}") from exc
    index, names = int(record["subnet_index"]), tuple(record["host_names"])
    layout = _Layout(name, index, names, state_dir, bool(record.get("data_network")))
    hosts = tuple(_load_host(layout, i) for i in range(len(layout.host_names)))
    return TestCluster(
        name=name,
        hosts=hosts,
        subnet=layout.subnet,
        bridge=layout.bridge,
        gateway=layout.gateway,
        state_dir=state_dir,
        identity_file=state_dir / "id_ed25519",
        known_hosts=state_dir / "known_hosts",
        ssh_config=state_dir / "ssh_config",
        data_subnet=netns_data.data_subnet(index) if layout.data else None,
    )


def _load_host(layout: _Layout, index: int) -> TestHost:
    host = layout.host_names[index]
    pid_file = _host_dir(layout, host) / "sshd.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"test host {host!r} has no sshd pid file {pid_file}") from exc
    return _test_host(layout, index, pid)
