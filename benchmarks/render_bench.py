"""Render time of launch commands: 16 hosts x 8 instances and 4096 hosts x 8 instances, for
every registered backend (their launchers' command lines stay small: per-instance parts go
into the job's files past :data:`~poprun_py.render.job.ARGV_LIMIT`).

Hosts are 2-socket machines with 8 NUMA nodes x 16 CPUs and 16 devices; each instance drives
one replica of 2 devices. Prints the median of several runs for each backend; planning time is
printed apart (it is not rendering).

Usage:

    python benchmarks/render_bench.py            # 16 and 4096 hosts
    python benchmarks/render_bench.py 16 256     # chosen host counts
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable

from poprun_py.core.backends import REGISTRY
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.render.display import format_job
from poprun_py.render.job import ARGV_LIMIT, ARGV_MAX, render_job

PER_HOST = 8
JOB_DIR = "/tmp/poprun-job"


def plan_for(num_hosts: int) -> LaunchPlan:
    """A plan of ``num_hosts`` x 8 instances on 2-socket hosts."""
    hosts = parse_hosts(f"node[1-{num_hosts}]")
    cluster = cluster_from_hosts(hosts, topology=uniform(8, 16, 2))
    instances = num_hosts * PER_HOST
    job = JobSpec(
        ("python", "train.py", "--config", "resnet 50.yaml"),
        replicas=instances,
        instances=instances,
        devices_per_replica=2,
        env=(EnvVar("LR", "0.1"), EnvVar("TOKEN", "s3cret-value", secret=True)),
        workdir="/work",
    )
    return make_plan(cluster, job)


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time of ``runs`` calls of ``fn``, in seconds."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: list[str]) -> None:
    """Print plan and render times for each host count."""
    for num_hosts in [int(a) for a in argv] or [16, 4096]:
        runs = 5 if num_hosts <= 256 else 3
        start = time.perf_counter()
        plan = plan_for(num_hosts)
        planned = time.perf_counter() - start
        print(
            f"{num_hosts} hosts x {PER_HOST} = {plan.num_instances} instances "
            f"(make_plan {planned:.3f} s)"
        )
        cases = [(backend, ARGV_LIMIT) for backend in REGISTRY]
        if num_hosts <= 64:  # inline forms: shlex.split of ~100 KB+ command lines
            cases += [("mpirun", ARGV_MAX), ("mpiexec", ARGV_MAX)]
        for backend, limit in cases:
            render = functools.partial(render_job, plan, backend, job_dir=JOB_DIR, argv_limit=limit)
            job = render()
            wall, cpu = timed(render, runs)
            mode = "appfile" if "appfile" in job.files else "inline" if job.launcher else "-"
            size = sum(len(a) + 1 for a in job.launcher)
            files = sum(len(t) for t in job.files.values())
            print(
                f"  render {backend:8s} {mode:7s} {wall * 1000:8.1f} ms wall "
                f"{cpu * 1000:8.1f} ms CPU (median of {runs}; argv {size} B, files {files} B)"
            )
        job = render_job(plan, "mpirun", job_dir=JOB_DIR)
        wall, cpu = timed(functools.partial(format_job, job), 1)
        print(f"  format_job mpirun   {wall * 1000:8.1f} ms wall {cpu * 1000:8.1f} ms CPU")


if __name__ == "__main__":
    main(sys.argv[1:])
