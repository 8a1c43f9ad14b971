"""Launch cost of the local backend: 16 instances of ``true`` vs. a plain shell loop.

Each round, in turn:

- ``LocalBackend().run`` on a rendered 16-instance job of ``true``: write the shard files,
  start, supervise, reap, sweep; measured in-process, without Python's own start-up;
- the same job with every instance bound (a declared topology of two NUMA nodes, CPU 0 and
  CPU 1, so each instance is bound to one CPU and its node's memory);
- the same 16 children through ``supervise(..., new_session=True)``: what the backend does when
  poprun-py runs on a terminal (a ``setsid`` per child; without a terminal, as here and in CI,
  each child only gets a process group of its own);
- the shell loop of the brief, ``for i in $(seq 16); do true & done; wait`` (``true`` is a
  shell builtin there: the shell forks 16 times and execs nothing);
- the same loop with ``/bin/true``: the same 16 processes the backend starts.

Prints the median of N rounds and the ratios; the target is <= 1.2x the loop that starts the
same processes. The machine's load moves every figure; the ratios within one run are what count.

    $ python benchmarks/bench_local_launch.py --rounds 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from poprun_py.backends.local import LocalBackend
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.result import RunOptions
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology
from poprun_py.hostside.supervision import has_controlling_tty
from poprun_py.prepare.discover import discover_local
from poprun_py.process.output import Output
from poprun_py.process.supervise import Child, supervise
from poprun_py.render.job import RenderedJob, render_job

INSTANCES = 16


def rendered_job(job_dir: str) -> RenderedJob:
    """16 instances of ``true`` on one simulated host, as ``poprun-py launch`` renders them."""
    cluster = cluster_from_hosts(parse_hosts("localhost"), simulated=True)
    plan = make_plan(cluster, JobSpec(("true",), replicas=INSTANCES, instances=INSTANCES))
    return render_job(plan, "local", job_dir=job_dir)


def bound_job(job_dir: str) -> RenderedJob:
    """The same, each instance bound to one CPU (0 or 1) and one NUMA node (this machine's)."""
    nodes = (NumaNode(0, (0,)), NumaNode(1, (1,)))
    cluster = cluster_from_hosts(parse_hosts("localhost"), simulated=True, topology=Topology(nodes))
    plan = make_plan(cluster, JobSpec(("true",), replicas=INSTANCES, instances=INSTANCES))
    return render_job(plan, "local", job_dir=job_dir, available={"localhost": discover_local()})


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    job = rendered_job(tempfile.mkdtemp(prefix="bench-local-"))
    bound = bound_job(tempfile.mkdtemp(prefix="bench-local-"))
    backend, options = LocalBackend(), RunOptions()

    def local(job: RenderedJob = job) -> None:
        if not backend.run(job, options).ok:
            raise SystemExit("the local backend failed")

    children = [Child(c.index, c.host, c.argv, c.env, c.cwd) for c in job.instances]
    hosts = {c.index: c.host for c in job.instances}

    def with_sessions() -> None:
        supervise(children, Output(options, hosts), new_session=True)

    loops = {
        "sh loop, builtin true": f"for i in $(seq {INSTANCES}); do true & done; wait",
        "sh loop, /bin/true": f"for i in $(seq {INSTANCES}); do /bin/true & done; wait",
    }
    actions: dict[str, Callable[[], object]] = {
        "LocalBackend, 16 x true": local,
        "same, each bound": lambda: local(bound),
        "same, a session each": with_sessions,
    }
    for name, script in loops.items():
        actions[name] = lambda script=script: subprocess.run(["sh", "-c", script], check=True)
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        action()  # warm up caches
    for _ in range(args.rounds):
        for name, action in actions.items():
            samples[name].append(timed(action))
    report(samples, args.rounds)


def report(samples: dict[str, list[float]], rounds: int) -> None:
    """Print median (and min, for the noise) of each, and LocalBackend's ratio to each."""
    medians = {name: statistics.median(values) for name, values in samples.items()}
    ours = medians["LocalBackend, 16 x true"]
    mode = "session" if has_controlling_tty() else "process group"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"median of {rounds} rounds, {INSTANCES} processes each (load average {load:.1f})")
    print(f"LocalBackend here gives each child a {mode} of its own")
    for name, value in medians.items():
        ratio = "" if value is ours else f"   LocalBackend / this = {ours / value:.2f}x"
        low = min(samples[name]) * 1000
        print(f"  {name:<24} {value * 1000:7.1f} ms (min {low:5.1f}){ratio}")


if __name__ == "__main__":
    main()
