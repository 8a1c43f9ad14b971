"""Start-up cost of the command line: ``poprun-py --help`` and ``poprun-py launch --dry-run`` for
a 16-host cluster, beside the peers' ``--help`` (torchrun, deepspeed, horovodrun) when they are
installed here; otherwise the figures measured on a machine that has them (REFERENCE) are printed.

Targets: ``--help`` within 0.15 s median (issue 2); ``launch --dry-run`` of 16 hosts within
0.25 s median (issue 3).

poprun-py runs as installed and byte-compiled (:mod:`installed`).

Usage:

    python benchmarks/bench_cli.py [--runs 11]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from installed import compile_package, console_script

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = {"torchrun": 1.46, "deepspeed": 1.85, "horovodrun": 0.17}


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peer(name: str) -> list[str] | None:
    path = shutil.which(name)
    if path is None:
        return None
    real = Path(sys.executable).parent / name  # skip pyenv shims when possible
    return [str(real) if real.exists() else path, "--help"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    base = console_script()
    compile_package()
    rows = [
        ("poprun-py --help", median_seconds([*base, "--help"], args.runs), "target 0.15 s"),
        (
            "poprun-py launch --dry-run (16 hosts)",
            median_seconds(
                [*base, "launch", "-c", "clusters/pod16.yaml", "--dry-run", "python", "train.py"],
                args.runs,
            ),
            "target 0.25 s",
        ),
    ]
    for name, reference in REFERENCE.items():
        argv = peer(name)
        if argv is None:
            rows.append((f"{name} --help", reference, "reference figure; not installed here"))
        else:
            rows.append((f"{name} --help", median_seconds(argv, args.runs), "measured"))
    print(f"median of {args.runs} runs, {os.cpu_count()} CPUs")
    for label, seconds, note in rows:
        print(f"{label:<42} {seconds:6.3f} s   {note}")


if __name__ == "__main__":
    main()
