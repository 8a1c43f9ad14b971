"""The slurm backend against a real Slurm: slurmctld, munge and one slurmd per test host.

Every test proves nothing is left: no job or step in squeue, and no process carrying the
test's marker (an instance environment variable) in any node's namespace or anywhere else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from poprun_py.backends import slurm_alloc as slurm
from poprun_py.backends.slurm import SlurmBackend
from poprun_py.core.hosts import parse_hosts, slurm_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts
from poprun_py.prepare.discover import discover_local
from poprun_py.providers.netns import host_pids
from poprun_py.render.job import render_job
from tests.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.hosts]

MARKER_VAR = "POPRUN_TEST_MARKER"

REPORT = textwrap.dedent(
    """
    import json, os, socket
    keys = [k for k in os.environ if k.startswith(("POPDIST_", "POPRUN_")) or k in
            ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SECRET_TOKEN")]
    print(json.dumps({"env": {k: os.environ[k] for k in keys}, "hostname": socket.gethostname(),
                      "cpus": sorted(os.sched_getaffinity(0)), "cwd": os.getcwd()}))
    """
)

DRIVER = textwrap.dedent(
    """
    # What `poprun-py launch --backend slurm` does: hosts from the allocation (or a new one),
    # plan, render, run the step; exit with the result's code.
    import json, os, sys
    from pathlib import Path
    from poprun_py.backends import slurm_alloc as slurm
    from poprun_py.core.result import RunOptions
    from poprun_py.backends.slurm import SlurmBackend
    from poprun_py.core.hosts import parse_hosts
    from poprun_py.core.plan import make_plan
    from poprun_py.prepare.discover import discover_local
    from poprun_py.render.job import render_job
    from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts

    out_dir, marker, *program = sys.argv[1:]
    Path(out_dir, "driver.pid").write_text(str(os.getpid()))
    with slurm.allocated(slurm.SlurmRequest(nodes=2, tasks=4, time="5")) as alloc:
        hosts = parse_hosts(",".join(alloc.hosts))
        cluster = cluster_from_hosts(hosts, topology=discover_local())
        spec = JobSpec(tuple(program), replicas=4, instances=4,
                       env=(EnvVar("POPRUN_TEST_MARKER", marker),))
        job = render_job(make_plan(cluster, spec), "slurm", job_dir=os.path.join(out_dir, "job"))
        options = RunOptions(output_dir=Path(out_dir, "logs"), grace_period=5.0)
        result = SlurmBackend(alloc.environ).run(job, options)
    Path(out_dir, "result.json").write_text(json.dumps({
        "job": alloc.job_id, "owned": alloc.owned, "hosts": list(alloc.hosts),
        "interrupted": result.interrupted, "exit_code": result.exit_code,
        "states": [r.state for r in result.instances]}))
    sys.exit(result.exit_code)
    """
)


# ---------------------------------------------------------------- helpers


def plan_on(hosts: Sequence[str], program: Sequence[str], marker: str, **env: str) -> LaunchPlan:
    """4 instances over ``hosts`` (in that order) on this machine's real topology."""
    cluster = cluster_from_hosts(parse_hosts(",".join(hosts)), topology=discover_local())
    extra = tuple(EnvVar(k, v, secret=k.startswith("SECRET")) for k, v in env.items())
    spec = JobSpec(
        tuple(program), replicas=4, instances=4, env=(EnvVar(MARKER_VAR, marker), *extra)
    )
    return make_plan(cluster, spec)


def run_step(
    plan: LaunchPlan, alloc: slurm.Allocation, job_dir: Path, lines: list[tuple[int, str, str]]
) -> LaunchResult:
    job = render_job(plan, "slurm", job_dir=str(job_dir))
    options = RunOptions(grace_period=2.0, sink=lambda i, s, line: lines.append((i, s, line)))
    return SlurmBackend(alloc.environ).run(job, options)


def _carries(pid: int, token: bytes) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return token in environ.split(b"\0") and stat.rsplit(")", 1)[1].split()[0] != "Z"


def marked_pids(cluster: SlurmCluster, marker: str) -> dict[str, list[int]]:
    """Live processes whose environment carries ``marker``: per node namespace, and anywhere."""
    token = f"{MARKER_VAR}={marker}".encode()
    found = {n.name: [p for p in host_pids(n.netns) if _carries(p, token)] for n in cluster.nodes}
    pids = (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
    found["anywhere"] = [p for p in pids if _carries(p, token)]
    return {where: pids for where, pids in found.items() if pids}


def assert_nothing_left(cluster: SlurmCluster, env: Mapping[str, str], marker: str) -> None:
    """No job or step in squeue (after a short settling time) and no marked process."""
    deadline = time.monotonic() + 10
    while True:
        jobs = subprocess.run(
            ["squeue", "-h"], env=env, capture_output=True, text=True, check=False
        )
        jobs_out = jobs.stdout
        steps = subprocess.run(
            ["squeue", "-h", "-s"], env=env, capture_output=True, text=True, check=False
        ).stdout
        pids = marked_pids(cluster, marker)
        if not jobs_out.strip() and not steps.strip() and not pids:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"left behind: jobs {jobs_out!r} steps {steps!r} processes {pids}")
        time.sleep(0.1)


def instance_reports(lines: list[tuple[int, str, str]]) -> dict[int, dict[str, object]]:
    return {i: json.loads(line) for i, s, line in lines if s == "stdout" and line.startswith("{")}


@pytest.fixture
def marker() -> str:
    return f"slurm-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- tests


def test_step_spans_nodes_with_ranks_hosts_env_and_binding_of_the_plan(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, marker: str
) -> None:
    request = slurm.SlurmRequest(nodes=2, tasks=4, time="5")
    with slurm.allocated(request) as alloc:
        assert alloc.owned and alloc.hosts == slurm_cluster.node_names[:2]
        hosts = tuple(reversed(alloc.hosts))  # the plan's order differs from Slurm's
        plan = plan_on(hosts, [sys.executable, "-c", REPORT], marker, SECRET_TOKEN="s3 cr'et")
        lines: list[tuple[int, str, str]] = []
        result = run_step(plan, alloc, tmp_path / "job", lines)
    assert result.ok, result
    reports = instance_reports(lines)
    assert sorted(reports) == [0, 1, 2, 3]
    for inst in plan.instances:
        got = reports[inst.index]
        assert got["hostname"] == inst.host  # really ran on that node
        env = got["env"]
        assert isinstance(env, dict)
        assert env["SLURM_PROCID"] == env["RANK"] == str(inst.index)
        assert env["SLURM_LOCALID"] == env["LOCAL_RANK"] == str(inst.local_index)
        assert env["POPRUN_HOST_NAME"] == inst.host
        assert env["POPDIST_REPLICA_INDEX_OFFSET"] == str(inst.replica_offset)
        assert env["MASTER_ADDR"] == hosts[0]
        assert env["SECRET_TOKEN"] == "s3 cr'et"
        assert "POPRUN_RUN_ID" not in env  # tasks are Slurm's, not poprun-py's local processes
        assert got["cpus"] == list(inst.cpus)  # srun's --cpu-bind=mask_cpu
    assert "s3 cr'et" not in "".join(p.read_text() for p in (tmp_path / "job").glob("slurm-*"))
    assert_nothing_left(slurm_cluster, slurm_env, marker)


def test_a_long_line_of_a_task_arrives_whole(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, marker: str
) -> None:
    # srun cuts output into 1,024-byte messages and --label makes each a line; a line that
    # long (a JSON report under a long working directory) must still reach the sink in one
    write = (
        "import sys\nfor n in (2500, 1024, 3):\n"
        "    print('a' * n)\n    print('e' * n, file=sys.stderr)"
    )
    with slurm.allocated(slurm.SlurmRequest(nodes=2, tasks=2, time="5")) as alloc:
        plan = plan_on(alloc.hosts, [sys.executable, "-c", write], marker)
        lines: list[tuple[int, str, str]] = []
        result = run_step(plan, alloc, tmp_path / "job", lines)
    assert result.ok, result
    for index in (0, 1):
        for stream, char in (("stdout", "a"), ("stderr", "e")):
            got = [len(line) for i, s, line in lines if i == index and s == stream and line]
            assert got == [2500, 1024, 3], (index, stream)
    assert_nothing_left(slurm_cluster, slurm_env, marker)


def test_failing_task_ends_the_step_with_its_exit_code(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, marker: str
) -> None:
    script = 'echo started; if [ "$RANK" = 2 ]; then sleep 0.5; exit 7; fi; exec sleep 60'
    with slurm.allocated(slurm.SlurmRequest(nodes=2, tasks=4, time="5")) as alloc:
        plan = plan_on(alloc.hosts, ["sh", "-c", script], marker)
        lines: list[tuple[int, str, str]] = []
        started = time.monotonic()
        result = run_step(plan, alloc, tmp_path / "job", lines)
    assert time.monotonic() - started < 15
    assert result.exit_code == 7
    assert result.root_cause is not None and result.root_cause.index == 2
    assert [r.state for r in result.instances] == ["stopped", "stopped", "exited", "stopped"]
    assert sorted(i for i, _, line in lines if line == "started") == [0, 1, 2, 3]
    assert_nothing_left(slurm_cluster, slurm_env, marker)


def test_ctrl_c_cancels_the_step_and_releases_the_allocation(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, marker: str
) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # the tasks ignore SIGTERM: only Slurm's SIGKILL (srun's forced termination, or scancel
    # when srun gives up on a step cancelled right after its launch) ends them
    script = 'trap "" TERM; touch "$0/started-$RANK"; sleep 60; sleep 60'
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(tmp_path), marker, "sh", "-c", script, str(tmp_path)],
        env=slurm_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        flags = [tmp_path / f"started-{i}" for i in range(4)]
        deadline = time.monotonic() + 20
        while not all(p.exists() for p in flags) and proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[0]
        stopped = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=20)[0]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, output
    assert time.monotonic() - stopped < 10
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["interrupted"] and result["owned"]
    assert result["states"] == ["stopped"] * 4
    assert_nothing_left(slurm_cluster, slurm_env, marker)


def test_allocation_is_detected_from_the_environment(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str]
) -> None:
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    proc = subprocess.run(
        ["salloc", "--nodes=2", "--time=1", sys.executable, "-c", dump],
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    inside = json.loads(proc.stdout)
    alloc = slurm.current_allocation(inside)
    assert alloc is not None and not alloc.owned
    assert alloc.hosts == slurm_cluster.node_names[:2]
    assert [h.name for h in slurm_hosts(inside) or []] == list(alloc.hosts)
    assert slurm.current_allocation(slurm_env) is None


def test_batch_script_runs_the_step_inside_its_allocation(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, marker: str
) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    request = slurm.SlurmRequest(nodes=2, tasks=4, time="5", output=str(tmp_path / "batch.out"))
    launch = [sys.executable, str(driver), str(tmp_path), marker, "sh", "-c", "hostname"]
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.batch_script(request, launch))
    proc = subprocess.run(
        ["sbatch", "--wait", str(script)],
        check=False,
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, (proc.stderr, (tmp_path / "batch.out").read_text())
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["owned"]  # the batch job's allocation, found in the environment
    assert result["hosts"] == list(slurm_cluster.node_names[:2])
    names = [(tmp_path / "logs" / f"instance-{i}.log").read_text().strip() for i in range(4)]
    assert names == [result["hosts"][0]] * 2 + [result["hosts"][1]] * 2
    assert_nothing_left(slurm_cluster, slurm_env, marker)


def test_steps_left_by_a_killed_srun_are_cancelled_by_name(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], marker: str
) -> None:
    name = f"poprun-{marker}"
    with slurm.allocated(slurm.SlurmRequest(nodes=2, tasks=2, time="5")) as alloc:
        env = {**slurm_env, **alloc.environ, MARKER_VAR: marker}
        srun = subprocess.Popen(
            ["srun", f"--job-name={name}", "-N2", "-n2", "sleep", "60"], env=env
        )
        deadline = time.monotonic() + 10
        while not marked_pids(slurm_cluster, marker).get(slurm_cluster.node_names[1]):
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        srun.kill()  # as when the grace period ran out: the step lives on without srun
        srun.wait()
        assert slurm.cancel_steps([name], env)  # still listed: SIGKILL sent
        while slurm.cancel_steps([name], env):
            assert time.monotonic() < deadline + 10
            time.sleep(0.1)
    assert_nothing_left(slurm_cluster, slurm_env, marker)
