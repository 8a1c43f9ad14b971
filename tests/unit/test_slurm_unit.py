"""The slurm pieces that need no Slurm: srun.j2 and sbatch.j2 rendering, the per-task scripts
(run for real with /bin/sh), srun output parsing, outcomes, requests and allocations from the
environment, and the test cluster's slurm.conf."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.backends import slurm_alloc as slurm
from poprun_py.backends.slurm import (
    BIND_HINT,
    SRUN_CHUNK,
    LabelDemux,
    SlurmBackend,
    TaskReport,
    parse_ranks,
    task_results,
)
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import RunOptions
from poprun_py.core.shard import InputFile, InputSet
from poprun_py.core.spec import ClusterSpec, EnvVar, HostSpec, JobSpec, cluster_from_hosts
from poprun_py.core.topology import Topology, uniform
from poprun_py.errors import BackendError, RenderError, UsageError
from poprun_py.process.output import LAUNCHER_INDEX, Output, write_job_files
from poprun_py.process.supervise import ChildExit, Supervised
from poprun_py.render.job import RenderedJob, render_job
from tests.slurmcluster import node_config, slurm_conf_text

JOB_DIR = "/shared/jobs/run1"
TRICKY = 'it\'s a $(dangerous) `value`\nwith "quotes" and ; & |'


def plan_of(
    hosts: str = "n2,n1",
    topology: Topology | None = None,
    numa_aware: bool = True,
    env: tuple[EnvVar, ...] = (),
    program: tuple[str, ...] = ("python", "train.py", "--name", "run 1"),
) -> LaunchPlan:
    cluster = cluster_from_hosts(parse_hosts(hosts), topology=topology or uniform(2, 2))
    job = JobSpec(program, replicas=4, instances=4, numa_aware=numa_aware, env=env)
    return make_plan(cluster, job)


def rendered(plan: LaunchPlan, job_dir: str = JOB_DIR) -> RenderedJob:
    return render_job(plan, "slurm", job_dir=job_dir)


def exec_line(job: RenderedJob, index: int) -> str:
    """The command task ``index`` runs: the last line of its part of slurm-task.sh."""
    lines = job.files["slurm-task.sh"].splitlines()
    start = lines.index(f"{index})")
    return lines[lines.index(";;", start) - 1]


def run_task(
    job: RenderedJob, index: int, script: Path, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (a copy of slurm-task.sh) as srun would run it for task ``index``."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": str(index), **job.launcher_env}
    return subprocess.run(
        [str(script)], env={**env, **(environ or {})}, capture_output=True, text=True, check=True
    )


# ---------------------------------------------------------------- srun.j2


def test_srun_argv_places_tasks_by_plan_and_binds_like_the_plan() -> None:
    job = rendered(plan_of())
    assert job.launcher == (
        "srun",
        "--job-name=poprun-run1",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--distribution=arbitrary",
        f"--nodelist={JOB_DIR}/slurm-hostfile",
        "--kill-on-bad-exit=1",
        "--label",
        "--cpu-bind=mask_cpu:0x3,0xc",
        "--mem-bind=mask_mem:0x1,0x2",
        "--bcast=/tmp/poprun-shared-jobs-run1.sh",  # srun copies the task script to each node
        f"{JOB_DIR}/slurm-task.sh",
    )
    assert job.files["slurm-hostfile"] == "n2\nn2\nn1\nn1\n"  # task i -> plan instance i's host


def test_srun_binding_is_none_when_numa_binding_is_off() -> None:
    job = rendered(plan_of(numa_aware=False))
    assert "--cpu-bind=none" in job.launcher
    assert not any(a.startswith("--mem-bind") for a in job.launcher)
    assert exec_line(job, 0) == "python train.py --name 'run 1'"


def test_tasks_bind_themselves_when_hosts_bind_differently() -> None:
    hosts = (
        HostSpec("a", topology=uniform(2, 2)),
        HostSpec("b", topology=uniform(1, 4)),
    )
    plan = make_plan(ClusterSpec("mixed", hosts), JobSpec(("prog",), replicas=4, instances=4))
    job = rendered(plan)
    assert "--cpu-bind=none" in job.launcher
    last = [exec_line(job, i) for i in range(4)]
    assert last[0] == "numactl --physcpubind=0-1 --membind=0 prog"
    assert last[2] == "numactl --physcpubind=0-1 --membind=0 prog"
    assert last[3] == "numactl --physcpubind=2-3 --membind=0 prog"


def test_srun_binding_runs_the_tasks_without_numactl() -> None:
    job = rendered(plan_of())
    assert job.instances[0].argv[0] == "python" and job.instances[0].binding is not None
    assert exec_line(job, 1) == "python train.py --name 'run 1'"


def test_secrets_travel_in_srun_environment_not_in_files() -> None:
    env = (EnvVar("TOKEN", "s3cr3t-value", secret=True), EnvVar("MSG", TRICKY))
    job = rendered(plan_of(env=env))
    assert job.launcher_env == {"TOKEN": "s3cr3t-value"}
    assert all("s3cr3t-value" not in text for text in job.files.values())
    assert job.secrets == frozenset({"TOKEN"})


def test_task_scripts_reproduce_every_value_exactly_when_run(tmp_path: Path) -> None:
    """Write the files, run the script as srun would (SLURM_PROCID set), compare environments."""
    env = (EnvVar("MSG", TRICKY), EnvVar("EMPTY", ""), EnvVar("TOKEN", "x y", secret=True))
    dump = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'argv': sys.argv}))"
    plan = plan_of(numa_aware=False, env=env, program=(sys.executable, "-c", dump, TRICKY))
    job = rendered(plan, str(tmp_path / "job dir"))
    write_job_files(job)
    script = Path(job.job_dir) / "slurm-task.sh"
    script.chmod(0o700)
    for cmd in job.instances:
        got = json.loads(run_task(job, cmd.index, script).stdout)
        assert got["argv"][1:] == [TRICKY]
        for key, value in cmd.env.items():
            assert got["env"][key] == value, key


def test_a_task_on_a_node_without_the_job_directory_writes_its_own_shard(tmp_path: Path) -> None:
    """What srun --bcast gives a node that does not share the job directory: only the staged
    copy of the task script. Each task then writes its shard file beside that copy."""
    shards = [f"/data/part {i}.npz" for i in range(3)]
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    plan = make_plan(
        cluster_from_hosts(parse_hosts("n1,n2")),
        JobSpec((sys.executable, "-c", dump), replicas=2, instances=2),
        InputSet.of([InputFile(p, 10) for p in shards]),
    )
    job = rendered(plan, str(tmp_path / "not-here"))
    staged = tmp_path / "node-tmp" / "poprun-staged.sh"
    staged.parent.mkdir()
    staged.write_text(job.files["slurm-task.sh"])
    staged.chmod(0o700)
    for cmd in job.instances:
        got = json.loads(run_task(job, cmd.index, staged).stdout)
        shard = Path(got["POPRUN_SHARD_FILE"])
        assert shard == staged.parent / f"poprun-staged.shard-{cmd.index}.txt"
        assert shard.read_text() == cmd.shard_text and cmd.shard_text
        assert shard.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "not-here").exists()


def test_task_wrapper_refuses_to_run_outside_srun(tmp_path: Path) -> None:
    job = rendered(plan_of(), str(tmp_path))
    (tmp_path / "slurm-task.sh").write_text(job.files["slurm-task.sh"])
    proc = subprocess.run(
        ["/bin/sh", str(tmp_path / "slurm-task.sh")],
        env={},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "not started by srun" in proc.stderr


def test_hostfile_rejects_names_that_are_not_words() -> None:
    hosts = (HostSpec("bad host"), HostSpec("ok"))
    plan = make_plan(ClusterSpec("c", hosts), JobSpec(("prog",), replicas=2, instances=2))
    with pytest.raises(RenderError):
        rendered(plan)


# ---------------------------------------------------------------- srun output


def test_task_report_reads_exit_codes_signals_and_ranges() -> None:
    report = TaskReport()
    report.scan("srun: error: n2: task 2: Exited with exit code 7")
    report.scan("srun: error: n1: tasks 0-1,3: Segmentation fault (core dumped)")
    report.scan("srun: error: n1: task 3: Killed")  # later reports of a rank are ignored
    report.scan("srun: error: Application launch failed: boom")
    ends = report.ends
    assert (ends[2].exit_code, ends[2].signal) == (7, None)
    assert [ends[r].signal for r in (0, 1, 3)] == [11, 11, 11]
    assert report.error == "Application launch failed: boom"
    assert parse_ranks("4") == [4]


def test_label_demux_routes_task_lines_and_srun_lines() -> None:
    lines: list[tuple[int, str, str]] = []
    output = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {})
    report = TaskReport()
    demux = LabelDemux(output, "stderr", report, ntasks=12)
    demux.feed(b" 3: hello\n11: wor")
    demux.feed(b"ld\nsrun: error: n1: task 11: Exited with exit code 2\n 0: \n99: not a task")
    demux.close()
    assert lines == [
        (3, "stderr", "hello"),
        (11, "stderr", "world"),
        (LAUNCHER_INDEX, "stderr", "srun: error: n1: task 11: Exited with exit code 2"),
        (0, "stderr", ""),
        (LAUNCHER_INDEX, "stderr", "99: not a task"),
    ]
    assert report.ends[11].exit_code == 2


def test_label_demux_joins_the_pieces_srun_cuts_a_long_line_into() -> None:
    lines: list[tuple[int, str, str]] = []
    output = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {})
    demux = LabelDemux(output, "stdout", TaskReport(), ntasks=2)
    chunk = SRUN_CHUNK
    # what srun --label printed for task 0 writing 2,500 a's, 1,024 b's, then "c" (see
    # test_slurm's test_a_long_line_of_a_task_arrives_whole), with task 1 in between
    demux.feed(b"0: " + b"a" * chunk + b"\n1: x\n0: " + b"a" * chunk + b"\n0: " + b"a" * 452)
    demux.feed(b"\n0: " + b"b" * chunk + b"\n0: \n0: c\n1: " + b"y" * chunk + b"\n")
    demux.close()
    assert lines == [
        (1, "stdout", "x"),
        (0, "stdout", "a" * 2500),
        (0, "stdout", "b" * 1024),
        (0, "stdout", "c"),
        (1, "stdout", "y" * 1024),
    ]


def _supervised(code: int, *, stopped: bool = False, interrupted: bool = False) -> Supervised:
    now = time.time()
    state = "stopped" if stopped else "exited"
    srun = ChildExit(LAUNCHER_INDEX, "localhost", code, now - 1, now, state)
    return Supervised((srun,), interrupted, 1.0)


HOSTS = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def test_failing_task_is_the_root_cause_and_the_others_are_stopped() -> None:
    report = TaskReport()
    report.scan("srun: error: n2: task 2: Exited with exit code 7")
    report.scan("srun: error: n2: task 3: Terminated")
    report.scan("srun: error: n1: tasks 0-1: Terminated")
    result = task_results(_supervised(143), HOSTS, report)
    assert result.exit_code == 7
    assert [r.state for r in result.instances] == ["stopped", "stopped", "exited", "stopped"]


def test_a_task_killed_first_is_a_failure_in_its_own_right() -> None:
    report = TaskReport()
    report.scan("srun: error: n1: task 1: Killed")
    report.scan("srun: error: n1: task 0: Terminated")
    result = task_results(_supervised(137), HOSTS, report)
    assert result.root_cause is not None and result.root_cause.index == 1
    assert result.exit_code == 128 + 9
    assert result.instances[2].state == "exited" and result.instances[2].exit_code == 0


def test_interrupt_stops_every_task_and_exits_130() -> None:
    report = TaskReport()
    report.scan("srun: error: n1: tasks 0-1: Exited with exit code 3")  # handled SIGTERM
    report.scan("srun: error: n2: tasks 2-3: Killed")
    result = task_results(_supervised(-15, stopped=True, interrupted=True), HOSTS, report)
    assert result.exit_code == 130 and result.interrupted
    assert {r.state for r in result.instances} == {"stopped"}


def test_srun_failing_before_any_task_fails_every_task_with_its_reason() -> None:
    report = TaskReport()
    report.scan("srun: error: Application launch failed: Unable to satisfy cpu bind request")
    result = task_results(_supervised(1), HOSTS, report)
    assert result.exit_code == 1
    assert all(r.failed for r in result.instances)
    assert "cpu bind" in result.instances[0].detail and BIND_HINT in result.instances[0].detail


def test_success_is_every_task_exited_zero() -> None:
    result = task_results(_supervised(0), HOSTS, TaskReport())
    assert result.ok and [r.exit_code for r in result.instances] == [0, 0, 0, 0]


def test_backend_reports_a_missing_srun(tmp_path: Path) -> None:
    job = rendered(plan_of(), str(tmp_path))
    backend = SlurmBackend({"PATH": str(tmp_path)})
    with pytest.raises(BackendError, match="srun not found"):
        backend.run(job, RunOptions())


# ---------------------------------------------------------------- requests and allocations


def test_request_options_and_salloc_argv() -> None:
    req = slurm.SlurmRequest(2, 8, "1:00:00", "gpu", "proj", nodelist=("n1", "n2"))
    assert slurm.salloc_argv(req) == [
        "salloc",
        "--no-shell",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--time=1:00:00",
        "--partition=gpu",
        "--account=proj",
        "--job-name=poprun",
        "--exclusive",
        "--nodelist=n1,n2",
    ]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (slurm.SlurmRequest(0), "--nodes"),
        (slurm.SlurmRequest(2, 3), "evenly"),
        (slurm.SlurmRequest(1, time="an hour"), "--time"),
        (slurm.SlurmRequest(1, partition="a b"), "partition"),
        (slurm.SlurmRequest(2, nodelist=("n1",)), "host"),
    ],
)
def test_bad_requests_are_usage_errors(request_: slurm.SlurmRequest, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        request_.check()


def test_current_allocation_needs_a_job_id_and_a_nodelist() -> None:
    alloc = slurm.current_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02],x"})
    assert alloc is not None and alloc.hosts == ("gpu01", "gpu02", "x") and not alloc.owned
    assert alloc.environ["SLURM_JOB_NUM_NODES"] == "3"
    assert slurm.current_allocation({"SLURM_JOB_NODELIST": "n1"}) is None
    assert slurm.current_allocation({}) is None


def test_step_names_come_from_srun_options_only() -> None:
    job = rendered(plan_of())
    assert slurm.step_names(job.launcher) == ("poprun-run1",)
    assert slurm.step_names(["srun", "-J", "x", "prog", "--job-name=y"]) == ("x",)


def test_batch_script_asks_for_the_request_and_runs_poprun_inside() -> None:
    req = slurm.SlurmRequest(2, 4, "30", output="/shared/out-%j.txt")
    text = slurm.batch_script(req, ["poprun-py", "launch", "--backend", "slurm", "echo", "a b"])
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh"
    directives = [line.split(" ", 1)[1] for line in lines if line.startswith("#SBATCH ")]
    assert directives == [*slurm.request_options(req), "--output=/shared/out-%j.txt"]
    assert lines[-1] == "exec poprun-py launch --backend slurm echo 'a b'"


def test_batch_script_needs_a_command() -> None:
    with pytest.raises(UsageError):
        slurm.batch_script(slurm.SlurmRequest(1), [])


# ---------------------------------------------------------------- the test cluster's config


def test_node_config_and_slurm_conf() -> None:
    hw = node_config(
        "NodeName=x CPUs=4 Boards=1 SocketsPerBoard=2 CoresPerSocket=2 "
        "ThreadsPerCore=1 RealMemory=100\nUpTime=0"
    )
    text = slurm_conf_text(
        "c-1", Path("/s"), ("ctl", "198.18.0.1", 7001), [("a", "198.18.0.11")], hw
    )
    conf = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#")
    assert conf["ClusterName"] == "c_1"
    assert conf["SlurmctldPort"] == "7001"
    assert conf["AuthInfo"] == "socket=/s/munge/munge.socket"
    assert conf["ProctrackType"] == "proctrack/pgid"
    assert "NodeName=a NodeAddr=198.18.0.11 CPUs=4 Boards=1 SocketsPerBoard=2" in text
    with pytest.raises(Exception, match="CPUs"):
        node_config("NodeName=x")
