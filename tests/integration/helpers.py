"""Helpers shared by the integration tests: plans and jobs on simulated hosts, local runs, MPI
checks, drivers in processes of their own, and the checks that nothing is left behind.

Example::

    from tests.integration.helpers import left_behind, plan_for, run_local, unique_sleep

    def test_sleepers_are_stopped(tmp_path):
        marker = unique_sleep()
        script = f'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep {marker}'
        result, lines = run_local(plan_for(["sh", "-c", script], "h1", instances=2), tmp_path)
        assert result.exit_code == 3
        assert left_behind(f"sleep {marker}") == []
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from poprun_py.backends.local import LocalBackend
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.shard import InputFile, InputSet
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology, parse_cpulist
from poprun_py.process.proctree import alive
from poprun_py.providers.netns import TestCluster, TestHost, host_pids
from poprun_py.render import job as render
from tests import requirements

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PY = sys.executable
Lines = list[tuple[int, str, str]]


# ---------------------------------------------------------------- plans, jobs, local runs


def plan_for(
    program: list[str],
    hosts: str = "h1",
    instances: int = 1,
    inputs: InputSet | None = None,
    topology: Topology | None = None,
    **job: object,
) -> LaunchPlan:
    """A plan on simulated hosts (no NUMA binding unless a topology is given)."""
    cluster = cluster_from_hosts(parse_hosts(hosts), simulated=True, topology=topology)
    spec = JobSpec(tuple(program), replicas=instances, instances=instances, **job)  # type: ignore[arg-type]
    return make_plan(cluster, spec, inputs)


def make_job(
    plan: LaunchPlan, job_dir: Path, available: dict[str, Topology] | None = None
) -> render.RenderedJob:
    """The plan rendered for the local backend, as ``poprun-py launch`` renders it."""
    return render.render_job(plan, "local", job_dir=str(job_dir), available=available)


def run_local(
    plan: LaunchPlan,
    tmp_path: Path,
    available: dict[str, Topology] | None = None,
    **options: object,
) -> tuple[LaunchResult, Lines]:
    """Run ``plan`` with a capturing sink; return the result and every (index, stream, line)."""
    lines: Lines = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **options)  # type: ignore[arg-type]
    job = make_job(plan, tmp_path / "job", available)
    return LocalBackend().run(job, opts), lines


def example_inputs(data_dir: Path) -> InputSet:
    """The example training data (8 files of 64 rows, made in ``data_dir``) as an input set."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        from make_data import ensure_data
    finally:
        sys.path.remove(str(EXAMPLES))
    paths = ensure_data(data_dir, files=8, rows=64)
    return InputSet.of([InputFile(str(p), p.stat().st_size) for p in paths])


# ---------------------------------------------------------------- mpirun on this machine


def need_mpi() -> None:
    """Skip, naming what is missing and what brings it, when mpirun or mpi4py is missing."""
    requirements.require("mpirun", "mpi4py")


# More ranks than cores: ranks waiting in a collective yield the CPU instead of spinning.
YIELD = ("--mca", "mpi_yield_when_idle", "1")


def mpirun_job(plan: LaunchPlan, tmp_path: Path) -> render.RenderedJob:
    """``plan`` rendered for mpirun (as root, Open MPI needs --allow-run-as-root)."""
    root = os.geteuid() == 0
    return render.render_job(
        plan, "mpirun", job_dir=str(tmp_path / "job"), as_root=root, mpi_args=YIELD
    )


# ---------------------------------------------------------------- a launcher of its own


def start_driver(code: str, job: render.RenderedJob, tmp_path: Path) -> subprocess.Popen[str]:
    """Python ``code`` in a process of its own, given the path of ``job`` pickled."""
    (tmp_path / "job.pickle").write_bytes(pickle.dumps(job))
    return subprocess.Popen(
        [PY, "-c", code, str(tmp_path / "job.pickle")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def wait_ready(driver: subprocess.Popen[str], count: int, what: str) -> None:
    """Read the driver's output until ``count`` lines (one per ``what``) end in ``] ready``."""
    assert driver.stdout is not None
    ready = 0
    while ready < count:
        line = driver.stdout.readline()
        assert line, f"the driver ended before every {what} was ready"
        ready += line.endswith("] ready\n")


def poprun_cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m poprun_py ARGS`` in the repository, stdin closed, output captured."""
    return subprocess.run(
        [PY, "-m", "poprun_py", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        check=False,
    )


# ---------------------------------------------------------------- nothing left behind


def unique_sleep() -> str:
    """A sleep duration no other process uses: ``sleep <it>`` is its own pgrep marker."""
    return f"{40 + uuid.uuid4().int % 10**6 / 10**6:.6f}"


def unique_digits() -> str:
    """Nine digits no other session's marker has (a uuid's), for markers such as
    ``sleep 42<digits>.5`` that pgrep finds and a clean-up may SIGKILL."""
    return f"{uuid.uuid4().int % 10**9:09d}"


def left_behind(marker: str) -> list[str]:
    """Processes whose command line contains ``marker`` (there must be none after a run).
    Without pgrep the test skips, naming procps (mark it ``requires("pgrep")`` to skip first)."""
    requirements.require("pgrep")
    pgrep = ["pgrep", "-af", re.escape(marker)]
    out = subprocess.run(pgrep, capture_output=True, text=True, check=False)
    return out.stdout.splitlines()


def zombies() -> list[int]:
    """Zombie children of this test process."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(name))
    return found


def marked_on(host: TestHost, mark: str) -> list[str]:
    """``pgrep -af mark`` run inside the host's network namespace (pgrep itself left out)."""
    out = subprocess.run(
        ["ip", "netns", "exec", host.netns, "pgrep", "-af", mark],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [line for line in out.splitlines() if line.strip() and "pgrep" not in line]


def stray_pids(host: TestHost) -> list[int]:
    """Live processes in the host's namespace other than its sshd."""
    pids = host_pids(host.netns)
    live = alive(set(pids))
    return [p for p in pids if p != host.sshd_pid and p in live]


def sshd_log_count(cluster: TestCluster, text: str) -> dict[str, int]:
    """Per host: how often ``text`` occurs in its sshd's log so far."""
    counts = {}
    for host in cluster.hosts:
        log = cluster.state_dir / "hosts" / host.name / "sshd.log"
        counts[host.name] = log.read_text(errors="replace").count(text)
    return counts


def sessions_started(cluster: TestCluster) -> dict[str, int]:
    """How many login sessions each host's sshd has started so far (its log is VERBOSE)."""
    return sshd_log_count(cluster, "Starting session:")


def strays(cluster: TestCluster) -> dict[str, list[int]]:
    """Per host: live processes in its namespace other than its sshd (hosts with none left out)."""
    found = {host.name: stray_pids(host) for host in cluster.hosts}
    return {name: pids for name, pids in found.items() if pids}


def settled(cluster: TestCluster, seconds: float = 5.0) -> dict[str, list[int]]:
    """What is still running besides sshd on any host, once ``seconds`` have passed or nothing
    is (a closed session's sshd child and agent take a moment to exit)."""
    deadline = time.monotonic() + seconds
    while (left := strays(cluster)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


BINDING_PROBE = (
    "import json\n"
    "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
    "maps = [l.split() for l in open('/proc/self/numa_maps') if l.strip()]\n"
    "print(json.dumps({'cpus': status['Cpus_allowed_list'].strip(),\n"
    "                  'mems': status['Mems_allowed_list'].strip(),\n"
    "                  'policies': sorted({m[1] for m in maps})}))\n"
)
"""A Python program printing the CPUs it may run on and the memory policies of its mappings
(``bind:0`` under ``set_mempolicy(MPOL_BIND, {0})``, ``default`` when unbound), as the kernel
reports them in /proc/self/status and /proc/self/numa_maps."""

CPU1_TOPOLOGY = Topology((NumaNode(0, (1,)), NumaNode(1, (0,))))
"""A declared topology for plans that are rendered but not run (nothing about this machine)."""


NODES = Path("/sys/devices/system/node")


def machine_nodes() -> dict[int, tuple[int, ...]]:
    """This machine's NUMA nodes and their CPUs, from /sys (node 0 with every allowed CPU where
    the kernel shows none)."""
    nodes = {
        int(p.name[4:]): parse_cpulist((p / "cpulist").read_text())
        for p in NODES.glob("node[0-9]*")
    }
    return nodes or {0: tuple(sorted(os.sched_getaffinity(0)))}


def allowed_mems() -> str:
    """This process's ``Mems_allowed_list`` (its cpuset's memory nodes; a memory policy does
    not change it, so every instance reports it whatever its binding)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Mems_allowed_list in /proc/self/status")


@dataclass(frozen=True)
class BindingCase:
    """Two instances a host, laid out from this machine: the first bound to the CPU ``first``
    and its memory to ``node`` (a node it may allocate on: MPOL_BIND there), the second to the
    CPU ``second`` and to ``absent``, a node this machine does not have (so its memory is left
    unbound). ``first`` and ``second`` are CPUs this process may run on, different where it
    may run on two (the same one under ``taskset -c 0``); ``mems`` is what every instance
    reports as its ``Mems_allowed_list``; ``whole`` says ``first`` and ``node`` are all this
    machine has (one CPU, one node), where binding to them changes nothing and none is made."""

    first: int
    second: int
    node: int
    absent: int
    spare: int
    mems: str
    whole: bool

    @property
    def topology(self) -> Topology:
        """The declared topology giving a plan's local instance 0 and 1 these bindings. Each
        node also declares a CPU this machine lacks (``spare``, ``spare + 1``, which the
        render step drops), so no instance holds every declared CPU, even where ``first`` and
        ``second`` are one CPU (the plan binds no instance that holds every CPU)."""
        return Topology(
            (
                NumaNode(self.node, (self.first, self.spare)),
                NumaNode(self.absent, (self.second, self.spare + 1)),
            )
        )

    def probe(self, local_index: int) -> dict[str, object]:
        """What :data:`BINDING_PROBE` prints in local instance 0 or 1."""
        if local_index == 0:
            policy = "default" if self.whole else f"bind:{self.node}"
            return {"cpus": str(self.first), "mems": self.mems, "policies": [policy]}
        return {"cpus": str(self.second), "mems": self.mems, "policies": ["default"]}


def binding_case() -> BindingCase:
    """The :class:`BindingCase` of this machine: any CPU count, any NUMA nodes, any cpuset."""
    cpus = sorted(os.sched_getaffinity(0))
    mems = allowed_mems()
    nodes = machine_nodes()
    every = {c for node_cpus in nodes.values() for c in node_cpus} | set(cpus)
    node = parse_cpulist(mems)[0]
    return BindingCase(
        first=cpus[-1],
        second=cpus[0],
        node=node,
        absent=max(nodes) + 1,
        spare=max(every) + 1,
        mems=mems,
        # the product sees the CPUs and nodes this process may use (core.topology.within)
        whole=cpus == [cpus[-1]] and {n for n, c in nodes.items() if set(c) & set(cpus)} == {node},
    )


PYSPY_THREAD = r"^Thread \d+ \((?:idle|active)\)"
"""py-spy's header of a thread: sleeping (idle) or running (active) when dumped."""
