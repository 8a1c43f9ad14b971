"""Planning at scale: 4096 hosts x 8 instances x 8 replicas with 10k, 100k and 1M input files
(synthetic manifests with sizes). Prints wall time and peak memory of the whole
``poprun-py plan`` command, median of N runs, plus the in-process planning time.

Target (issue 2): 1M files within 2 s and 500 MB peak.

Usage:

    python benchmarks/bench_plan.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HOSTS = "node[0001-4096]"
INSTANCES = 4096 * 8
REPLICAS = INSTANCES * 8


def write_manifest(path: str, n: int) -> None:
    rng = random.Random(n)
    with open(path, "w") as out:
        for i in range(n):
            out.write(f"/data/imagenet/train-{i:07d}.tfrecord {rng.randint(50_000, 150_000_000)}\n")


def run_cli(manifest: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one ``python -m poprun_py plan`` process."""
    argv = [
        "/usr/bin/time",
        "-f",
        "BENCH %e %M",
        sys.executable,
        "-m",
        "poprun_py",
        "plan",
        "-H",
        HOSTS,
        "-b",
        "ssh",
        "-n",
        str(INSTANCES),
        "-r",
        str(REPLICAS),
        "-i",
        f"@{manifest}",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("BENCH"))
    _, wall, kib = line.split()
    return float(wall), float(kib) / 1024


def in_process(manifest: str) -> float:
    from poprun_py.prepare.job import LaunchOptions, prepare

    opts = LaunchOptions(
        program=("train.py",),
        hosts=HOSTS,
        backend="ssh",
        instances=INSTANCES,
        replicas=REPLICAS,
        inputs=(f"@{manifest}",),
    )
    start = time.perf_counter()
    prepare(opts)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(
        f"plan: {HOSTS} ({4096} hosts), {INSTANCES} instances, {REPLICAS} replicas; "
        f"median of {args.runs}"
    )
    print(f"{'files':>9}  {'plan (in-process)':>18}  {'poprun-py plan':>15}  {'peak RSS':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (10_000, 100_000, 1_000_000):
            manifest = os.path.join(tmp, f"m{n}.txt")
            write_manifest(manifest, n)
            inner = statistics.median(in_process(manifest) for _ in range(args.runs))
            runs = [run_cli(manifest) for _ in range(args.runs)]
            wall = statistics.median(r[0] for r in runs)
            peak = max(r[1] for r in runs)
            print(f"{n:>9}  {inner:>17.2f}s  {wall:>14.2f}s  {peak:>7.0f}MB")
    print("targets: 1M files within 2 s and 500 MB peak")


if __name__ == "__main__":
    main()
