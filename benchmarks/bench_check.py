"""``poprun-py check`` on 16 real test hosts with a data network (issue 15: within 3 s), beside
``poprun-py launch --backend ssh true`` on the same hosts (connect, preflight, start, wait: the
floor any check through the launcher pays) and OpenSSH's own ``ssh HOST true`` to every host at
once (the peer: the 16 logins alone, nothing run), interleaved round by round, median of N runs,
the median of the per-round differences, whether the target is met, and the load averages. Then
what hardware discovery adds to preflight on those hosts: the check script through the hosts'
running agents (the session preflight already has), with and without discovery, and with
``--network``'s addresses, interleaved, median per round trip over every host in parallel.

Creates a 16-host test cluster with a data network (network namespaces + sshd; needs root) and
destroys it at the end.

Usage:

    python benchmarks/bench_check.py [--hosts 16] [--runs 7]
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
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_launch_hosts import write_spec  # noqa: E402
from installed import compile_package, console_script  # noqa: E402

from poprun_py.providers.netns import TestCluster, create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

PLAIN = "poprun-py launch --backend ssh true"
CHECK = "poprun-py check --network DATA"
LOGINS = "OpenSSH: ssh HOST true, every host at once"
TARGET = 3.0  # seconds, issue 15


def load() -> str:
    """The load averages (1, 5, 15 min): the machine is shared."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"{argv[1:3]} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-900:]}"
        )
    return elapsed


def logins(cluster: TestCluster) -> float:
    """Seconds for OpenSSH's ``ssh HOST true`` to every host at once (the hosts' login shells)."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["ssh", "-F", str(cluster.ssh_config), host.address, "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for host in cluster.hosts
    ]
    failed = [p.args[-2] for p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"ssh failed on {failed}")
    return time.perf_counter() - start


def discovery_cost(cluster: TestCluster, spec: Path, runs: int) -> dict[str, float]:
    """Median seconds of the check script on every host at once, through the agents."""
    from poprun_py.agent.client import AgentPool
    from poprun_py.launch import launcher
    from poprun_py.preflight.probes import checks_argv, checks_for_plan
    from poprun_py.prepare.job import LaunchOptions, prepare
    from poprun_py.ssh.pool import ConnectionPool

    opts = LaunchOptions(program=(sys.executable, "-c", "pass"), cluster=str(spec), backend="ssh")
    prep = prepare(opts)
    base = checks_for_plan(prep.plan)
    cases = {
        "without discovery": replace(base, hardware=False),
        "with discovery": base,
        "with discovery and addresses (--network)": replace(base, network=cluster.data_subnet),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    settings = launcher.ssh_settings(prep)
    with ConnectionPool(list(prep.plan.cluster.hosts), settings) as pool:
        agents = AgentPool(pool)
        try:
            agents.each(lambda a: a.run(["true"]), connect=True)  # agents up
            for _ in range(runs * 3):
                for name, checks in cases.items():
                    t0 = time.perf_counter()
                    agents.each(lambda a, c=checks: a.run(checks_argv(c, False)))
                    times[name].append(time.perf_counter() - t0)
        finally:
            agents.close()
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    compile_package()
    name = f"bench-check-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"kk{session_tag()}", data_network=True)
    work = Path(tempfile.mkdtemp(prefix="bench-check-"))
    try:
        spec = write_spec(cluster, work / "cluster.yaml")
        common = ["-c", str(spec), "--backend", "ssh"]
        cmds = {
            PLAIN: [*console_script(), "launch", *common, "true"],
            CHECK: [
                *console_script(), "check", *common, "--network", str(cluster.data_subnet),
            ],
        }  # fmt: skip
        started_at = load()
        for argv in cmds.values():
            timed(argv)  # warm caches, check it works
        times: dict[str, list[float]] = {label: [] for label in [*cmds, LOGINS]}
        for _ in range(args.runs):
            for label, argv in cmds.items():
                times[label].append(timed(argv))
            times[LOGINS].append(logins(cluster))
        print(
            f"{args.hosts} test hosts, median of {args.runs} runs, interleaved (load {started_at})"
        )
        for label, values in times.items():
            spread = f"(min {min(values):.2f}, max {max(values):.2f})"
            print(f"  {label:<44} {statistics.median(values):6.2f} s  {spread}")
        check, plain = times[CHECK], times[PLAIN]
        extra = statistics.median(c - p for c, p in zip(check, plain, strict=True))
        verdict = "met" if statistics.median(check) <= TARGET else "not met"
        print(f"  check beyond the plain launch, median per round: +{extra:.2f} s")
        print(f"  issue 15 (check on 16 hosts within {TARGET:g} s): {verdict}; load now {load()}")
        print(f"the check script on all {args.hosts} hosts at once, through their agents:")
        costs = discovery_cost(cluster, spec, args.runs)
        floor = costs["without discovery"]
        for label, value in costs.items():
            extra = f"  (+{(value - floor) * 1000:.1f} ms)" if value != floor else ""
            print(f"  {label:<44} {value * 1000:7.1f} ms{extra}")
    finally:
        destroy_cluster(name)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
