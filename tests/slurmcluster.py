"""A real Slurm on one machine: munged, slurmctld, and one slurmd per test host.

Given test hosts from :mod:`poprun_py.providers.netns` (network namespaces with their own addresses
and hostnames), :func:`start_slurm` writes ``slurm.conf``/``cgroup.conf`` and a fresh munge key
into a state directory, starts ``munged`` and ``slurmctld`` in the root namespace (the controller
listens on the cluster bridge's gateway address) and one ``slurmd -N <host>`` inside each host's
network namespace and its own UTS namespace, then waits until ``sinfo`` shows every node idle.
Clients (``srun``, ``salloc``, ``squeue``...) find this Slurm through ``SLURM_CONF``
(:attr:`SlurmCluster.env`).

Choices that make Slurm start in a container without systemd, cgroups or a shared ``/etc``:

- ``SlurmUser=root``/``SlurmdUser=root``; ``ProctrackType=proctrack/pgid`` (no cgroups; a task
  and its children share a process group and are killed at once -- ``proctrack/linuxproc``
  finds them by parent links, so a child orphaned when its shell was killed escaped, and the
  job stayed "completing" until that child ended), ``TaskPlugin=task/affinity`` (CPU binding
  with ``sched_setaffinity``), ``select/cons_tres`` with ``CR_Core``, ``ReturnToService=2``,
  no accounting, ``KillWait=1`` so cancels are quick.
- One munged for all nodes: its socket is a file in the state directory (``AuthInfo=socket=``),
  reachable from every namespace because they share the filesystem.
- slurmd enters the host's namespace with ``nsenter --net`` rather than ``ip netns exec``: the
  latter remounts ``/sys``, hiding ``/sys/fs/cgroup``, and slurmd 22.05 refuses to start without it.
- The nodes share this machine's filesystem, except the directories given as ``private``: each
  slurmd (and so every task it starts) runs in a mount namespace of its own with a fresh tmpfs
  on each of them, as a real node has its own /tmp. The session's cluster makes poprun-py's
  default job directory root private, so the slurm backend is tested with a job directory the
  nodes do not share.
- Daemons run in the foreground (``-D``/``-F``) as children of the caller, who reaps them on stop.
- Each slurmd runs under a small subreaper (:data:`REAPER`, ``python -c``):
  a task's child orphaned when the task is killed must be reaped at once, because
  ``proctrack/pgid`` counts a step as running while any process of its group exists, zombies
  included, and a container's PID 1 may reap late or never (the step then hangs in
  "completing" and srun times out).

Everything is found again from the cluster name (pid files, ``cluster.json``, command lines
naming the state directory), so :func:`stop_slurm` also cleans up after a killed session.

Example (as root)::

    >>> from poprun_py.providers.netns import create_cluster
    >>> hosts = create_cluster("demo", 2, host_prefix="d")  # doctest: +SKIP
    >>> slurm = start_slurm("demo", hosts)  # doctest: +SKIP
    >>> import subprocess
    >>> subprocess.run(["srun", "-N2", "hostname"], env={**os.environ, **slurm.env},
    ...                capture_output=True, text=True).stdout  # doctest: +SKIP
    'd1\\nd2\\n'
    >>> stop_slurm("demo")  # doctest: +SKIP

From a shell (``.ci/run``): ``python -m tests.slurmcluster up NAME --hosts 2`` prints the
``SLURM_CONF`` line to export; ``python -m tests.slurmcluster down NAME`` removes everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from poprun_py.errors import ProvisionError
from poprun_py.process.commands import command_output, last_line
from poprun_py.process.proctree import alive, with_descendants
from poprun_py.providers.netns import TestCluster, TestHost, host_pids
from tests.ports import held_port

__all__ = [
    "DEFAULT_STATE_ROOT",
    "SlurmCluster",
    "SlurmNode",
    "can_start_slurm",
    "list_slurm",
    "load_slurm",
    "main",
    "node_config",
    "slurm_conf_text",
    "start_slurm",
    "stop_slurm",
]

DEFAULT_STATE_ROOT = Path("/var/lib/poprun-py/testslurm")
PARTITION = "poprun"
SLURMD_PORT = 6818
READY_TIMEOUT = 20.0
KILL_GRACE = 3.0
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "salloc", "sbatch", "squeue", "scancel", "sinfo", "nsenter", "unshare")
NODE_FIELDS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")

_NAME_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_SAFE_PATH_RE = re.compile(r"/[A-Za-z0-9_./+-]*")
_HOSTNAME_SCRIPT = 'hostname -- "$0" && exec "$@"'
REAPER = """\
# poprun-py testslurm: run sys.argv[1:] as a child subreaper; reap every orphan at once
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
child = subprocess.Popen(sys.argv[1:])
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda signum, frame: child.send_signal(signum))
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        sys.exit(1)
    if pid == child.pid:
        code = os.waitstatus_to_exitcode(status)
        sys.exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class SlurmNode:
    """One compute node: a test host running slurmd."""

    name: str
    address: str
    netns: str
    pid: int


@dataclass(frozen=True)
class SlurmCluster:
    """A running test Slurm; pass :attr:`env` to every Slurm client."""

    name: str
    state_dir: Path
    conf: Path
    controller: str
    port: int
    partition: str
    nodes: tuple[SlurmNode, ...]
    munged_pid: int
    slurmctld_pid: int

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs in its environment to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> tuple[str, ...]:
        """Node names in slurm.conf order (the order Slurm lists them in nodelists)."""
        return tuple(node.name for node in self.nodes)


# ---------------------------------------------------------------- pure parts


def node_config(slurmd_c: str) -> dict[str, str]:
    """The hardware fields of ``slurmd -C`` output (CPUs, sockets, cores, threads).

    >>> hw = node_config("NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 "
    ...                  "ThreadsPerCore=1 RealMemory=24105\\nUpTime=0-00:09:12")
    >>> hw["CPUs"], hw["CoresPerSocket"], hw["ThreadsPerCore"]
    ('2', '2', '1')
    """
    first = slurmd_c.strip().splitlines()[0] if slurmd_c.strip() else ""
    fields = dict(part.split("=", 1) for part in first.split() if "=" in part)
    missing = [key for key in NODE_FIELDS if key not in fields]
    if missing:
        raise ProvisionError(f"slurmd -C gave no {', '.join(missing)}: {first!r}")
    return {key: fields[key] for key in NODE_FIELDS}


def slurm_conf_text(
    name: str,
    state_dir: Path,
    controller: tuple[str, str, int],
    nodes: Sequence[tuple[str, str]],
    hardware: Mapping[str, str],
) -> str:
    """slurm.conf for cluster ``name``: controller (host, address, port), nodes (name, address).

    >>> text = slurm_conf_text("t", Path("/s"), ("vm", "198.18.0.1", 7000),
    ...                        [("n1", "198.18.0.11")], {"CPUs": "2"})
    >>> [line for line in text.splitlines() if line.startswith(("SlurmctldHost", "NodeName"))]
    ['SlurmctldHost=vm(198.18.0.1)', 'NodeName=n1 NodeAddr=198.18.0.11 CPUs=2 State=UNKNOWN']
    """
    host, address, port = controller
    settings = [
        ("ClusterName", name.replace("-", "_")[:40]),
        ("SlurmctldHost", f"{host}({address})"),
        ("SlurmctldPort", str(port)),
        ("SlurmdPort", str(SLURMD_PORT)),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("AuthInfo", f"socket={state_dir / 'munge' / 'munge.socket'}"),
        ("SlurmUser", "root"),
        ("SlurmdUser", "root"),
        ("StateSaveLocation", str(state_dir / "ctld")),
        ("SlurmdSpoolDir", str(state_dir / "spool" / "%n")),
        ("SlurmctldPidFile", str(state_dir / "slurmctld.pid")),
        ("SlurmdPidFile", str(state_dir / "spool" / "%n" / "slurmd.pid")),
        ("SlurmctldLogFile", str(state_dir / "log" / "slurmctld.log")),
        ("SlurmdLogFile", str(state_dir / "log" / "slurmd-%n.log")),
        ("ProctrackType", "proctrack/pgid"),  # no cgroups; a task and its children share a group
        ("TaskPlugin", "task/affinity"),  # --cpu-bind through sched_setaffinity
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core"),
        ("SchedulerType", "sched/builtin"),  # schedule at once, no backfill interval
        ("ReturnToService", "2"),  # a node that registers is usable, even after a restart
        ("MpiDefault", "none"),
        ("SwitchType", "switch/none"),
        ("JobAcctGatherType", "jobacct_gather/none"),
        ("AccountingStorageType", "accounting_storage/none"),
        ("JobCompType", "jobcomp/none"),
        ("MailProg", "/bin/true"),
        ("KillWait", "1"),  # seconds between SIGTERM and SIGKILL when a step is cancelled
        ("MinJobAge", "5"),
        ("InactiveLimit", "0"),
        ("SlurmdParameters", "config_overrides"),  # never drain a node over its hardware
        ("SlurmctldDebug", "info"),
        ("SlurmdDebug", "info"),
    ]
    hw = " ".join(f"{key}={value}" for key, value in hardware.items())
    lines = [f"# poprun-py testslurm {name}: generated"]
    lines += [f"{key}={value}" for key, value in settings]
    lines += [f"NodeName={n} NodeAddr={a} {hw} State=UNKNOWN" for n, a in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


CGROUP_CONF = """\
# poprun-py testslurm: cgroups are not used (proctrack/pgid, task/affinity), but slurmd
# initialises the cgroup plugin anyway; autodetect reads /sys/fs/cgroup and constrains nothing.
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""


# ---------------------------------------------------------------- checks


def can_start_slurm() -> str | None:
    """None if this process can start a test Slurm, else the reason it cannot."""
    if os.geteuid() != 0:
        return "a test Slurm needs root (slurmd in network namespaces, SlurmUser=root)"
    for tool in DAEMONS + CLIENTS:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"`{tool}` not found (apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None and Path("/usr/sbin", name).exists():
        found = str(Path("/usr/sbin", name))
    if found is None:
        raise ProvisionError(f"`{name}` not found (apt-get install slurmctld slurmd munge)")
    return found


# ---------------------------------------------------------------- start


def start_slurm(
    name: str,
    hosts: TestCluster,
    *,
    state_root: Path = DEFAULT_STATE_ROOT,
    timeout: float = READY_TIMEOUT,
    private: Sequence[str] = (),
) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd on every host of ``hosts``; wait until all are idle.

    ``private``: absolute directories each node gets an empty one of its own (a tmpfs in the
    slurmd's own mount namespace) instead of this machine's.

    On any failure everything started so far is stopped again and ProvisionError is raised.
    """
    if not _NAME_RE.fullmatch(name) or len(name) > 40:
        raise ProvisionError(f"bad test Slurm name {name!r}: use [a-z0-9-], at most 40 chars")
    state_dir = _safe_path(state_root) / name
    if state_dir.exists():
        raise ProvisionError(f"test Slurm {name!r} exists ({state_dir}); stop it first")
    deadline = time.monotonic() + timeout
    try:
        return _start(name, hosts, state_dir, deadline, tuple(private))
    except BaseException:
        stop_slurm(name, state_root=state_root)
        raise


def _safe_path(path: Path) -> Path:
    resolved = path.resolve()
    if not _SAFE_PATH_RE.fullmatch(str(resolved)):
        raise ProvisionError(f"state_root {str(resolved)!r} must match [A-Za-z0-9_./+-]")
    return resolved


def _start(
    name: str, hosts: TestCluster, state_dir: Path, deadline: float, private: tuple[str, ...]
) -> SlurmCluster:
    _make_dirs(state_dir, [h.name for h in hosts.hosts])
    conf = state_dir / "slurm.conf"
    with held_port(hosts.gateway) as port:  # until slurmctld listens on it (tests/ports.py)
        controller = (socket.gethostname().split(".")[0], hosts.gateway, port)
        nodes = [(h.name, h.address) for h in hosts.hosts]
        hardware = node_config(_output([_tool("slurmd"), "-C"]))
        conf.write_text(slurm_conf_text(name, state_dir, controller, nodes, hardware))
        (state_dir / "cgroup.conf").write_text(CGROUP_CONF)
        _write_record(state_dir, name, controller, hosts.hosts)
        munged = _start_munged(state_dir, deadline)
        ctld = _spawn([_tool("slurmctld"), "-D", "-i", "-f", str(conf)], state_dir, "slurmctld")
        _wait_port(controller[1], controller[2], state_dir / "log" / "slurmctld.log", deadline)
    slurmds = [_start_slurmd(host, conf, state_dir, private) for host in hosts.hosts]
    cluster = SlurmCluster(
        name=name,
        state_dir=state_dir,
        conf=conf,
        controller=controller[1],
        port=controller[2],
        partition=PARTITION,
        nodes=tuple(
            SlurmNode(h.name, h.address, h.netns, pid)
            for h, pid in zip(hosts.hosts, slurmds, strict=True)
        ),
        munged_pid=munged,
        slurmctld_pid=ctld,
    )
    _wait_idle(cluster, deadline)
    return cluster


def _make_dirs(state_dir: Path, hosts: Sequence[str]) -> None:
    state_dir.mkdir(mode=0o755, parents=True)
    for sub in ("munge", "ctld", "log", *(f"spool/{h}" for h in hosts)):
        (state_dir / sub).mkdir(mode=0o755, parents=True)
    os.chmod(state_dir, 0o755)


def _write_record(
    state_dir: Path, name: str, controller: tuple[str, str, int], hosts: Sequence[TestHost]
) -> None:
    record = {
        "name": name,
        "controller": list(controller),
        "nodes": [{"name": h.name, "address": h.address, "netns": h.netns} for h in hosts],
    }
    (state_dir / "cluster.json").write_text(json.dumps(record, indent=2) + "\n")


def _output(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run a tool (``env`` over ours); its stdout, or ProvisionError with its last line."""
    full_env = None if env is None else {**os.environ, **env}
    return command_output(argv, ProvisionError, timeout=15, env=full_env)


def _spawn(argv: Sequence[str], state_dir: Path, label: str) -> int:
    """Start a foreground daemon in its own session; its stdout/stderr go to log/<label>.out."""
    with open(state_dir / "log" / f"{label}.out", "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=state_dir,
        )
    (state_dir / f"{label}.ppid").write_text(f"{proc.pid}\n")
    return proc.pid


def _start_munged(state_dir: Path, deadline: float) -> int:
    munge = state_dir / "munge"
    key = munge / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secrets.token_bytes(1024))
    sock = munge / "munge.socket"
    argv = [
        _tool("munged"),
        "--foreground",
        f"--socket={sock}",
        f"--key-file={key}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--log-file={munge / 'munged.log'}",
        f"--seed-file={munge / 'munged.seed'}",
    ]
    pid = _spawn(argv, state_dir, "munged")
    while not sock.exists():
        _check_alive(pid, "munged", munge / "munged.log", deadline)
        time.sleep(0.01)
    return pid


def _start_slurmd(
    host: TestHost, conf: Path, state_dir: Path, private: tuple[str, ...] = ()
) -> int:
    """slurmd in the host's network namespace and a new UTS one; with ``private`` directories
    also a new mount namespace with a tmpfs on each (nothing else of the filesystem changes)."""
    for path in private:
        if not _SAFE_PATH_RE.fullmatch(path):
            raise ProvisionError(f"private directory {path!r} must match [A-Za-z0-9_./+-]")
        Path(path).mkdir(parents=True, exist_ok=True)
    mounts = "".join(f"mount -t tmpfs -o mode=0755 poprun-node {p} && " for p in private)
    argv = [
        _tool("nsenter"),
        f"--net=/run/netns/{host.netns}",
        "--",
        _tool("unshare"),
        "--uts",
        *(["--mount", "--propagation", "private"] if private else []),
        "--",
        "sh",
        "-c",
        mounts + _HOSTNAME_SCRIPT,
        host.name,
        sys.executable,
        "-I",
        "-S",
        "-c",
        REAPER,
        _tool("slurmd"),
        "-D",
        "-N",
        host.name,
        "-f",
        str(conf),
    ]
    return _spawn(argv, state_dir, f"slurmd-{host.name}")


def _check_alive(pid: int, what: str, log: Path, deadline: float) -> None:
    if not alive({pid}):
        raise ProvisionError(f"{what} exited at start: {last_line(log)}")
    if time.monotonic() > deadline:
        raise ProvisionError(f"{what} not ready in time: {last_line(log)}")


def _wait_port(address: str, port: int, log: Path, deadline: float) -> None:
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ProvisionError(f"slurmctld not listening: {last_line(log)}") from exc
            time.sleep(0.02)


def _wait_idle(cluster: SlurmCluster, deadline: float) -> None:
    states: dict[str, str] = {}
    while True:
        states = _node_states(cluster)
        if states and all(states.get(n) == "idle" for n in cluster.node_names):
            return
        for node in cluster.nodes:
            log = cluster.state_dir / "log" / f"slurmd-{node.name}.log"
            _check_alive(node.pid, f"slurmd on {node.name}", log, deadline)
        if time.monotonic() > deadline:
            raise ProvisionError(f"Slurm nodes not idle in time: {states}")
        time.sleep(0.05)


def _node_states(cluster: SlurmCluster) -> dict[str, str]:
    """Node name -> state (``idle``, ``unknown``...) from sinfo; {} if slurmctld is not up."""
    try:
        out = _output(["sinfo", "-h", "-N", "-o", "%N %T"], cluster.env)
    except ProvisionError:
        return {}
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


# ---------------------------------------------------------------- stop


def stop_slurm(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> None:
    """Cancel every job, stop every daemon and step of test Slurm ``name``, remove its state.

    Idempotent; works from the name alone, also after a start killed halfway.
    """
    if not _NAME_RE.fullmatch(name):
        raise ProvisionError(f"bad test Slurm name {name!r}")
    state_dir = _safe_path(state_root) / name
    conf = state_dir / "slurm.conf"
    if conf.exists():
        _cancel_all({"SLURM_CONF": str(conf)})
    pids = _daemon_pids(state_dir) | _step_pids(state_dir)
    _kill(pids)
    shutil.rmtree(state_dir, ignore_errors=True)
    left = alive(_daemon_pids(state_dir) | pids)
    if left:
        raise ProvisionError(f"test Slurm {name!r}: processes survive SIGKILL: {sorted(left)}")


def _cancel_all(env: Mapping[str, str]) -> None:
    """Cancel every job (best effort: slurmctld may already be gone)."""
    with contextlib.suppress(ProvisionError):
        jobs = _output(["squeue", "-h", "-o", "%i"], env).split()
        if jobs:
            _output(["scancel", "--signal=KILL", "--full", *jobs], env)
            _output(["scancel", *jobs], env)


def _daemon_pids(state_dir: Path) -> set[int]:
    """Processes whose command line names the state directory (munged, slurmctld, slurmd)."""
    needle = str(state_dir).encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
    return found


def _step_pids(state_dir: Path) -> set[int]:
    """slurmstepd processes and their tasks in the nodes' namespaces."""
    try:
        record = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return set()
    found: set[int] = set()
    for node in record.get("nodes", []):
        with contextlib.suppress(ProvisionError):
            found.update(p for p in host_pids(node["netns"]) if _is_step(p))
    return with_descendants(found)


def _is_step(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().startswith("slurmstepd")
    return False


def _kill(pids: set[int]) -> None:
    """SIGTERM, wait up to KILL_GRACE, SIGKILL; reap those that are our children."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive(pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + KILL_GRACE
        while alive(pids) and time.monotonic() < deadline:
            _reap(pids)
            time.sleep(0.01)
        _reap(pids)
        if not alive(pids):
            return


def _reap(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


# ---------------------------------------------------------------- reading back


def list_slurm(state_root: Path = DEFAULT_STATE_ROOT) -> list[str]:
    """Names of test Slurms with a state directory under ``state_root``."""
    return sorted(p.parent.name for p in state_root.glob("*/cluster.json"))


def load_slurm(name: str, *, state_root: Path = DEFAULT_STATE_ROOT) -> SlurmCluster:
    """The SlurmCluster of a running test Slurm, read back from its state directory."""
    state_dir = _safe_path(state_root) / name
    try:
        record = json.loads((state_dir / "cluster.json").read_text())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"no test Slurm {name!r} under {state_root}") from exc
    _host, address, port = record["controller"]
    return SlurmCluster(
        name=name,
        state_dir=state_dir,
        conf=state_dir / "slurm.conf",
        controller=address,
        port=int(port),
        partition=PARTITION,
        nodes=tuple(
            SlurmNode(n["name"], n["address"], n["netns"], _pid(state_dir, f"slurmd-{n['name']}"))
            for n in record["nodes"]
        ),
        munged_pid=_pid(state_dir, "munged"),
        slurmctld_pid=_pid(state_dir, "slurmctld"),
    )


def _pid(state_dir: Path, label: str) -> int:
    try:
        return int((state_dir / f"{label}.ppid").read_text().strip())
    except (OSError, ValueError):
        return 0


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    """``up NAME [--hosts N]`` / ``down NAME`` / ``status``: a test Slurm for CI scripts.

    ``up`` also creates the test hosts (cluster ``NAME``, hosts ``<prefix>1..N``) and prints
    ``SLURM_CONF=...``; ``down`` stops Slurm and destroys the hosts.
    """
    from poprun_py.providers.netns import create_cluster, destroy_cluster

    parser = argparse.ArgumentParser(prog="python -m tests.slurmcluster")
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("name", nargs="?", default="ci-slurm")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--host-prefix", default="slurm")
    args = parser.parse_args(argv)
    if args.action == "status":
        for name in list_slurm():
            print(name, load_slurm(name).conf)
        return 0
    if args.action == "down":
        stop_slurm(args.name)
        destroy_cluster(args.name)
        return 0
    reason = can_start_slurm()
    if reason is not None:
        print(f"cannot start a test Slurm: {reason}", file=sys.stderr)
        return 3
    started = time.monotonic()
    hosts = create_cluster(args.name, args.hosts, host_prefix=args.host_prefix)
    try:
        cluster = start_slurm(args.name, hosts)
    except BaseException:
        destroy_cluster(args.name)
        raise
    took = time.monotonic() - started
    print(f"SLURM_CONF={cluster.conf}")
    print(f"# nodes {','.join(cluster.node_names)} idle after {took:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
