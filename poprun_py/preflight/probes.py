"""Preflight: before anything starts, check every host in parallel and report every fault at once.

Per host, over the pool's one connection and in one round trip (a fixed ``sh`` script whose
inputs are passed as quoted arguments): the working directory exists; the interpreter and the
program are found; the program's script file exists; whether ``numactl`` exists where instances
are bound (a fault only for commands that use it: :func:`check_numactl` after rendering, since
poprun-py binds instances itself and needs numactl only where a template asks for it, e.g.
mpiexec's ranks); the NUMA topology (``/sys/devices/system/node/node*/cpulist`` with file names,
else ``lscpu -p=CPU,NODE``), parsed with :mod:`poprun_py.core.topology` and cut to the CPUs a
login there may use (its ``Cpus_allowed_list``: a cpuset, a Slurm job); the GPUs, RDMA NICs
and interfaces (:data:`poprun_py.core.hardware.DISCOVERY_SCRIPT`, shell builtins but for
``nvidia-smi`` where an NVIDIA GPU is, and ``ip`` with ``--network``), attached to that
topology; with ``--network CIDR``, a host with no address in CIDR is a fault. On the launching
machine, in parallel with those: how long each host name takes to resolve (a name that resolves
slowly or not at all stalls mpirun about 5 s per host). Unreachable hosts, refused keys and
host-key mismatches come from :meth:`ConnectionPool.connect_all` and join the same list.
Instances that run on this machine (the local backend, mpirun/mpiexec with every host here) get
the same checks of the working directory and the program from :func:`check_here`, in Python.

Warnings (a slow or unresolvable host name, a topology that could not be discovered) are in
:attr:`PreflightReport.warnings` and are also logged, one record each, to the
``poprun_py.preflight.probes`` logger as soon as preflight ends, before anything starts: the CLI
prints them on stderr as ``poprun-py: warning: ...``.

Example::

    with ConnectionPool(list(plan.cluster.hosts), SshSettings()) as pool:
        report = preflight(pool, plan)          # PreflightError(faults) if any host is unfit
        report.topologies["h1"]                 # Topology discovered on h1

    >>> checks = Checks(workdir="/srv/job", commands=("python3",), files=("train.py",))
    >>> checks_argv(checks, numactl=True)[-10:]
    ['/srv/job', '1', 'python3', '1', 'train.py', '1', '1', '1', '0', '--']
"""

from __future__ import annotations

import ipaddress
import logging
import os
import posixpath
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from poprun_py.core.hardware import DISCOVERY_SCRIPT, Hardware, parse_discovery, with_hardware
from poprun_py.core.topology import (
    Topology,
    TopologyError,
    parse_cpulist,
    parse_lscpu,
    parse_sysfs_nodes,
    within,
)
from poprun_py.errors import Fault, PreflightError
from poprun_py.ssh.hostresult import HostResult
from poprun_py.ssh.openssh import over_openssh

if TYPE_CHECKING:
    from rich.table import Table

    from poprun_py.core.plan import LaunchPlan
    from poprun_py.core.spec import HostSpec
    from poprun_py.render.job import RenderedJob
    from poprun_py.ssh.connection import Connection, RemoteResult
    from poprun_py.ssh.settings import SshSettings

T = TypeVar("T")
log = logging.getLogger(__name__)


class Runner(Protocol):
    """What runs a host's checks: an open Connection, or the agent on it."""

    @property
    def name(self) -> str:
        """The host's name."""

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> RemoteResult:
        """Run ``argv`` on the host and return its outcome."""


class RunnerPool(Protocol):
    """Hosts to check in parallel: a :class:`ConnectionPool`, or an ``AgentPool`` on one (the
    ssh and mpirun backends' launches, whose agents then serve the whole launch)."""

    @property
    def hosts(self) -> tuple[HostSpec, ...]:
        """The hosts, in order."""

    @property
    def settings(self) -> SshSettings:
        """Their SSH settings."""

    def each(
        self,
        fn: Callable[[Runner], T],
        hosts: Iterable[str] | None = None,
        *,
        connect: bool = False,
    ) -> dict[str, HostResult[T]]:
        """``fn`` on every host in parallel; every outcome (connection faults included)."""


SLOW_RESOLVE = 0.5
_PYTHONS = ("python", "python3", "pypy3")

# $1 workdir ("" = none), then a count and that many commands, a count and that many files,
# then 1/0 for numactl, 1/0 for topology, 1/0 for hardware, 1/0 for addresses. One line per
# answer; topology text comes next, then the hardware's after a line "@hardware".
HARDWARE_MARK = "@hardware"
CHECK_SCRIPT = (
    "poprun_discover() {"
    + DISCOVERY_SCRIPT
    + "}\n"
    + r"""
wd=$1; shift
if [ -n "$wd" ]; then if cd -- "$wd" 2>/dev/null; then echo "wd 1"; else echo "wd 0"; fi; fi
for kind in cmd file; do
  n=$1; shift; i=0
  while [ "$i" -lt "$n" ]; do
    if [ "$kind" = file ]; then [ -e "$1" ] && ok=1 || ok=0
    else case $1 in  # dash's command -v takes any existing path for an executable
      */*) [ -f "$1" ] && [ -x "$1" ] && ok=1 || ok=0 ;;
      *) command -v "$1" >/dev/null 2>&1 && ok=1 || ok=0 ;;
    esac; fi
    echo "$kind $i $ok"; i=$((i + 1)); shift
  done
done
if [ "$1" = 1 ]; then command -v numactl >/dev/null 2>&1 && echo "numactl 1" || echo "numactl 0"; fi
if [ "$2" = 1 ]; then
  if [ -r /proc/self/status ]; then  # the CPUs a login may use (taskset, cpuset, Slurm job)
    while read -r k v; do [ "$k" = Cpus_allowed_list: ] && echo "allowed $v"
    done < /proc/self/status
  fi
  for f in /sys/devices/system/node/node*/cpulist; do break; done
  if [ -r "$f" ]; then
    echo "topology sysfs"; grep -H '' /sys/devices/system/node/node*/cpulist
  elif command -v lscpu >/dev/null 2>&1; then echo "topology lscpu"; lscpu -p=CPU,NODE
  else echo "topology none"; fi
fi
if [ "$3" = 1 ]; then echo "@hardware"; poprun_discover "" "$4"; fi
"""
)


@dataclass(frozen=True)
class Checks:
    """What to check on each host. Relative ``files`` are looked up in ``workdir``."""

    workdir: str | None = None
    commands: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    numactl_hosts: frozenset[str] = frozenset()
    topology: bool = True
    hardware: bool = True
    network: str | None = None  # CIDR every host must hold an address in
    # the topology cut to the CPUs the login may use; Slurm's preflight step (its task sees
    # the allocation's CPUs) compares those with the whole node itself
    within_allowed: bool = True
    # time each host name's resolution on this machine: a launcher that resolves them itself
    # (mpirun, mpiexec) stalls on a slow one; the ssh transports go by ssh_config's HostName
    names: bool = True


@dataclass(frozen=True)
class HostReport:
    """What preflight learnt about one host."""

    host: str
    topology: Topology | None = None
    topology_source: str = ""
    resolve_seconds: float | None = None
    check_seconds: float = 0.0
    numactl: bool | None = None  # whether numactl is on PATH (None: not looked for)
    hardware: Hardware | None = None


@dataclass(frozen=True)
class PreflightReport:
    """Every host's findings, warnings (slow names, undiscoverable topology) and faults."""

    hosts: tuple[HostReport, ...]
    faults: tuple[Fault, ...] = ()
    warnings: tuple[str, ...] = ()
    duration: float = 0.0

    @property
    def topologies(self) -> dict[str, Topology | None]:
        """Host name → discovered topology (None where it could not be discovered)."""
        return {h.host: h.topology for h in self.hosts}

    def interfaces(self, network: str | None) -> dict[str, tuple[str, str]]:
        """Host name -> (interface, address) in ``network``, for the hosts that have one."""
        found = {}
        for h in self.hosts:
            iface = h.hardware.interface_in(network) if network and h.hardware else None
            if iface is not None:
                found[h.host] = iface
        return found


def checks_for_plan(plan: LaunchPlan) -> Checks:
    """The checks a plan needs: workdir, interpreter, program, numactl where instances bind."""
    argv = plan.program
    commands: list[str] = [argv[0]] if argv else []
    files: list[str] = []
    base = posixpath.basename(argv[0]) if argv else ""
    if base.startswith(_PYTHONS) or (argv and argv[0] == plan.cluster.defaults.python):
        script = _script_arg(argv[1:])
        files += [script] if script else []
    bound = frozenset(i.host for i in plan.instances) if plan.numa_aware else frozenset()
    unique = tuple(dict.fromkeys(commands))
    return Checks(plan.workdir, unique, tuple(files), bound, network=plan.network)


def check_here(plan: LaunchPlan, environ: Mapping[str, str] | None = None) -> list[Fault]:
    """The faults :data:`CHECK_SCRIPT` would find on this machine (workdir, interpreter,
    program, script file), found without a shell: for instances that run here (the local
    backend, mpirun/mpiexec on this machine only). ``PATH`` is the instances' (``--env PATH``,
    the spec's ``env``, else ``environ``'s, as the local spawner looks programs up)."""
    checks = replace(checks_for_plan(plan), topology=False, hardware=False, network=None)
    env = {**(os.environ if environ is None else environ), **{v.name: v.value for v in plan.env}}
    path = env.get("PATH", os.defpath)
    wd = checks.workdir
    lines = [f"wd {int(os.path.isdir(wd))}"] if wd else []
    here = os.path.join(os.getcwd(), wd) if wd else os.getcwd()
    for i, name in enumerate(checks.commands):
        if "/" in name:
            full = os.path.join(here, name)
            ok = os.path.isfile(full) and os.access(full, os.X_OK)
        else:
            ok = shutil.which(name, path=path) is not None
        lines.append(f"cmd {i} {int(ok)}")
    for i, name in enumerate(checks.files):
        lines.append(f"file {i} {int(os.path.exists(os.path.join(here, name)))}")
    return parse_check_output("localhost", checks, "\n".join(lines) + "\n")[0]


def _script_arg(args: Sequence[str]) -> str | None:
    """The script a Python interpreter would run, or None for ``-m``/``-c``/stdin."""
    for arg in args:
        if arg in ("-m", "-c", "-") or arg.startswith(("-m", "-c")):
            return None
        if not arg.startswith("-"):
            return arg
    return None


def checks_argv(checks: Checks, numactl: bool) -> list[str]:
    """The remote argv running :data:`CHECK_SCRIPT` with this host's inputs."""
    return [
        "sh",
        "-c",
        CHECK_SCRIPT,
        "sh",
        checks.workdir or "",
        str(len(checks.commands)),
        *checks.commands,
        str(len(checks.files)),
        *checks.files,
        "1" if numactl else "0",
        "1" if checks.topology else "0",
        "1" if checks.hardware else "0",
        "1" if checks.network else "0",
        "--",
    ]


def parse_check_output(host: str, checks: Checks, text: str) -> tuple[list[Fault], HostReport]:
    """Turn the script's answers into faults and a host report (topology parsed)."""
    head, _, topo_text = text.partition("topology ")
    missing = {tuple(line.split()[:2]) for line in head.splitlines() if line.endswith(" 0")}
    faults: list[Fault] = []
    no_wd = ("wd", "0") in missing
    if no_wd:
        faults.append(Fault(host, "workdir", f"working directory {checks.workdir} is missing"))
    where = f" in {checks.workdir}" if checks.workdir else ""
    for i, name in enumerate(checks.commands):
        if ("cmd", str(i)) in missing and not (no_wd and _relative_path(name)):
            what = "not an executable file" if "/" in name else "not found on PATH"
            faults.append(Fault(host, "program", f"{name}: {what}{where if '/' in name else ''}"))
    for i, name in enumerate(checks.files):
        if ("file", str(i)) in missing and not (no_wd and _relative_path(name)):
            faults.append(Fault(host, "program", f"{name}: no such file{where}"))
    numactl = None
    if host in checks.numactl_hosts:
        numactl = ("numactl", "0") not in missing
    topo_text, _, hw_text = topo_text.partition(f"{HARDWARE_MARK}\n")
    if not topo_text and not hw_text:
        head, _, hw_text = head.partition(f"{HARDWARE_MARK}\n")
    source, _, body = topo_text.partition("\n")
    source = source.strip()
    topo = _parse_topology(source, body)
    hardware = _parse_hardware(hw_text) if checks.hardware else None
    if topo is not None and hardware is not None:
        topo = with_hardware(topo, hardware)
    if topo is not None and checks.within_allowed:
        topo = within(topo, _allowed(head))
    if checks.network and hardware is not None and hardware.interface_in(checks.network) is None:
        has = hardware.describe_addresses()
        faults.append(Fault(host, "network", f"no address in {checks.network} (has: {has})"))
    report = HostReport(host, topo, source, numactl=numactl, hardware=hardware)
    return faults, report


def _allowed(head: str) -> tuple[int, ...]:
    """The CPUs the host's ``allowed`` line names (none when it has none, or a bad one)."""
    for line in head.splitlines():
        if line.startswith("allowed "):
            try:
                return parse_cpulist(line.removeprefix("allowed "))
            except TopologyError:
                return ()
    return ()


def _parse_hardware(text: str) -> Hardware | None:
    try:
        return parse_discovery(text)
    except TopologyError:
        return None


# what a missing numactl is called, on a host (check_numactl) and on this machine (the local
# session's check)
NUMACTL_MISSING = (
    "numactl not found (the rendered command binds with numactl): install numactl "
    "(Debian: numactl) or --no-numa-aware"
)


def check_numactl(job: RenderedJob, report: PreflightReport) -> None:
    """PreflightError (exit 3, nothing started) naming every host where a rendered command
    runs numactl (a template's numactl prefix) and preflight found no numactl."""
    missing = {h.host for h in report.hosts if h.numactl is False}
    if not missing:
        return
    launcher = any("numactl" in a for a in job.launcher) or any(
        "numactl" in text for text in job.files.values()
    )
    needs = {
        c.host
        for c in job.instances
        if posixpath.basename(c.argv[0]) == "numactl" or (launcher and c.binding is not None)
    }
    hosts = [h.host for h in report.hosts if h.host in needs & missing]
    if hosts:
        raise PreflightError([Fault(h, "numactl", NUMACTL_MISSING) for h in hosts])


def _relative_path(name: str) -> bool:
    return not name.startswith("/") and ("/" in name or name.endswith(".py"))


def _parse_topology(source: str, body: str) -> Topology | None:
    try:
        if source == "sysfs":
            lists = {}
            for line in body.splitlines():
                path, _, cpulist = line.partition(":")
                lists[posixpath.basename(posixpath.dirname(path))] = cpulist
            return parse_sysfs_nodes(lists)
        if source == "lscpu":
            return parse_lscpu(body)
    except TopologyError:
        return None
    return None


def resolve_time(name: str) -> tuple[float, str | None]:
    """Seconds ``getaddrinfo(name)`` takes here, and the error if it fails."""
    started = time.monotonic()
    try:
        socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return time.monotonic() - started, str(exc)
    return time.monotonic() - started, None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _resolve_all(names: Sequence[str]) -> dict[str, Future[tuple[float, str | None]]]:
    """Start timing every name's resolution in the background; the futures hold the results."""
    todo = [n for n in names if not _is_address(n)]
    if not todo:
        return {}
    pool = ThreadPoolExecutor(min(len(todo), 32), thread_name_prefix="poprun-dns")
    futures = {name: pool.submit(resolve_time, name) for name in todo}
    pool.shutdown(wait=False)  # the threads finish on their own; results are read later
    return futures


def _resolve_warning(name: str, seconds: float, error: str | None) -> str | None:
    if error:
        return (
            f"{name} does not resolve on this machine ({error}); mpirun resolves every host "
            "name itself: give the hosts' addresses in the cluster spec"
        )
    if seconds > SLOW_RESOLVE:
        return (
            f"{name} took {seconds:.1f} s to resolve; a slow name stalls mpirun about 5 s per "
            "host: give the hosts' addresses in the cluster spec (or add them to /etc/hosts)"
        )
    return None


def preflight(
    pool: RunnerPool,
    plan: LaunchPlan | None = None,
    checks: Checks | None = None,
    *,
    raise_on_fault: bool = True,
) -> PreflightReport:
    """Check every host of ``pool`` (connecting those not yet open) and return the report.

    ``checks`` defaults to :func:`checks_for_plan` of ``plan`` (or topology only). Raises
    PreflightError with every host's faults, connection faults first, unless
    ``raise_on_fault`` is false.
    """
    started = time.monotonic()
    checks = checks or (checks_for_plan(plan) if plan is not None else Checks())
    resolving = _resolve_all([h.name for h in pool.hosts]) if checks.names else {}

    def check(conn: Runner) -> tuple[list[Fault], HostReport]:
        t0 = time.monotonic()
        argv = checks_argv(checks, conn.name in checks.numactl_hosts)
        result = conn.run(argv, timeout=max(10.0, pool.settings.connect_timeout))
        faults, report = parse_check_output(conn.name, checks, result.stdout)
        if result.exit_code != 0:
            detail = result.stderr.strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
            faults.append(Fault(conn.name, "checks", f"check script failed: {detail[0]}"))
        return faults, replace(report, check_seconds=time.monotonic() - t0)

    outcomes = pool.each(check, connect=True)  # connection faults come back as outcomes
    hosts, faults, warnings = _collect(pool, checks, outcomes, resolving)
    connections: Mapping[str, Connection] = getattr(pool, "connections", {})  # fakes: none
    if over := over_openssh([connections[h.name] for h in pool.hosts if h.name in connections]):
        warnings += (over,)
    report = PreflightReport(hosts, faults, warnings, time.monotonic() - started)
    for warning in warnings:
        log.warning("%s", warning)
    if faults and raise_on_fault:
        raise PreflightError(faults)
    return report


def _collect(
    pool: RunnerPool,
    checks: Checks,
    outcomes: Mapping[str, HostResult[tuple[list[Fault], HostReport]]],
    resolving: Mapping[str, Future[tuple[float, str | None]]],
) -> tuple[tuple[HostReport, ...], tuple[Fault, ...], tuple[str, ...]]:
    """Every host's report, the faults (host order) and the warnings."""
    from poprun_py.ssh.errors import TransportError

    faults: list[Fault] = []
    warnings: list[str] = []
    hosts: list[HostReport] = []
    for host in pool.hosts:
        name = host.name
        seconds, error = resolving[name].result() if name in resolving else (None, None)
        outcome = outcomes.get(name)
        report = HostReport(name)
        match outcome:
            case HostResult(fault=TransportError() as lost):
                faults.append(lost.fault())
            case HostResult(fault=BaseException() as fault):
                faults.append(_fault(name, fault))
            case HostResult(returned=(list() as found, HostReport() as report)):
                faults += found
                if checks.topology and report.topology is None:
                    warnings.append(f"{name}: NUMA topology could not be discovered")
        note = _resolve_warning(name, seconds, error) if seconds is not None else None
        if note and (outcome is None or outcome.ok) and host.address is None:
            warnings.append(note)
        hosts.append(replace(report, resolve_seconds=seconds))
    return tuple(hosts), tuple(faults), tuple(warnings)


def _fault(host: str, exc: BaseException) -> Fault:
    return Fault(host, "ssh", f"{type(exc).__name__}: {exc}")


def format_faults(faults: Sequence[Fault]) -> Table:
    """A rich table of faults: host, check, problem; for the CLI to print."""
    from rich.table import Table

    table = Table(title=f"preflight failed: {len(faults)} fault(s), nothing was started")
    table.add_column("host", style="bold", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("problem", overflow="fold")
    for fault in faults:
        table.add_row(fault.host, fault.check, fault.detail)
    return table
