"""``--backend mpirun`` across real test hosts, one rank per host.

The rendered command names hosts by address in its hostfile (a name would cost a DNS timeout per
host) and selects the hosts' subnet for Open MPI's TCP traffic. Every host gets one connection
and one agent session on it, which stages the shard files and then starts Open MPI's daemon for
the rsh shim (``plm_rsh_agent``): one login session per host for the whole launch. With the
user's own agent (here Open MPI's ssh, given the cluster's ssh config through
``plm_rsh_args``) the files are still staged by the agents.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.agent.client import AgentPool, stage_job
from poprun_py.backends.mpirun import MpirunBackend
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.spec import ClusterSpec, HostSpec, JobSpec
from poprun_py.core.topology import NumaNode, Topology
from poprun_py.hostside.rsh_shim import agent_command, mpirun_args
from poprun_py.prepare.discover import discover_local
from poprun_py.providers.netns import TestCluster, host_pids
from poprun_py.render.job import RenderedJob, render_job
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from tests.hostfixtures import MakeCluster
from tests.integration.helpers import (
    BINDING_PROBE,
    binding_case,
    machine_nodes,
    marked_on,
    need_mpi,
    sessions_started,
    stray_pids,
)

pytestmark = [pytest.mark.hosts, pytest.mark.mpi]

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
Lines = list[tuple[int, str, str]]


@pytest.fixture(autouse=True)
def _need_mpi() -> None:
    need_mpi()


def plan_on(cluster: TestCluster, program: list[str]) -> LaunchPlan:
    """One rank per host; hosts known by address, as root."""
    hosts = tuple(HostSpec(h.name, address=h.address, user="root") for h in cluster.hosts)
    n = len(hosts)
    job = JobSpec(tuple(program), replicas=n, instances=n, numa_aware=False)
    return make_plan(ClusterSpec(name=cluster.name, hosts=hosts), job)


def mpirun_job(
    cluster: TestCluster, plan: LaunchPlan, job_dir: Path, relay: bool = True
) -> RenderedJob:
    """The plan rendered for mpirun with the cluster's subnet; Open MPI's daemons start through
    the agents (``relay``) or with Open MPI's ssh and the cluster's ssh config."""
    ssh = ("--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {cluster.ssh_config}")
    return render_job(
        plan,
        "mpirun",
        job_dir=str(job_dir),
        mpi_args=mpirun_args(()) if relay else ssh,
        mpi_subnet=cluster.subnet,
        as_root=os.geteuid() == 0,
    )


@contextlib.contextmanager
def staged(cluster: TestCluster, job: RenderedJob) -> Iterator[AgentPool]:
    """Every host's agent, with the job's shard files (and hostfile) written through it."""
    settings = SshSettings(ssh_config=cluster.ssh_config, connect_timeout=5.0)
    with ConnectionPool([h.spec for h in job.plan.hosts], settings) as pool:
        agents = AgentPool(pool)
        try:
            stage_job(agents, job)
            yield agents
        finally:
            agents.close()


def run(cluster: TestCluster, job: RenderedJob, **options: object) -> tuple[LaunchResult, Lines]:
    """Stage the job's files through the hosts' agents, then run mpirun (its daemons started by
    the same agents) with a capturing sink."""
    lines: Lines = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **options)  # type: ignore[arg-type]
    with staged(cluster, job) as agents:
        return MpirunBackend(agents).run(job, opts), lines


def leftovers(cluster: TestCluster, mark: str) -> dict[str, list[str]]:
    """Per host: processes carrying ``mark`` and processes other than sshd (orted, ranks)."""
    found = {}
    for host in cluster.hosts:
        stray = marked_on(host, mark) + [str(p) for p in stray_pids(host)]
        if stray:
            found[host.name] = stray
    return found


def assert_clean(cluster: TestCluster, mark: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while leftovers(cluster, mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(cluster, mark) == {}


def test_rendered_command_uses_addresses_subnet_and_the_rsh_shim(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, str(EXAMPLES / "mpi_check.py")])
    job = mpirun_job(test_cluster_4, plan, tmp_path / "job")
    argv = list(job.launcher)
    hostfile = [line.split()[0] for line in job.files["hostfile"].splitlines()]
    assert hostfile == [h.address for h in test_cluster_4.hosts]
    for name in ("btl_tcp_if_include", "oob_tcp_if_include"):
        assert argv[argv.index(name) + 1] == test_cluster_4.subnet
    assert argv[argv.index("plm_rsh_agent") + 1] == agent_command()
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_mpi4py_ranks_hosts_and_allreduce_agree_with_the_plan(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, str(EXAMPLES / "mpi_check.py")])
    before = sessions_started(test_cluster_4)
    result, lines = run(test_cluster_4, mpirun_job(test_cluster_4, plan, tmp_path / "job"))
    assert result.ok, lines
    after = sessions_started(test_cluster_4)
    assert {h: after[h] - before[h] for h in after} == {h: 1 for h in after}  # one each
    ranks = {i: json.loads(line) for i, s, line in lines if s == "stdout" and i >= 0}
    n = len(test_cluster_4.hosts)
    assert sorted(ranks) == list(range(n))
    for inst in plan.instances:
        seen = ranks[inst.index]
        assert (seen["rank"], seen["size"], seen["allreduce"]) == (inst.index, n, n * (n + 1) // 2)
        assert seen["hostname"] == inst.host == test_cluster_4.hosts[inst.host_index].name
        assert seen["env"]["POPDIST_INSTANCE_INDEX"] == seen["env"]["RANK"] == str(inst.index)
        assert seen["env"]["POPRUN_HOST_INDEX"] == str(inst.host_index)
    assert [(r.host, r.state, r.exit_code) for r in result.instances] == [
        (inst.host, "exited", 0) for inst in plan.instances
    ]
    assert_clean(test_cluster_4, "mpi_check.py")


def node_of(cpu: int) -> int:
    """The NUMA node of this machine that ``cpu`` is on."""
    return next(node for node, cpus in machine_nodes().items() if cpu in cpus)


# a rankfile binds every rank: with one usable CPU a binding would change nothing (poprun-py
# makes none, and mpirun gets --bind-to none), so the test needs a second
@pytest.mark.requires("2 usable CPUs")
def test_open_mpi_binds_every_rank_itself_from_the_rankfile(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = f"poprun-bind-{uuid.uuid4().hex[:8]}"
    case = binding_case()  # from this machine: two CPUs this process may use, a node it has
    cpus = sorted({case.first, case.second})  # local instance 0 gets the first, 1 the second
    declared = Topology((NumaNode(case.node, tuple(cpus)),))
    hosts = tuple(
        HostSpec(h.name, address=h.address, user="root", topology=declared)
        for h in test_cluster_4.hosts
    )
    spec = JobSpec((PY, "-c", BINDING_PROBE, mark), replicas=8, instances=8)
    plan = make_plan(ClusterSpec(name=test_cluster_4.name, hosts=hosts), spec)
    real = discover_local()  # the test hosts are namespaces of this machine
    job = render_job(
        plan,
        "mpirun",
        job_dir=str(tmp_path / "job"),
        available={h.name: real for h in plan.hosts},
        mpi_args=mpirun_args(()),
        mpi_subnet=test_cluster_4.subnet,
        as_root=os.geteuid() == 0,
    )
    assert "numactl" not in " ".join(job.launcher) and "rankfile" in job.files
    result, lines = run(test_cluster_4, job)
    assert result.ok, lines
    seen = {i: json.loads(line) for i, s, line in lines if s == "stdout" and i >= 0}
    for inst in plan.instances:  # each on its CPU; memory on that CPU's node (local_only)
        cpu = cpus[inst.local_index]
        want = {"cpus": str(cpu), "mems": case.mems, "policies": [f"bind:{node_of(cpu)}"]}
        assert seen[inst.index] == want, inst
    assert_clean(test_cluster_4, mark)


SHARD_READER = (
    "import os, socket\n"
    "from mpi4py import MPI\n"
    "rank = MPI.COMM_WORLD.Get_rank()\n"
    "text = open(os.environ['POPRUN_SHARD_FILE']).read().strip()\n"
    "mode = oct(os.stat(os.environ['POPRUN_SHARD_FILE']).st_mode & 0o777)\n"
    "print(rank, socket.gethostname(), text, mode, flush=True)\n"
)


def test_shard_files_are_staged_by_the_agents_also_for_the_users_own_rsh_agent(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, "-c", SHARD_READER])
    job = mpirun_job(test_cluster_4, plan, tmp_path / "job", relay=False)
    tag = uuid.uuid4().hex[:8]
    job = replace(
        job, instances=tuple(replace(c, shard_text=f"{tag}-{c.index}.rec\n") for c in job.instances)
    )
    result, lines = run(test_cluster_4, job)
    assert result.ok, lines
    got = sorted(line for i, s, line in lines if s == "stdout" and i >= 0)
    assert got == [f"{i.index} {i.host} {tag}-{i.index}.rec 0o600" for i in plan.instances]


def test_a_failing_rank_is_the_root_cause_and_nothing_is_left_on_any_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = f"poprun-mpi-hosts-{uuid.uuid4().hex[:10]}"
    program = (
        "import os, time\n"
        "from mpi4py import MPI\n"
        "if MPI.COMM_WORLD.Get_rank() == 2:\n"
        "    time.sleep(0.5); os._exit(3)  # a crash: no MPI_Finalize\n"
        "time.sleep(60)\n"
    )
    plan = plan_on(test_cluster_4, [PY, "-c", program, mark])
    start = time.monotonic()
    result, _ = run(
        test_cluster_4, mpirun_job(test_cluster_4, plan, tmp_path / "job"), grace_period=2.0
    )
    assert time.monotonic() - start < 20
    root = result.root_cause
    assert root is not None and (root.index, root.exit_code) == (2, 3)
    assert root.host == test_cluster_4.hosts[2].name
    assert {r.state for r in result.instances if r.index != 2} == {"stopped"}
    assert_clean(test_cluster_4, mark)


DRIVER = """
import json, sys
from pathlib import Path
from poprun_py.core.result import RunOptions
from poprun_py.backends.mpirun import MpirunBackend
from poprun_py.providers.netns import load_cluster
from tests.integration.test_mpirun_hosts import mpirun_job, plan_on, staged

cluster = load_cluster(sys.argv[1])
job = mpirun_job(cluster, plan_on(cluster, json.loads(sys.argv[2])), Path(sys.argv[3]))
with staged(cluster, job) as agents:
    print("started", flush=True)
    options = RunOptions(grace_period=2.0, sink=lambda i, s, line: None)
    result = MpirunBackend(agents).run(job, options)
print(json.dumps({"interrupted": result.interrupted, "exit": result.exit_code}), flush=True)
"""


def test_interrupting_mpirun_stops_the_ranks_on_every_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = f"poprun-mpi-hosts-{uuid.uuid4().hex[:10]}"
    program = [PY, "-c", "import time; time.sleep(60)", mark]
    argv = [PY, "-c", DRIVER, test_cluster_4.name, json.dumps(program), str(tmp_path / "job")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    deadline = time.monotonic() + 20
    while len(running(test_cluster_4, mark)) < len(test_cluster_4.hosts):
        assert time.monotonic() < deadline, f"ranks did not start: {running(test_cluster_4, mark)}"
        time.sleep(0.1)
    assert sorted(running(test_cluster_4, mark)) == sorted(test_cluster_4.host_names)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert json.loads(out) == {"interrupted": True, "exit": 130}
    assert_clean(test_cluster_4, mark)


def running(cluster: TestCluster, mark: str) -> dict[str, list[int]]:
    """Per host: its processes (by network namespace) whose command line has ``mark``."""
    found = subprocess.run(
        ["pgrep", "-f", mark], check=False, capture_output=True, text=True
    ).stdout.split()
    pids = {int(p) for p in found}
    out = {}
    for host in cluster.hosts:
        mine = sorted(pids.intersection(host_pids(host.netns)))
        if mine:
            out[host.name] = mine
    return out


def test_a_host_off_the_network_is_the_root_cause_within_seconds(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(2, "kr")
    mark = f"poprun-mpi-hosts-{uuid.uuid4().hex[:10]}"
    plan = plan_on(cluster, [PY, "-c", "import time; time.sleep(60)", mark])
    victim = cluster.hosts[1]
    cut: list[float] = []

    def cut_off_when_running() -> None:
        deadline = time.monotonic() + 20
        while len(running(cluster, mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        netns = ["ip", "netns", "exec", victim.netns]
        subprocess.run([*netns, "ip", "link", "set", "eth0", "down"], check=True)
        cut.append(time.monotonic())

    cutter = threading.Thread(target=cut_off_when_running, daemon=True)
    cutter.start()
    job = mpirun_job(cluster, plan, tmp_path / "job")
    result, _ = run(cluster, job, grace_period=1.0, host_timeout=3.0)  # --host-timeout 3s
    assert cut and time.monotonic() - cut[0] < 8.0
    root = result.root_cause
    assert root is not None and (root.index, root.host, root.state) == (1, victim.name, "lost")
    assert "stopped answering" in root.detail
    assert result.instances[0].state == "stopped"
    assert_clean(dataclasses.replace(cluster, hosts=cluster.hosts[:1]), mark)
    # cut off from poprun-py, the victim's agent stops orted and its rank by itself
    deadline = time.monotonic() + 6.0
    while running(cluster, mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(cluster, mark) == {}
