"""Fan-out on fresh connections: ``poprun-py exec -- true`` on 16 real test hosts, beside pdsh,
clush and a Fabric ThreadingGroup, all in one run, over both of poprun-py's transports
(Paramiko, and OpenSSH's client with ``--ssh-client openssh``); median of N rounds, the tools
interleaved so they see the same machine load. Then a breakdown of where poprun-py's time goes.

Creates a 16-host test cluster (network namespaces + sshd; needs root) and destroys it at the end.
Every tool reaches the hosts with the cluster's key and known_hosts through its ssh_config
(pdsh via ``PDSH_SSH_ARGS``, clush via ``-o '-F cfg'``, Fabric via ``runtime_ssh_path``).

Target (issue 4): poprun-py no slower than the fastest peer, aiming for 0.8x.

Usage:

    python benchmarks/bench_fanout.py [--hosts 16] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from installed import compile_package, console_script  # noqa: E402

from poprun_py.core.spec import HostSpec  # noqa: E402
from poprun_py.providers.netns import TestCluster, create_cluster, destroy_cluster  # noqa: E402
from poprun_py.ssh.pool import ConnectionPool  # noqa: E402
from poprun_py.ssh.settings import SshSettings  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

FABRIC = (
    "import sys\n"
    "from fabric import Config, ThreadingGroup\n"
    "group = ThreadingGroup(*sys.argv[2:], config=Config(runtime_ssh_path=sys.argv[1]))\n"
    "group.run('true', hide=True)\n"
)


def bin_path(name: str) -> str | None:
    """The tool itself, not a pyenv shim (a shim adds ~0.1 s of bash per call)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def commands(cluster: TestCluster) -> dict[str, tuple[list[str], dict[str, str]]]:
    cfg = str(cluster.ssh_config)
    prefix = cluster.hosts[0].name[:-1]
    expr = f"{prefix}[1-{len(cluster.hosts)}]"
    names = list(cluster.host_names)
    env = dict(os.environ)
    argv = [*console_script(), "exec", "-H", expr, "--ssh-config", cfg, "--", "true"]
    cmds = {
        "poprun-py exec": (argv, env),
        # OpenSSH's client as the transport: one ssh process (and connection) per host
        "poprun-py (openssh)": ([*argv[:-2], "--ssh-client", "openssh", *argv[-2:]], env),
        # the same without asking OpenSSH (ssh -G) for each host's configuration
        "poprun-py (fallback cfg)": (argv, {**env, "POPRUN_SSH_RESOLVER": "paramiko"}),
    }
    if shutil.which("pdsh"):
        pdsh_env = {**env, "PDSH_SSH_ARGS": f"-F {cfg} -x -l%u %h"}
        cmds["pdsh -R ssh"] = (["pdsh", "-R", "ssh", "-f", "64", "-w", expr, "true"], pdsh_env)
    clush = bin_path("clush")
    if clush:
        cmds["clush"] = ([clush, "-f", "64", "-w", expr, "-o", f"-F {cfg}", "true"], env)
    cmds["fabric ThreadingGroup"] = ([sys.executable, "-c", FABRIC, cfg, *names], env)
    return cmds


def timed(argv: list[str], env: dict[str, str]) -> float:
    return timed_cpu(argv, env)[0]


def timed_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and CPU seconds of the tool and every process it started (ssh...)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu


def breakdown(cluster: TestCluster, runs: int) -> list[tuple[str, float]]:
    """Where poprun-py's time goes: start-up, opening connections, running the command."""
    startup = statistics.median(
        timed([sys.executable, "-c", "import poprun_py.cli.remote_cmd, paramiko"], dict(os.environ))
        for _ in range(runs)
    )
    hosts = [HostSpec(h.name) for h in cluster.hosts]
    opens, fans, singles, resolves, per_host = [], [], [], [], []
    kind = "?"
    for _ in range(runs):
        with ConnectionPool(hosts, SshSettings(ssh_config=cluster.ssh_config)) as pool:
            r0 = time.perf_counter()
            pool.resolve_all()  # every host's ssh configuration, in parallel (ssh -G)
            resolves.append(time.perf_counter() - r0)
            per_host.append(statistics.median(pool.resolve_seconds.values()))
            kind = pool.resolver_kind
            t0 = time.perf_counter()
            pool.open_all()
            t1 = time.perf_counter()
            pool.each(lambda c: c.run(["true"]))
            t2 = time.perf_counter()
            conn = pool.connections[hosts[0].name]
            t3 = time.perf_counter()
            conn.run(["true"])
            singles.append(time.perf_counter() - t3)
            opens.append(t1 - t0)
            fans.append(t2 - t1)
    rc = statistics.median(
        timed(["bash", "-c", ". ~/.bashrc"], dict(os.environ)) for _ in range(runs)
    )
    n = len(hosts)
    return [
        ("python start-up + imports (paramiko, CLI)", startup),
        (
            f"resolve {n} hosts' ssh configuration in parallel ({kind})",
            statistics.median(resolves),
        ),
        ("  of which one host (median)", statistics.median(per_host)),
        (f"open {n} connections in parallel (TCP, kex, host key, auth)", statistics.median(opens)),
        (f"run `true` on {n} open connections", statistics.median(fans)),
        ("run `true` on one open connection (session + login shell)", statistics.median(singles)),
        ("of which the login shell's ~/.bashrc here (bash -c '. ~/.bashrc')", rc),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    compile_package()
    name = f"bench-fanout-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"sf{session_tag()}")
    try:
        cmds = commands(cluster)
        for argv, env in cmds.values():  # warm caches, check every tool works
            timed(argv, env)
        times: dict[str, list[float]] = {label: [] for label in cmds}
        cpus: dict[str, list[float]] = {label: [] for label in cmds}
        for _ in range(args.runs):
            for label, (argv, env) in cmds.items():
                wall, cpu = timed_cpu(argv, env)
                times[label].append(wall)
                cpus[label].append(cpu)
        medians = {label: statistics.median(values) for label, values in times.items()}
        peers = [v for k, v in medians.items() if not k.startswith("poprun")]
        fastest = min(peers) if peers else float("nan")
        print(f"`true` on {args.hosts} test hosts, fresh connections, median of {args.runs}:")
        for label, value in medians.items():
            spread = f"{min(times[label]):.2f}-{max(times[label]):.2f}"
            cpu = statistics.median(cpus[label])
            print(
                f"  {label:<24} {value:6.2f} s  ({spread})  {value / fastest:.2f}x fastest peer"
                f"   local CPU {cpu:5.2f} s ({1000 * cpu / args.hosts:5.1f} ms/host)"
            )
        print("  target: poprun-py <= 1.0x the fastest peer, aim 0.8x")
        print("  (local CPU: the tool and its children, e.g. pdsh's ssh processes; the hosts'")
        print("   sshd + login shells are the same work for every tool)")
        print(f"  load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("breakdown of poprun-py (in-process, median):")
        for label, value in breakdown(cluster, args.runs):
            print(f"  {label:<66} {value:6.3f} s")
    finally:
        destroy_cluster(name)


if __name__ == "__main__":
    main()
