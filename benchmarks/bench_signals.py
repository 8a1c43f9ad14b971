"""How fast SIGUSR1 and SIGUSR2 sent to poprun-py reach every instance on real test hosts,
beside Open MPI's ``mpirun`` run by hand (which forwards both itself), in one run (median of N):

- ``poprun-py launch --backend ssh|mpirun|mpiexec``: every instance runs a program that blocks
  both signals, prints ``ready``, takes them as they come (``sigtimedwait``: no polling) and
  prints ``got usr1 usr2`` once both came. From
  the moment both are sent to poprun-py (after every ``ready``) to the last ``got`` line.
  Under mpiexec both go past hydra (which dies of SIGUSR2): to each rank's process group, by
  the host's agent.
- ``mpirun by hand``: the command poprun-py renders for ``--backend mpirun``, Open MPI starting
  its daemons with its own ssh, signalled directly.

Creates a test cluster (network namespaces + sshd; needs root) and destroys it at the end.

Usage:

    python benchmarks/bench_signals.py [--hosts 4] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_launch_hosts import rsh_args, write_spec  # noqa: E402
from installed import compile_package, console_script  # noqa: E402

from poprun_py.providers.netns import TestCluster, create_cluster, destroy_cluster  # noqa: E402
from tests.hostfixtures import session_tag  # noqa: E402

WAIT = """
import signal, sys
want = {signal.SIGUSR1, signal.SIGUSR2}
signal.pthread_sigmask(signal.SIG_BLOCK, want)  # taken below, as they come: no polling
print("ready", flush=True)
got = set()
while got != want:
    info = signal.sigtimedwait(want, 60)
    if info is None:
        sys.exit(5)
    got.add(info.si_signo)
print("got usr1 usr2", flush=True)
"""

Command = tuple[list[str], dict[str, str]]


def commands(cluster: TestCluster, spec: Path, program: Path, work: Path) -> dict[str, Command]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    hosts = str(len(cluster.hosts))
    base = [*console_script(), "launch", "-c", str(spec), "--no-numa-aware", "-r", hosts]
    job = (sys.executable, str(program))
    cmds = {
        f"poprun-py launch -b {backend}": ([*base, "-n", hosts, "-b", backend, "--", *job], env)
        for backend in ("ssh", "mpirun", "mpiexec")
    }
    cmds["mpirun by hand"] = by_hand(cluster, spec, job, work / "by-hand", env)
    return cmds


def by_hand(
    cluster: TestCluster, spec: Path, job: tuple[str, ...], job_dir: Path, env: dict[str, str]
) -> Command:
    """The mpirun command poprun-py renders, with Open MPI's own ssh and its files written."""
    from poprun_py.launch import launcher
    from poprun_py.prepare.job import LaunchOptions, prepare
    from poprun_py.process.output import write_job_files

    opts = LaunchOptions(
        program=job,
        cluster=str(spec),
        backend="mpirun",
        numa_aware=False,
        replicas=len(cluster.hosts),
        instances=len(cluster.hosts),
        mpi_args=f"--mca plm_rsh_agent ssh {rsh_args(cluster)}",
    )
    rendered = launcher.render(prepare(opts), str(job_dir), {})
    write_job_files(rendered)
    return list(rendered.launcher), {**env, **rendered.launcher_env}


def one(label: str, command: Command, hosts: int) -> float:
    """Seconds from sending SIGUSR2 and SIGUSR1 to the launcher to every instance's ``got``."""
    argv, env = command
    with tempfile.TemporaryFile() as err:  # read at the end: a pipe nobody reads could fill
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err)
        try:
            elapsed = signalled(proc, hosts)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:  # a failed measurement: stop it everywhere
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if elapsed is None or code != 0:
            err.seek(0)
            tail = err.read().decode("utf-8", "replace")[-800:]
            raise SystemExit(f"{label} failed ({proc.returncode}): {tail}")
    return elapsed


def signalled(proc: subprocess.Popen[bytes], hosts: int) -> float | None:
    """Once every instance is ``ready``, both signals to ``proc``; seconds until the last
    ``got``, or None if its output ended first."""
    assert proc.stdout is not None
    ready = got = 0
    sent = 0.0
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line.endswith("ready"):
            ready += 1
            if ready == hosts:
                sent = time.monotonic()
                proc.send_signal(signal.SIGUSR2)
                proc.send_signal(signal.SIGUSR1)
        elif line.endswith("got usr1 usr2"):
            got += 1
            if got == hosts:
                return time.monotonic() - sent
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for tool in ("mpirun", "mpiexec.hydra"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian: openmpi-bin, mpich)")
    compile_package()
    name = f"bench-signals-{os.getpid()}"
    cluster = create_cluster(name, args.hosts, host_prefix=f"ks{session_tag()}")
    work = Path(tempfile.mkdtemp(prefix="bench-signals-"))
    try:
        spec = write_spec(cluster, work / "cluster.yaml")
        program = work / "wait_signals.py"
        program.write_text(WAIT)
        cmds = commands(cluster, spec, program, work)
        for label, command in cmds.items():  # warm caches, check every command works
            one(label, command, args.hosts)
        times: dict[str, list[float]] = {label: [] for label in cmds}
        for _ in range(args.runs):  # interleaved: every command sees the same load
            for label, command in cmds.items():
                times[label].append(one(label, command, args.hosts))
        report(times, args.hosts, args.runs)
    finally:
        destroy_cluster(name)
        shutil.rmtree(work, ignore_errors=True)


def report(times: dict[str, list[float]], hosts: int, runs: int) -> None:
    print(f"SIGUSR2 + SIGUSR1 → every instance has both, {hosts} test hosts, median of {runs}:")
    for label, values in times.items():
        spread = f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f}"
        print(f"  {label:<30} {statistics.median(values) * 1000:7.1f} ms  ({spread} ms)")


if __name__ == "__main__":
    main()
