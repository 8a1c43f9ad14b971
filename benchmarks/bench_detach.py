"""Detached jobs on 16 real test hosts (ssh backend), each figure beside its yardstick, in one
run (median of N, interleaved round by round so both see the same load):

- ``launch --detach`` until it returns (every instance running, the supervisor on the first
  host) against an attached ``launch`` until every instance has printed its first line (the
  attached launch's "all instances running"). Target (issue 14): at most 1.3x.
- ``jobs`` and ``logs ID`` with a 16-host job running, each a new process over a fresh
  connection. Target: under 1 s each.
- ``stop ID`` of that job (every instance TERMed on every host, the supervisor gone), for the
  record.

The attached launch runs ``sh -c 'echo up; exec sleep 60'`` and is stopped with SIGINT once the
16th ``up`` arrives; the detached one runs the same program and is stopped with ``stop``.
Creates a 16-host test cluster (network namespaces + sshd; needs root), destroys it at the end.

Usage:

    python benchmarks/bench_detach.py [--hosts 16] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_launch_hosts import write_spec  # noqa: E402
from installed import compile_package, console_script  # noqa: E402

from poprun_py.providers.netns import create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

PROGRAM = ["sh", "-c", "echo up; exec sleep 60"]


def launch_args(spec: Path, hosts: int) -> list[str]:
    n = str(hosts)
    return [*console_script(), "launch", "-c", str(spec), "-b", "ssh", "-n", n, "-r", n]


def attached(spec: Path, hosts: int, env: dict[str, str]) -> float:
    """Seconds until every instance of an attached launch has printed its first line."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*launch_args(spec, hosts), "--", *PROGRAM],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    ups = 0
    for line in proc.stdout:
        ups += line.rstrip().endswith("] up")
        if ups == hosts:
            break
    elapsed = time.perf_counter() - start
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    if ups < hosts:
        raise SystemExit(f"the attached launch ended with {ups} of {hosts} instances up")
    return elapsed


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[1:3]} failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
    return elapsed, proc.stdout


def detached_round(spec: Path, hosts: int, env: dict[str, str]) -> dict[str, float]:
    """One detached job: its launch, then jobs, logs and stop while it runs."""
    took: dict[str, float] = {}
    took["launch --detach"], out = run([*launch_args(spec, hosts), "--detach", "--", *PROGRAM], env)
    job = out.splitlines()[-1]
    took["jobs"], listing = run([*console_script(), "jobs"], env)
    assert "running" in listing, listing
    took["logs ID"], logs = run([*console_script(), "logs", job], env)
    assert logs.count("] up") == hosts, logs
    took["stop ID"], _ = run([*console_script(), "stop", job], env)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    compile_package()
    name = f"bd{session_tag()}"
    work = Path(tempfile.mkdtemp(prefix="bench-detach-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(work / "state")}
    cluster = create_cluster(name, args.hosts)
    try:
        spec = write_spec(cluster, work / "cluster.yaml")
        figures: dict[str, list[float]] = {"attached: all running": []}
        detached_round(spec, args.hosts, env)  # warm-up: caches, first connections
        for _ in range(args.runs):
            figures["attached: all running"].append(attached(spec, args.hosts, env))
            for label, seconds in detached_round(spec, args.hosts, env).items():
                figures.setdefault(label, []).append(seconds)
    finally:
        destroy_cluster(name)
    medians = {label: statistics.median(values) for label, values in figures.items()}
    base = medians["attached: all running"]
    print(f"{args.hosts} hosts, ssh backend, median of {args.runs} (load {os.getloadavg()[0]:.1f})")
    for label, value in medians.items():
        note = ""
        if label == "launch --detach":
            note = f"  {value / base:.2f}x the attached launch (target <= 1.3x)"
        elif label in ("jobs", "logs ID"):
            note = "  (target < 1 s)"
        print(f"  {label:24s} {value:6.3f} s{note}")


if __name__ == "__main__":
    main()
