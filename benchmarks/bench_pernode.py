"""Per-node mode's start-up on 16 real test hosts (issue 23, item 5), beside the ssh backend's
launch of the same job, interleaved round by round so both see the same machine load:

- per-node: every host (a network namespace) runs ``poprun-py launch --node-rank K --nnodes 16
  --coordinator HOST0:PORT ...`` itself, as a pod would; timed from the moment the last node's
  launcher was started to the moment the last instance runs;
- ssh: one ``poprun-py launch --backend ssh`` (connect, preflight through the agents, start),
  timed from its start to the moment the last instance runs.

Each instance writes the wall-clock time it started (``date +%s.%N``: one clock, one machine)
into a file of its own; "all running" is the latest of them. Target: per-node within 1.2x of
ssh. On this machine every node shares the same few cores, so the 16 per-node launchers (16
interpreters making the same plan) compete for them, which a real cluster's nodes do not.

Creates a 16-host test cluster (network namespaces + sshd, which only the ssh launch uses; needs
root) and destroys it at the end.

Usage:

    python benchmarks/bench_pernode.py [--hosts 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
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

from poprun_py.providers.netns import TestCluster, create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

PORT = 29431
JOIN = "60s"


def program(marks: Path) -> list[str]:
    """Each instance notes when it started, in a file of its own."""
    return ["sh", "-c", f'date +%s.%N > {marks}/"$RANK"']


def all_running(marks: Path, count: int, within: float = 120.0) -> float:
    """The wall-clock time the last of ``count`` instances started."""
    deadline = time.monotonic() + within
    while len(list(marks.iterdir())) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(list(marks.iterdir()))} of {count} instances started")
        time.sleep(0.05)
    time.sleep(0.05)  # the last writer finishes its line
    return max(float(path.read_text() or "0") for path in marks.iterdir())


def fresh(work: Path, label: str) -> Path:
    marks = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=work))
    return marks


def ssh_launch(cluster: TestCluster, spec: Path, work: Path) -> float:
    marks = fresh(work, "ssh")
    argv = [*console_script(), "launch", "-c", str(spec), "--no-numa-aware", "--backend", "ssh"]
    start = time.time()
    proc = subprocess.run(
        [*argv, "--", *program(marks)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"ssh launch failed ({proc.returncode}): {proc.stderr[-800:]}")
    return all_running(marks, len(cluster.hosts)) - start


def pernode_launch(cluster: TestCluster, secret: Path, work: Path) -> float:
    marks = fresh(work, "pernode")
    names = ",".join(h.name for h in cluster.hosts)
    coordinator = f"{cluster.hosts[0].address}:{PORT}"
    common = [
        *("--nnodes", str(len(cluster.hosts)), "--coordinator", coordinator),
        *("--secret-file", str(secret), "--hosts", names, "--no-numa-aware"),
        *("--join-timeout", JOIN),
    ]
    nodes = []
    for rank, host in enumerate(cluster.hosts):
        argv = [
            *("ip", "netns", "exec", host.netns),
            *console_script(),
            *("launch", "--node-rank", str(rank), *common, "--", *program(marks)),
        ]
        nodes.append(
            subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
            )
        )
    last_start = time.time()
    for node in nodes:
        _, err = node.communicate(timeout=180)
        if node.returncode != 0:
            raise SystemExit(f"a per-node launcher failed ({node.returncode}): {err[-800:]}")
    return all_running(marks, len(cluster.hosts)) - last_start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    compile_package()
    name = f"bench-pernode-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"kp{session_tag()}")
    work = Path(tempfile.mkdtemp(prefix="bench-pernode-"))
    try:
        spec = write_spec(cluster, work / "cluster.yaml")
        secret = work / "secret"
        secret.write_text(os.urandom(24).hex() + "\n")
        secret.chmod(0o600)
        ssh_launch(cluster, spec, work)  # warm caches, check both work
        pernode_launch(cluster, secret, work)
        times: dict[str, list[float]] = {"ssh": [], "per-node": []}
        for _ in range(args.runs):
            times["ssh"].append(ssh_launch(cluster, spec, work))
            times["per-node"].append(pernode_launch(cluster, secret, work))
        report(times, args.hosts, args.runs)
    finally:
        destroy_cluster(name)
        shutil.rmtree(work, ignore_errors=True)


def report(times: dict[str, list[float]], hosts: int, runs: int) -> None:
    med = {label: statistics.median(values) for label, values in times.items()}
    print(f"until every instance runs, {hosts} test hosts, median of {runs}:")
    labels = {
        "ssh": "launch --backend ssh (from its start)",
        "per-node": "per-node (from the last node's start)",
    }
    for label, value in med.items():
        spread = f"{min(times[label]):.2f}-{max(times[label]):.2f}"
        print(f"  {labels[label]:<40} {value:6.2f} s  ({spread})")
    print(f"  per-node / ssh: {med['per-node'] / med['ssh']:.2f}x  (target <= 1.2x)")


if __name__ == "__main__":
    main()
