"""``--backend mpiexec``: MPICH's hydra with a real MPI program (C, built with ``mpicc.mpich``
into a temporary directory), on this machine and across real test hosts.

Across hosts, hydra's proxies start through the hosts' agents (one login session per host for
the whole launch) and connect back to ``-localhost``, this machine's address towards them. A
failing rank is the root cause with its own code and every other rank is stopped on every host;
Ctrl-C stops everything with 130; nothing is left in any namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.agent.client import AgentPool, stage_job
from poprun_py.backends.mpi import source_address
from poprun_py.backends.mpiexec import MpiexecBackend, mpiexec_args
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.spec import ClusterSpec, HostSpec, JobSpec
from poprun_py.providers.netns import TestCluster, host_pids
from poprun_py.render.job import RenderedJob, render_job
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from tests import requirements
from tests.integration.helpers import (
    left_behind,
    marked_on,
    plan_for,
    sessions_started,
    stray_pids,
    unique_sleep,
)

pytestmark = pytest.mark.mpi

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
Lines = list[tuple[int, str, str]]

MPI_PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env(const char *name) { const char *v = getenv(name); return v ? v : ""; }

int main(int argc, char **argv) {
    int rank, size, one, sum;
    char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    one = rank + 1;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    gethostname(host, sizeof host);
    const char *mode = argc > 1 ? argv[1] : "check";
    if (strcmp(mode, "check") == 0) {
        printf("{\"rank\": %d, \"size\": %d, \"allreduce\": %d, \"hostname\": \"%s\", "
               "\"RANK\": \"%s\", \"POPRUN_HOST_INDEX\": \"%s\"}\n",
               rank, size, sum, host, env("RANK"), env("POPRUN_HOST_INDEX"));
        MPI_Finalize();
        return 0;
    }
    printf("rank %d ready\n", rank);
    fflush(stdout);
    if (strcmp(mode, "fail") == 0 && rank == 2) { usleep(500000); _exit(3); }
    sleep(60);
    MPI_Finalize();
    return 0;
}
"""


def need_mpich() -> None:
    """Skip, naming what is missing and its Debian package (CI=true: a failure), without
    MPICH's hydra and compiler (tests/requirements.py)."""
    requirements.require("mpiexec.hydra", "mpicc.mpich")


@pytest.fixture(scope="module")
def mpi_program(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The MPI program above, compiled against MPICH; its path."""
    need_mpich()
    where = tmp_path_factory.mktemp("mpich")
    (where / "check.c").write_text(MPI_PROGRAM)
    subprocess.run(
        ["mpicc.mpich", "-O1", "-o", str(where / "check"), str(where / "check.c")], check=True
    )
    return str(where / "check")


def mpiexec_job(plan: LaunchPlan, job_dir: Path, mpi_args: tuple[str, ...] = ()) -> RenderedJob:
    return render_job(plan, "mpiexec", job_dir=str(job_dir), mpi_args=mpi_args)


def run(
    job: RenderedJob, agents: AgentPool | None = None, **opts: object
) -> tuple[LaunchResult, Lines]:
    lines: Lines = []
    options = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **opts)  # type: ignore[arg-type]
    return MpiexecBackend(agents).run(job, options), lines


def ranks_seen(lines: Lines) -> dict[int, dict[str, object]]:
    return {i: json.loads(line) for i, s, line in lines if s == "stdout" and i >= 0}


# ---------------------------------------------------------------- this machine


def test_four_local_ranks_agree_with_the_plan(mpi_program: str, tmp_path: Path) -> None:
    plan = plan_for([mpi_program], "localhost", instances=4, numa_aware=False)
    result, lines = run(mpiexec_job(plan, tmp_path / "job"))
    assert result.ok, lines
    ranks = ranks_seen(lines)
    assert sorted(ranks) == [0, 1, 2, 3]
    for inst in plan.instances:
        seen = ranks[inst.index]
        assert (seen["rank"], seen["size"], seen["allreduce"]) == (inst.index, 4, 10)
        assert seen["RANK"] == str(inst.index)
    assert [r.state for r in result.instances] == ["exited"] * 4


def test_a_failing_local_rank_is_the_root_cause_with_its_own_code(
    mpi_program: str, tmp_path: Path
) -> None:
    mark = unique_sleep()
    plan = plan_for([mpi_program, "fail", mark], "localhost", instances=4, numa_aware=False)
    start = time.monotonic()
    result, lines = run(mpiexec_job(plan, tmp_path / "job"), grace_period=2.0)
    assert time.monotonic() - start < 20
    assert result.exit_code == 3, lines  # hydra itself says 9: a rank it killed
    assert result.root_cause is not None and result.root_cause.index == 2
    assert [r.state for r in result.instances] == ["stopped", "stopped", "exited", "stopped"]
    assert left_behind(mark) == []


INTERRUPT_DRIVER = """
import json, pickle, sys
from poprun_py.core.result import RunOptions
from poprun_py.backends.mpiexec import MpiexecBackend
job = pickle.load(open(sys.argv[1], "rb"))
print("started", flush=True)
options = RunOptions(grace_period=2.0, sink=lambda i, s, line: print(line, flush=True))
result = MpiexecBackend().run(job, options)
print(json.dumps({"interrupted": result.interrupted, "exit": result.exit_code,
                  "states": sorted({r.state for r in result.instances})}), flush=True)
"""


def test_interrupting_local_mpiexec_stops_every_rank(mpi_program: str, tmp_path: Path) -> None:
    import pickle

    mark = unique_sleep()
    plan = plan_for([mpi_program, "sleep", mark], "localhost", instances=3, numa_aware=False)
    (tmp_path / "job.pickle").write_bytes(pickle.dumps(mpiexec_job(plan, tmp_path / "job")))
    driver = subprocess.Popen(
        [PY, "-c", INTERRUPT_DRIVER, str(tmp_path / "job.pickle")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert driver.stdout is not None
    ready = 0
    while ready < 3:
        line = driver.stdout.readline()
        assert line, "the driver ended before every rank was ready"
        ready += line.startswith("rank ") and line.endswith(" ready\n")
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=30)
    assert json.loads(out.strip().splitlines()[-1]) == {
        "interrupted": True, "exit": 130, "states": ["stopped"],
    }  # fmt: skip
    assert left_behind(mark) == []


# ---------------------------------------------------------------- test hosts


def plan_on(cluster: TestCluster, program: list[str], per_host: int = 1) -> LaunchPlan:
    hosts = tuple(HostSpec(h.name, address=h.address, user="root") for h in cluster.hosts)
    n = len(hosts) * per_host
    job = JobSpec(tuple(program), replicas=n, instances=n, numa_aware=False)
    return make_plan(ClusterSpec(name=cluster.name, hosts=hosts), job)


def remote_job(cluster: TestCluster, plan: LaunchPlan, job_dir: Path) -> RenderedJob:
    """As ``poprun-py launch`` renders it: proxies through the agents, ``-localhost``."""
    here = source_address(cluster.hosts[0].address)
    return mpiexec_job(plan, job_dir, mpiexec_args((), local_address=str(here)))


@contextlib.contextmanager
def staged(cluster: TestCluster, job: RenderedJob) -> Iterator[AgentPool]:
    settings = SshSettings(ssh_config=cluster.ssh_config, connect_timeout=5.0)
    with ConnectionPool([h.spec for h in job.plan.hosts], settings) as pool:
        agents = AgentPool(pool)
        try:
            stage_job(agents, job)
            yield agents
        finally:
            agents.close()


def leftovers(cluster: TestCluster, mark: str) -> dict[str, list[str]]:
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


@pytest.mark.hosts
def test_ranks_hosts_and_allreduce_across_four_hosts_through_the_agents(
    mpi_program: str, test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    plan = plan_on(test_cluster_4, [mpi_program], per_host=2)
    job = remote_job(test_cluster_4, plan, tmp_path / "job")
    assert job.launcher[0] == "mpiexec.hydra"
    assert job.files["hostfile"].split() == [f"{h.address}:2" for h in test_cluster_4.hosts]
    before = sessions_started(test_cluster_4)
    with staged(test_cluster_4, job) as agents:
        result, lines = run(job, agents)
    assert result.ok, lines
    after = sessions_started(test_cluster_4)
    assert {h: after[h] - before[h] for h in after} == {h: 1 for h in after}  # one each
    ranks = ranks_seen(lines)
    n = plan.num_instances
    assert sorted(ranks) == list(range(n))
    for inst in plan.instances:
        seen = ranks[inst.index]
        assert (seen["rank"], seen["size"], seen["allreduce"]) == (inst.index, n, n * (n + 1) // 2)
        assert seen["hostname"] == inst.host == test_cluster_4.hosts[inst.host_index].name
        assert seen["RANK"] == str(inst.index)
        assert seen["POPRUN_HOST_INDEX"] == str(inst.host_index)
    assert_clean(test_cluster_4, mpi_program)


@pytest.mark.hosts
def test_a_failing_rank_stops_every_host_and_is_the_root_cause(
    mpi_program: str, test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = f"poprun-mpich-{uuid.uuid4().hex[:10]}"
    plan = plan_on(test_cluster_4, [mpi_program, "fail", mark])
    job = remote_job(test_cluster_4, plan, tmp_path / "job")
    start = time.monotonic()
    with staged(test_cluster_4, job) as agents:
        result, lines = run(job, agents, grace_period=2.0)
    assert time.monotonic() - start < 20  # hydra alone would wait for the others' sleep(60)
    root = result.root_cause
    assert root is not None and (root.index, root.exit_code) == (2, 3), lines
    assert root.host == test_cluster_4.hosts[2].name
    assert result.exit_code == 3
    assert {r.state for r in result.instances if r.index != 2} == {"stopped"}
    assert_clean(test_cluster_4, mark)


HOSTS_DRIVER = """
import json, sys
from pathlib import Path
from poprun_py.core.result import RunOptions
from poprun_py.backends.mpiexec import MpiexecBackend
from poprun_py.providers.netns import load_cluster
from tests.integration.test_mpiexec import plan_on, remote_job, staged

cluster = load_cluster(sys.argv[1])
job = remote_job(cluster, plan_on(cluster, json.loads(sys.argv[2])), Path(sys.argv[3]))
with staged(cluster, job) as agents:
    print("started", flush=True)
    result = MpiexecBackend(agents).run(job, RunOptions(grace_period=2.0, sink=lambda *a: None))
print(json.dumps({"interrupted": result.interrupted, "exit": result.exit_code}), flush=True)
"""


def running(cluster: TestCluster, mark: str) -> dict[str, list[int]]:
    found = subprocess.run(["pgrep", "-f", mark], check=False, capture_output=True, text=True)
    pids = {int(p) for p in found.stdout.split()}
    out = {}
    for host in cluster.hosts:
        mine = sorted(pids.intersection(host_pids(host.netns)))
        if mine:
            out[host.name] = mine
    return out


@pytest.mark.hosts
def test_interrupting_mpiexec_stops_the_ranks_on_every_host(
    mpi_program: str, test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = f"poprun-mpich-{uuid.uuid4().hex[:10]}"
    program = [mpi_program, "sleep", mark]
    argv = [PY, "-c", HOSTS_DRIVER, test_cluster_4.name, json.dumps(program), str(tmp_path / "j")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    deadline = time.monotonic() + 20
    while len(running(test_cluster_4, mark)) < len(test_cluster_4.hosts):
        assert time.monotonic() < deadline, f"ranks did not start: {running(test_cluster_4, mark)}"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert json.loads(out) == {"interrupted": True, "exit": 130}
    assert_clean(test_cluster_4, mark)
