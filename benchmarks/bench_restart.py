"""What a whole-job restart costs on 16 real test hosts (ssh backend), beside a fresh launch's
time, in one run (median of N), in process through :func:`poprun_py.launch.launcher.launch`:

- fresh launch → all instances running: from the call to the moment every instance's first
  line (``up 0``) has arrived (connect, preflight, agents, start);
- restart → all instances running again: attempt 0's instance 0 fails (exit 3) while the others
  run; from its failing line to every instance's ``up 1`` of attempt 1 (stop attempt 0
  everywhere, new agents on the same connections, start). Target (issue 13): at most 1.2x.

Creates a 16-host test cluster (network namespaces + sshd; needs root) and destroys it at the
end.

Usage:

    python benchmarks/bench_restart.py [--hosts 16] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_launch_hosts import write_spec  # noqa: E402

from poprun_py.core.result import RunSettings  # noqa: E402
from poprun_py.launch.launcher import launch  # noqa: E402
from poprun_py.prepare.job import LaunchOptions, prepare  # noqa: E402
from poprun_py.providers.netns import create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

SCRIPT = (
    'echo "up $POPRUN_RESTART_COUNT"; '
    '[ "$POPRUN_RESTART_COUNT" = 1 ] && exit 0; '
    '[ "$RANK" = 0 ] && { sleep 1; echo failing; exit 3; }; exec sleep 30'
)


def one_run(spec: Path, hosts: int) -> tuple[float, float]:
    """(fresh launch → all up, restart → all up again), in seconds."""
    seen: dict[str, float] = {}
    ups: dict[str, set[int]] = {"up 0": set(), "up 1": set()}

    def sink(index: int, stream: str, line: str) -> None:
        now = time.monotonic()
        if line in ups:
            ups[line].add(index)
            if len(ups[line]) == hosts:
                seen[line] = now
        elif line == "failing":
            seen["failing"] = now

    opts = LaunchOptions(
        cluster=str(spec),
        backend="ssh",
        numa_aware=False,
        max_restarts=1,
        grace_period=2,
        program=("sh", "-c", SCRIPT),
    )
    start = time.monotonic()
    result = launch(prepare(opts), RunSettings(sink=sink))
    assert result.ok and len(result.attempts) == 1, result
    return seen["up 0"] - start, seen["up 1"] - seen["failing"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    name = f"bench-restart-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"kr{session_tag()}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-restart-") as work:
            spec = write_spec(cluster, Path(work) / "cluster.yaml")
            one_run(spec, args.hosts)  # warm caches, check it works
            runs = [one_run(spec, args.hosts) for _ in range(args.runs)]
        fresh = statistics.median(r[0] for r in runs)
        again = statistics.median(r[1] for r in runs)
        print(f"{args.hosts} hosts, ssh backend, median of {args.runs}:")
        print(f"  fresh launch -> all instances running        {fresh:6.3f} s")
        print(f"  restart -> all instances running again       {again:6.3f} s")
        print(f"  restart / fresh launch: {again / fresh:.2f}x (target: at most 1.2x)")
    finally:
        destroy_cluster(name)


if __name__ == "__main__":
    main()
