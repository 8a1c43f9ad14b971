"""Plan and render at scale: 256, 1,024 and 4,096 hosts x 8 instances x 8 replicas, with 1M
input files (a synthetic manifest with sizes), in one run.

For each host count it prints the in-process planning time (``prepare``: hosts, the 1M-file
manifest, shards), the render time of every registered backend (``render_job``: instance
commands, shard lists, the launcher's command line and files), the wall time and peak memory of
the whole ``poprun-py plan --format json`` command, and the largest argv + environment a
rendered launcher needs, beside the figures measured before issue 24 (:data:`BEFORE`).

Targets (issues 2 and 24): 1M files within 2 s and 500 MB peak; nothing superlinear; no
command line that grows with hosts.

Usage:

    python benchmarks/bench_plan.py            # one run of each (about 45 s CPU on 2 cores)
    python benchmarks/bench_plan.py --runs 3   # medians
    python benchmarks/bench_plan.py --files 10000 --hosts 256 1024
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

from poprun_py.core.backends import REGISTRY
from poprun_py.errors import RenderError
from poprun_py.prepare.job import LaunchOptions, prepare
from poprun_py.render.job import RenderedJob, render_job

PER_HOST = 8
REPLICAS_PER_INSTANCE = 8
JOB_DIR = "/tmp/poprun-bench-job"
T = TypeVar("T")
BEFORE: dict[tuple[int, str], str] = {
    (256, "plan"): "1.49",
    (256, "render local"): "0.57",
    (256, "render ssh"): "0.51",
    (256, "render mpirun"): "0.65",
    (256, "render mpiexec"): "fails",
    (256, "render slurm"): "2.29",
    (256, "render k8s"): "0.57",
    (1024, "plan"): "1.80",
    (1024, "render local"): "0.80",
    (1024, "render ssh"): "0.57",
    (1024, "render mpirun"): "1.06",
    (1024, "render mpiexec"): "fails",
    (1024, "render slurm"): "2.84",
    (1024, "render k8s"): "0.80",
    (4096, "plan"): "1.90",
    (4096, "render local"): "1.63",
    (4096, "render ssh"): "1.69",
    (4096, "render mpirun"): "2.79",
    (4096, "render mpiexec"): "fails",
    (4096, "render slurm"): "6.55",
    (4096, "render k8s"): "1.71",
}
"""CPU seconds before issue 24's item 5 (commit e80b188; this script, one run, this 2-core
machine under other load: compare CPU, not wall). The issue measured the 4,096-host plan at
0.92 s wall on a quiet machine. ``fails``: mpiexec's command line held one app context per
instance, more than the OS takes (2.2 MB at 256 hosts x 8, 35 MB at 4,096): a RenderError."""


def write_manifest(path: str, n: int) -> None:
    rng = random.Random(n)
    with open(path, "w") as out:
        for i in range(n):
            out.write(f"/data/imagenet/train-{i:07d}.tfrecord {rng.randint(50_000, 150_000_000)}\n")


def options(hosts: int, manifest: str) -> LaunchOptions:
    instances = hosts * PER_HOST
    return LaunchOptions(
        program=("python", "train.py"),
        hosts=f"node[0001-{hosts:04d}]",
        backend="ssh",
        instances=instances,
        replicas=instances * REPLICAS_PER_INSTANCE,
        inputs=(f"@{manifest}",),
    )


def timed(fn: Callable[[], T], runs: int) -> tuple[float, float, T]:
    """Median wall and CPU seconds of ``runs`` calls of ``fn``, and its last result."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def run_cli(hosts: int, manifest: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one ``poprun-py plan --format json``."""
    opts = options(hosts, manifest)
    argv = ["/usr/bin/time", "-f", "BENCH %e %U %S %M", sys.executable, "-m", "poprun_py"]
    argv += ["plan", "-H", opts.hosts or "", "-b", "ssh", "-n", str(opts.instances)]
    argv += ["-r", str(opts.replicas), "-i", f"@{manifest}", "--format", "json", "--", "train.py"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("BENCH"))
    _, wall, user, system, kib = line.split()
    return float(wall), float(user) + float(system), float(kib) / 1024


def exec_size(job: RenderedJob) -> int:
    """argv + launcher environment bytes of the rendered launcher (0: none)."""
    strings = [*job.launcher, *(f"{k}={v}" for k, v in job.launcher_env.items())]
    return sum(len(s.encode()) + 1 for s in strings) if job.launcher else 0


def row(hosts: int, what: str, wall: float, cpu: float, extra: str = "") -> None:
    before = BEFORE.get((hosts, what), "")
    print(f"{hosts:>6} {what:<20} {wall:7.2f} s {cpu:7.2f} s {before:>7}  {extra}")


def bench_hosts(hosts: int, manifest: str, runs: int) -> None:
    opts = options(hosts, manifest)
    wall, cpu, prep = timed(lambda: prepare(opts), runs)
    row(hosts, "plan", wall, cpu, f"{prep.plan.num_instances} instances")
    for backend in REGISTRY:
        render = functools.partial(render_job, prep.plan, backend, job_dir=JOB_DIR)
        try:
            wall, cpu, job = timed(render, runs)
        except RenderError as exc:
            print(f"{hosts:>6} render {backend:<13} fails: {str(exc)[:70]}")
            continue
        size = exec_size(job)
        row(hosts, f"render {backend}", wall, cpu, f"launcher argv+env {size} B" if size else "")
    results = [run_cli(hosts, manifest) for _ in range(runs)]
    wall = statistics.median(r[0] for r in results)
    cpu = statistics.median(r[1] for r in results)
    peak = max(r[2] for r in results)
    row(hosts, "plan --format json", wall, cpu, f"whole command; peak RSS {peak:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, nargs="*", default=[256, 1024, 4096])
    args = parser.parse_args()
    print(
        f"{args.files} input files; {PER_HOST} instances x {REPLICAS_PER_INSTANCE} replicas a "
        f"host; median of {args.runs}; CPU {os.cpu_count()}"
    )
    print(f"{'hosts':>6} {'step':<20} {'wall':>9} {'CPU':>9} {'before':>7}  (before: CPU s)")
    with tempfile.TemporaryDirectory() as tmp:
        manifest = os.path.join(tmp, "manifest.txt")
        write_manifest(manifest, args.files)
        for hosts in args.hosts:
            bench_hosts(hosts, manifest, args.runs)
    print("targets: plan of 1M files within 2 s and 500 MB; launcher argv+env constant")


if __name__ == "__main__":
    main()
