"""``--backend mpirun`` across real test hosts: Open MPI's own ssh launch, one rank per host.

The rendered command names hosts by address in its hostfile (a name would cost a DNS timeout per
host), selects the hosts' subnet for Open MPI's TCP traffic, and passes the cluster's ssh config
to Open MPI's ssh (``plm_rsh_args``) so orted is started with the cluster's key and known_hosts.
Shard files are staged on every host over its SSH connection before mpirun starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.backends.base import LaunchResult, RunOptions
from poprun_py.backends.mpirun import MpirunBackend
from poprun_py.backends.ssh import stage_job
from poprun_py.plan import LaunchPlan, make_plan
from poprun_py.render import RenderedJob, render_job
from poprun_py.spec import ClusterSpec, HostSpec, JobSpec
from poprun_py.testhosts import TestCluster, host_pids
from poprun_py.transport import ConnectionPool, SshSettings
from tests.integration.helpers import marked_on, need_mpi, stray_pids

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


def mpirun_job(cluster: TestCluster, plan: LaunchPlan, job_dir: Path) -> RenderedJob:
    """The plan rendered for mpirun with the cluster's subnet and ssh config."""
    rsh = ("--mca", "plm_rsh_args", f"-F {cluster.ssh_config}")
    return render_job(
        plan,
        "mpirun",
        job_dir=str(job_dir),
        mpi_args=rsh,
        mpi_subnet=cluster.subnet,
        as_root=os.geteuid() == 0,
    )


def stage(cluster: TestCluster, job: RenderedJob) -> None:
    """Write the job's shard files (and hostfile) on every host over its SSH connection."""
    settings = SshSettings(ssh_config=cluster.ssh_config, connect_timeout=5.0)
    with ConnectionPool([h.spec for h in job.plan.hosts], settings) as pool:
        stage_job(pool.open_all(), job)


def run(cluster: TestCluster, job: RenderedJob, **options: object) -> tuple[LaunchResult, Lines]:
    """Stage the job's files on every host over SSH, then run mpirun with a capturing sink."""
    stage(cluster, job)
    lines: Lines = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **options)  # type: ignore[arg-type]
    return MpirunBackend().run(job, opts), lines


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


def test_rendered_command_uses_addresses_subnet_and_the_cluster_ssh_config(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, str(EXAMPLES / "mpi_check.py")])
    job = mpirun_job(test_cluster_4, plan, tmp_path / "job")
    argv = list(job.launcher)
    hostfile = [line.split()[0] for line in job.files["hostfile"].splitlines()]
    assert hostfile == [h.address for h in test_cluster_4.hosts]
    for name in ("btl_tcp_if_include", "oob_tcp_if_include"):
        assert argv[argv.index(name) + 1] == test_cluster_4.subnet
    assert argv[argv.index("plm_rsh_args") + 1] == f"-F {test_cluster_4.ssh_config}"
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_mpi4py_ranks_hosts_and_allreduce_agree_with_the_plan(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, str(EXAMPLES / "mpi_check.py")])
    result, lines = run(test_cluster_4, mpirun_job(test_cluster_4, plan, tmp_path / "job"))
    assert result.ok, lines
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


SHARD_READER = (
    "import os, socket\n"
    "from mpi4py import MPI\n"
    "rank = MPI.COMM_WORLD.Get_rank()\n"
    "text = open(os.environ['POPRUN_SHARD_FILE']).read().strip()\n"
    "mode = oct(os.stat(os.environ['POPRUN_SHARD_FILE']).st_mode & 0o777)\n"
    "print(rank, socket.gethostname(), text, mode, flush=True)\n"
)


def test_shard_files_are_staged_on_every_host_before_mpirun_starts(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [PY, "-c", SHARD_READER])
    job = mpirun_job(test_cluster_4, plan, tmp_path / "job")
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
from poprun_py.backends.base import RunOptions
from poprun_py.backends.mpirun import MpirunBackend
from poprun_py.testhosts import load_cluster
from tests.integration.test_mpirun_hosts import mpirun_job, plan_on, stage

cluster = load_cluster(sys.argv[1])
job = mpirun_job(cluster, plan_on(cluster, json.loads(sys.argv[2])), Path(sys.argv[3]))
stage(cluster, job)
print("started", flush=True)
result = MpirunBackend().run(job, RunOptions(grace_period=2.0, sink=lambda i, s, line: None))
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
