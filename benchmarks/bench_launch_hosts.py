"""Whole launches on 16 real test hosts, each beside its yardstick, all in one run (median of N):

- ``poprun-py launch --backend ssh true`` (connect, preflight, start, wait) against one fresh
  ``poprun-py exec -- true`` fan-out. Target (issue 4): at most 1.3x.
- ``poprun-py launch --backend mpirun true`` against the same ``mpirun`` command run by hand
  (rendered by poprun-py, hostfile written, run with the same environment), Open MPI starting its
  daemons with its own ssh. Target: at most 1.1x. poprun-py's launch opens one connection per
  host and one agent session on it, which runs preflight, writes the job's files and then starts
  Open MPI's daemon (``orted``) for mpirun's remote-shell agent
(``poprun_py/hostside/rsh_shim.py``):
  one login session per host, as by hand, where mpirun's ssh opens one per host.

The commands are interleaved round by round, so they see the same machine load. Then a
breakdown of the ssh launch, in process: connections, preflight, the backend's run -- once with
preflight on the plain connections (a login session per host for the checks, then another for
the agents) and once with preflight run by the agents (``AgentPool``: one login session per
host for the whole launch). What bounds both: a login session costs far more than the work
(here root's ~/.bashrc runs ``pyenv init``, ~0.2 s of CPU per session, 16 of them on 2 cores).

Creates a 16-host test cluster (network namespaces + sshd; needs root) and destroys it at the
end. Every command reaches the hosts through the cluster's ssh_config and known_hosts, named in
a cluster spec file (``ssh: {ssh_config, known_hosts}``); Open MPI's own ssh (by hand) gets the
same config through ``--mca plm_rsh_agent ssh --mca plm_rsh_args "-F <ssh_config>"``.

Usage:

    python benchmarks/bench_launch_hosts.py [--hosts 16] [--runs 11]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from installed import compile_package, console_script  # noqa: E402

from poprun_py.providers.netns import TestCluster, create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

Command = tuple[list[str], dict[str, str]]


def write_spec(cluster: TestCluster, path: Path) -> Path:
    """A cluster spec naming every host by address and the cluster's ssh files."""
    lines = [f"name: {cluster.name}", "hosts:"]
    for host in cluster.hosts:
        lines += [f"  - name: {host.name}", f"    address: {host.address}", "    user: root"]
    lines += [
        "ssh:",
        f"  ssh_config: {cluster.ssh_config}",
        f"  known_hosts: {cluster.known_hosts}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def rsh_args(cluster: TestCluster) -> str:
    """--mpi-args for Open MPI's own ssh launch of orted: the cluster's ssh config."""
    return shlex.join(["--mca", "plm_rsh_args", f"-F {cluster.ssh_config}"])


def commands(cluster: TestCluster, spec: Path, work: Path) -> dict[str, Command]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [*console_script(), "launch", "-c", str(spec), "--no-numa-aware"]
    return {
        "poprun-py exec -- true": ([*console_script(), "exec", "-c", str(spec), "--", "true"], env),
        "poprun-py launch --backend ssh": ([*base, "--backend", "ssh", "true"], env),
        "poprun-py launch --backend mpirun": (
            [*base, "--backend", "mpirun", "--mpi-args", rsh_args(cluster), "true"],
            env,
        ),
        "mpirun by hand": by_hand(cluster, spec, work / "by-hand", env),
    }


def by_hand(cluster: TestCluster, spec: Path, job_dir: Path, env: dict[str, str]) -> Command:
    """The mpirun command poprun-py renders for this launch, with its files written."""
    from poprun_py.launch import launcher
    from poprun_py.prepare.job import LaunchOptions, prepare
    from poprun_py.process.output import write_job_files

    opts = LaunchOptions(
        program=("true",),
        cluster=str(spec),
        backend="mpirun",
        numa_aware=False,
        mpi_args=f"--mca plm_rsh_agent ssh {rsh_args(cluster)}",  # Open MPI's own ssh
    )
    job = launcher.render(prepare(opts), str(job_dir), {})
    write_job_files(job)
    return list(job.launcher), {**env, **job.launcher_env}


def timed(label: str, command: Command) -> float:
    argv, env = command
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        raise SystemExit(f"{label} failed ({proc.returncode}): {tail}")
    return elapsed


def breakdown(spec: Path, runs: int) -> list[tuple[str, float]]:
    """Where an ssh launch's time goes, measured in process (no interpreter start-up): the
    launch with preflight on plain connections (a login session per host for the checks, then
    one for the agent) and with preflight run by the agents (one login session per host)."""
    from poprun_py.agent.client import AgentPool
    from poprun_py.backends.ssh import SshBackend
    from poprun_py.core.result import RunOptions
    from poprun_py.launch import launcher
    from poprun_py.preflight.probes import preflight
    from poprun_py.prepare.job import LaunchOptions, prepare
    from poprun_py.ssh.pool import ConnectionPool

    opts = LaunchOptions(program=("true",), cluster=str(spec), backend="ssh", numa_aware=False)
    keys = ("connect", "exec", "pre-pool", "run-pool", "pre-agents", "run-agents")
    parts: dict[str, list[float]] = {key: [] for key in keys}
    quiet = RunOptions(sink=lambda i, s, line: None)
    for _ in range(runs):
        prep = prepare(opts)
        settings = launcher.ssh_settings(prep)
        for agents in (False, True):
            with ConnectionPool(list(prep.plan.cluster.hosts), settings) as pool:
                t0 = time.perf_counter()
                pool.open_all()
                t1 = time.perf_counter()
                runner = AgentPool(pool) if agents else pool
                report = preflight(runner, prep.plan)  # type: ignore[arg-type]
                t2 = time.perf_counter()
                backend = (
                    SshBackend(runner) if isinstance(runner, AgentPool) else SshBackend.over(pool)
                )
                job = launcher.render(
                    prep, tempfile.mkdtemp(prefix="bench-job-"), report.topologies
                )
                assert backend.run(job, quiet).ok
                t3 = time.perf_counter()
                if not agents:
                    pool.each(lambda conn: conn.run(["true"]))
                    parts["connect"].append(t1 - t0)
                    parts["exec"].append(time.perf_counter() - t3)
            tag = "agents" if agents else "pool"
            parts[f"pre-{tag}"].append(t2 - t1)
            parts[f"run-{tag}"].append(t3 - t2)
    n = len(prep.plan.hosts)
    labels = {
        "connect": f"open {n} connections (TCP, kex, host key, auth)",
        "exec": f"`true` on the {n} open connections (one login session each)",
        "pre-pool": "preflight on the connections (a login session per host)",
        "run-pool": "then the ssh backend (agents: another login session per host)",
        "pre-agents": "preflight through AgentPool (starts the agents)",
        "run-agents": "then the ssh backend on the same agents",
    }
    return [(labels[k], statistics.median(v)) for k, v in parts.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=11)  # fewer: the medians wander ±5%
    args = parser.parse_args()
    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found (Debian: openmpi-bin)")
    compile_package()
    name = f"bench-launch-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"kc{session_tag()}")
    work = Path(tempfile.mkdtemp(prefix="bench-launch-hosts-"))
    try:
        spec = write_spec(cluster, work / "cluster.yaml")
        cmds = commands(cluster, spec, work)
        for label, command in cmds.items():  # warm caches, check every command works
            timed(label, command)
        times: dict[str, list[float]] = {label: [] for label in cmds}
        for _ in range(args.runs):
            for label, command in cmds.items():
                times[label].append(timed(label, command))
        report(times, args.hosts, args.runs)
        print("breakdown of an ssh launch (in process, median):")
        parts = breakdown(spec, args.runs)
        for label, value in parts:
            print(f"  {label:<66} {value:6.3f} s")
        connect, fan, pre_pool, run_pool, pre_agents, run_agents = (v for _, v in parts)
        plain = (connect + pre_pool + run_pool) / (connect + fan)
        merged = (connect + pre_agents + run_agents) / (connect + fan)
        print(f"  in process, launch / fan-out: {plain:.2f}x with preflight on the connections,")
        print(f"  {merged:.2f}x with preflight through the agents (one login session per host)")
    finally:
        destroy_cluster(name)
        shutil.rmtree(work, ignore_errors=True)


def report(times: dict[str, list[float]], hosts: int, runs: int) -> None:
    med = {label: statistics.median(values) for label, values in times.items()}
    print(f"whole launches of `true` on {hosts} test hosts, fresh connections, median of {runs}:")
    for label, value in med.items():
        spread = f"{min(times[label]):.2f}-{max(times[label]):.2f}"
        print(f"  {label:<36} {value:6.2f} s  ({spread})")
    ssh_ratio = med["poprun-py launch --backend ssh"] / med["poprun-py exec -- true"]
    mpi_ratio = med["poprun-py launch --backend mpirun"] / med["mpirun by hand"]
    print(f"  launch --backend ssh / exec fan-out:     {ssh_ratio:.2f}x  (target <= 1.3x)")
    print(f"  launch --backend mpirun / mpirun by hand: {mpi_ratio:.2f}x  (target <= 1.1x)")


if __name__ == "__main__":
    main()
