"""Long runs through the CLI on real test hosts (network namespaces with sshd), Open MPI and the
test Slurm: whole-job restarts, SIGUSR1 and SIGUSR2 reaching every instance (past hydra under
mpiexec; also when a helper thread of poprun-py takes them), a hang caught with its stacks, the
time limit, and a host cut off mid-run replaced by a spare while the example resumes from
its checkpoint. Afterwards nothing but sshd may run on any host (the cut host included, once
it is back)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.hostfixtures import MakeCluster
from tests.integration.helpers import PYSPY_THREAD
from tests.integration.test_launch_hosts_cli import only_sshd, poprun, spec_for
from tests.integration.test_slurm_cli import squeue_empty
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

WAIT_SIGNALS = """
import os, signal, sys, time
got = set()
signal.signal(signal.SIGUSR1, lambda *a: got.add("usr1"))
signal.signal(signal.SIGUSR2, lambda *a: got.add("usr2"))
print("ready", flush=True)
deadline = time.monotonic() + 30
while len(got) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
print("got " + " ".join(sorted(got)) + " " + os.environ["RANK"], flush=True)
sys.exit(0 if len(got) == 2 else 5)
"""
"""Waits for SIGUSR1 and SIGUSR2 (30 s at most), prints ``got usr1 usr2 RANK``."""

HANG = """
import os, time
import poprun_py.dist
print("start", flush=True)
if os.environ["RANK"] == "2":
    time.sleep(300)  # hung: no output, no heartbeat
while True:
    poprun_py.dist.heartbeat()
    time.sleep(0.2)
"""

HANG_IN_A_FUNCTION = """
import os, threading, time
import poprun_py.dist

def wait_for_the_loader():
    time.sleep(300)  # hung: no output, no heartbeat

def all_reduce():
    while True:
        time.sleep(0.2)  # waiting for rank 2, but alive: a heartbeat thread

def beat():
    while True:
        poprun_py.dist.heartbeat()
        time.sleep(0.2)

print("start", flush=True)
if os.environ["RANK"] == "2":
    wait_for_the_loader()
threading.Thread(target=beat, daemon=True).start()
all_reduce()
"""
VERDICT = r"hang verdict: 3 of 4 ranks wait in all_reduce \(hang\.py:10\); rank 2 on (\S+) is in "
VERDICT += r"wait_for_the_loader \(hang\.py:6\)$"
"""The hang's verdict: the odd rank named, on its host (stderr, and hang.json in the logs)."""


def assert_verdict(err: str, logs: Path, host: str) -> None:
    found = re.search(VERDICT, err, re.M)
    assert found and found.group(1) == host, err
    hang = json.loads((logs / "hang.json").read_text())
    assert hang["verdict"] in err and hang["ranks"] == 4 and hang["no_stacks"] == []
    odd, most = hang["groups"]
    assert (odd["ranks"], odd["hosts"], odd["where"]) == (
        [2],
        [host],
        "wait_for_the_loader (hang.py:6)",
    )
    assert most["ranks"] == [0, 1, 3] and most["where"] == "all_reduce (hang.py:10)"


FAIL_FIRST = 'echo "attempt $POPRUN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $RANK"; '


def started(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Streamed:
    return Streamed(
        subprocess.Popen(
            [PY, "-m", "poprun_py", *argv],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
        )
    )


class Streamed:
    """A running poprun-py whose stdout lines are read as they come."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc, self.lines = proc, queue.Queue[str]()
        self.seen: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        self.err.extend(self.proc.stderr)

    def wait_for(self, pattern: str, count: int, within: float = 60.0) -> float:
        """Wait until ``count`` lines matched ``pattern``; when the last one came."""
        deadline = time.monotonic() + within
        while sum(bool(re.search(pattern, s)) for s in self.seen) < count:
            try:
                self.seen.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"only {self.seen} after {within} s") from None
        return time.monotonic()

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.proc.returncode, "\n".join(self.seen), "".join(self.err)


@contextlib.contextmanager
def stopped_at_the_end(run: Streamed) -> Iterator[Streamed]:
    """``run``, stopped if the test fails early, so that nothing of it is left for the next
    tests on the shared hosts: SIGTERM (poprun-py stops every host's instances within its
    grace period), SIGKILL if it has not ended 30 s later (its agents then see their ssh
    session end, and stop their instances)."""
    try:
        yield run
    finally:
        if run.proc.poll() is None:
            run.proc.terminate()
            try:
                run.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait(timeout=30)


def launch_args(spec: Path, backend: str, n: int, *more: str) -> list[str]:
    return ["launch", "-c", str(spec), "-b", backend, "-r", str(n), "-n", str(n), *more]


# ---------------------------------------------------------------- restarts


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec"])
def test_a_failed_attempt_restarts_the_whole_job_on_every_host(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    script = FAIL_FIRST + '[ "$POPRUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 2 ] && exit 7; exit 0'
    args = launch_args(spec, backend, 4, "--max-restarts", "2", "--", "sh", "-c", script)
    proc = poprun(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for rank in range(4):
        assert f"attempt 1 1 {rank}" in proc.stdout
    assert "attempt 0: instance 2 on" in proc.stderr and "attempt 1: ok" in proc.stderr
    assert "attempt 2 2" not in proc.stdout
    only_sshd(test_cluster_4)


def test_restarts_running_out_give_the_failing_instances_code(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    script = '[ "$RANK" = 1 ] && exit 9; exec sleep 60'
    proc = poprun(
        *launch_args(spec, "ssh", 4, "--max-restarts", "1", "--", "sh", "-c", script), cwd=tmp_path
    )
    assert proc.returncode == 9, proc.stderr
    assert "attempt 0: instance 1" in proc.stderr and "attempt 1: instance 1" in proc.stderr
    only_sshd(test_cluster_4)


def test_timeout_stops_every_host_with_124(test_cluster_4: TestCluster, tmp_path: Path) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    t0 = time.monotonic()
    proc = poprun(
        *launch_args(spec, "ssh", 4, "--timeout", "2s", "--", "sleep", "60"), cwd=tmp_path
    )
    assert proc.returncode == 124, proc.stderr
    assert "timed out after 2 s" in proc.stderr
    assert time.monotonic() - t0 < 15
    only_sshd(test_cluster_4)


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec"])
def test_usr1_and_usr2_reach_every_instance_on_every_host_and_the_job_goes_on(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    program = tmp_path / "wait_signals.py"
    program.write_text(WAIT_SIGNALS)
    argv = launch_args(spec, backend, 4, "--", PY, str(program))
    with stopped_at_the_end(started(argv, tmp_path)) as run:
        run.wait_for(r"\] ready$", 4)
        run.proc.send_signal(signal.SIGUSR2)  # hydra would die of it: poprun-py goes past it
        run.proc.send_signal(signal.SIGUSR1)
        code, out, err = run.finish()
    assert code == 0, err
    for rank in range(4):
        assert re.search(rf"\] got usr1 usr2 {rank}$", out, re.M), out
    assert "not forwarded" not in err
    only_sshd(test_cluster_4)


def helper_threads(pid: int, within: float = 10.0) -> list[int]:
    """The threads of process ``pid`` other than its main one (poprun-py's relay and paramiko
    threads run while a job does)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        if others:
            return others
        time.sleep(0.05)
    raise AssertionError(f"process {pid} has no thread but its main one")


def signal_thread(pid: int, sig: int) -> None:
    """Send ``sig`` to one helper thread of ``pid`` (tgkill), another if that one just ended:
    the kernel may hand a process's signal to any of its threads, and Python runs handlers in
    the main thread only."""
    libc = ctypes.CDLL(None, use_errno=True)
    for tid in helper_threads(pid):
        if libc.tgkill(pid, tid, sig) == 0:
            return
    raise OSError(ctypes.get_errno(), "tgkill: no helper thread left")


@pytest.mark.parametrize("backend", ["mpirun", "mpiexec"])
def test_a_signal_that_a_helper_thread_takes_is_acted_on_at_once(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    """The instances are silent and the launcher's loop has no timeout, so nothing else wakes
    poprun-py's main thread: SIGUSR1 and SIGUSR2 that a relay thread takes reach every rank
    within seconds (not at the program's 30 s deadline), and so does SIGTERM's stop."""
    spec = spec_for(test_cluster_4, tmp_path)
    program = tmp_path / "wait_signals.py"
    program.write_text(WAIT_SIGNALS)
    argv = launch_args(spec, backend, 4, "--", PY, str(program))
    with stopped_at_the_end(started(argv, tmp_path)) as run:
        run.wait_for(r"\] ready$", 4)
        sent = time.monotonic()
        signal_thread(run.proc.pid, signal.SIGUSR1)
        signal_thread(run.proc.pid, signal.SIGUSR2)
        assert run.wait_for(r"\] got usr1 usr2 \d$", 4, within=30) - sent < 10, run.seen
        assert run.finish()[0] == 0
    with stopped_at_the_end(started(argv, tmp_path)) as run:
        run.wait_for(r"\] ready$", 4)
        sent = time.monotonic()
        signal_thread(run.proc.pid, signal.SIGTERM)
        code, _, err = run.finish()
        assert code == 130, err
        assert time.monotonic() - sent < 15, err
    only_sshd(test_cluster_4)


# ---------------------------------------------------------------- hangs


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec"])
@pytest.mark.requires("py-spy", "ptrace")  # the agents' py-spy reads instances it did not start
def test_a_hang_is_caught_with_every_stack_in_the_logs(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)  # grace period 2 s
    program = tmp_path / "hang.py"
    program.write_text(HANG_IN_A_FUNCTION)
    logs = tmp_path / "logs"
    hang, grace = 3.0, 2.0
    args = launch_args(
        spec, backend, 4, "--hang-timeout", "3", "-o", str(logs), "--", PY, str(program)
    )
    # the hosts' sessions get this PATH (the cluster's sshd), so their agents find this
    # machine's py-spy (requires: on PATH) and dump every instance with it (for MPI: every rank
    # under the relayed daemons)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with stopped_at_the_end(started(args, tmp_path, env=env)) as run:
        silent_since = run.wait_for(r":2\] start$", 1)
        code, _, err = run.finish()
        ended = time.monotonic()
    assert code == 124, err
    # caught at the hang timeout, not at the program's 300 s: the slack is generous for a
    # loaded 2-core machine (py-spy dumping 4 instances through 4 ssh sessions)
    assert ended - silent_since <= hang + grace + 20.0
    hung = test_cluster_4.hosts[2].name
    assert f"instance 2 on {hung} hung (no progress for 3 s)" in err
    for i in range(4):
        log = (logs / f"instance-{i}.log").read_text()
        assert re.search(PYSPY_THREAD, log, re.M), (i, log)  # py-spy's dump
        assert "most recent call first" not in log  # so no SIGUSR1
        assert "poprun-py:" not in log  # the heartbeat markers are swallowed
    hung_log = (logs / "instance-2.log").read_text()
    assert re.search(r"^ +wait_for_the_loader \(hang\.py:6\)$", hung_log, re.M), hung_log
    assert re.search(r":2\] +wait_for_the_loader \(hang\.py:6\)$", err, re.M)  # on stderr
    assert_verdict(err, logs, hung)
    only_sshd(test_cluster_4)  # py-spy included


# ---------------------------------------------------------------- a host cut off, a spare


def cut(cluster: TestCluster, index: int, up: bool) -> None:
    host = cluster.hosts[index]
    state = "up" if up else "down"
    subprocess.run(
        ["ip", "netns", "exec", host.netns, "ip", "link", "set", "eth0", state], check=True
    )


def test_a_host_cut_off_mid_run_is_replaced_by_a_spare_and_training_resumes(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(4, "lr")  # hosts 0-2 planned, host 3 the spare
    spec = spec_for(cluster, tmp_path)
    data, ck, logs = tmp_path / "data", tmp_path / "ck", tmp_path / "logs"
    subprocess.run(
        [PY, str(ROOT / "examples/make_data.py"), "--out", str(data)],
        check=True,
        capture_output=True,
    )
    train = [
        PY,
        str(ROOT / "examples/train.py"),
        "--steps",
        "30",
        "--log-every",
        "1",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "2",
        "--step-seconds",
        "0.15",
        "--timeout",
        "8",
    ]
    inputs = ["--input", f"{data}/*.npz"]
    spare = cluster.hosts[3].name
    args = [
        "launch",
        "-c",
        str(spec),
        "-b",
        "ssh",
        "--spare-hosts",
        "1",
        "-r",
        "3",
        "-n",
        "3",
        "--max-restarts",
        "1",
        "--host-timeout",
        "3s",  # the cut-off host is lost 3 s after its last word
        "-o",
        str(logs),
        *inputs,
        "--",
        *train,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with stopped_at_the_end(started(args, tmp_path, env=env)) as run:
        try:
            run.wait_for(r":1\] step 8 loss", 1)
            cut(cluster, 1, up=False)
            code, out, err = run.finish(timeout=90)
        finally:
            cut(cluster, 1, up=True)
    assert code == 0, err
    assert f"spare host {spare} takes the place of lost host {cluster.hosts[1].name}" in err
    assert re.search(rf"\[{spare}:1\] resumed from step (\d+)", out), out
    resumed = int(re.search(r"resumed from step (\d+)", out).group(1))  # type: ignore[union-attr]
    assert resumed >= 6
    finals = set(re.findall(r"final loss .* weights (\w+)", out))
    # The uninterrupted reference runs where the resumed run ended, on the same hosts through the
    # same backend: its instances get the sshd sessions' environment too. A local run would
    # inherit this process's, and numpy's results depend on it (OPENBLAS_CORETYPE and
    # OPENBLAS_L2_SIZE, set on many cloud machines, pick other BLAS kernels: other last bits).
    reference = subprocess.run(
        [
            PY,
            "-m",
            "poprun_py",
            "launch",
            "-c",
            str(spec),
            "-b",
            "ssh",
            "--exclude",
            cluster.hosts[1].name,
            "-r",
            "3",
            "-n",
            "3",
            *inputs,
            "--",
            *train[:4],
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    )
    assert finals == set(re.findall(r"final loss .* weights (\w+)", reference.stdout))
    assert len(finals) == 1
    assert (logs / "plan-restart-1.json").exists()
    only_sshd(cluster, settle=8.0)


# ---------------------------------------------------------------- slurm


def test_slurm_restarts_in_a_new_step_and_forwards_usr1_and_usr2(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    program = tmp_path / "wait_signals.py"
    program.write_text(WAIT_SIGNALS)
    nodes = ",".join(slurm_cluster.node_names[:2])
    script = FAIL_FIRST + f'[ "$POPRUN_RESTART_COUNT" = 0 ] && exit 4; exec {PY} {program}'
    args = [
        "launch",
        "--backend",
        "slurm",
        "--hosts",
        nodes,
        "-r",
        "4",
        "-n",
        "4",
        "--time",
        "5",
        "--max-restarts",
        "1",
        "--",
        "sh",
        "-c",
        script,
    ]
    with stopped_at_the_end(started(args, tmp_path, env=slurm_env)) as run:
        run.wait_for(r"\] ready$", 4)
        run.proc.send_signal(signal.SIGUSR1)
        run.proc.send_signal(signal.SIGUSR2)
        code, out, err = run.finish()
    assert code == 0, err
    assert "attempt 0: instance" in err and "attempt 1: ok" in err
    for rank in range(4):
        assert re.search(rf"\] got usr1 usr2 {rank}$", out, re.M), out
        assert f"attempt 1 1 {rank}" in out


# the dump step's py-spy reads tasks it did not start
DUMPED_BY_PYSPY = pytest.param(True, marks=pytest.mark.requires("py-spy", "ptrace"))


@pytest.mark.parametrize("pyspy", [DUMPED_BY_PYSPY, False])
def test_a_hung_slurm_step_has_every_stack_in_the_logs(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path, pyspy: bool
) -> None:
    program = tmp_path / "hang.py"
    program.write_text(HANG_IN_A_FUNCTION)
    logs = tmp_path / "logs"
    nodes = ",".join(slurm_cluster.node_names[:2])
    hang, grace = 3.0, 2.0
    args = [
        *("launch", "--backend", "slurm", "--hosts", nodes, "-r", "4", "-n", "4"),
        *("--time", "5", "--grace-period", "2", "--hang-timeout", "3", "-o", str(logs)),
        *("--", PY, str(program)),
    ]
    # srun passes this PATH on to the dump step, so it finds this machine's py-spy (requires:
    # on PATH) on the nodes; without it there, every task (all registered faulthandler) gets
    # SIGUSR1 instead
    path = (
        os.environ["PATH"]
        if pyspy
        else os.pathsep.join(  # no py-spy anywhere on it: not only the venv's
            d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()
        )
    )
    env = {**slurm_env, "PYTHONPATH": str(ROOT), "PATH": path}
    with stopped_at_the_end(started(args, tmp_path, env=env)) as run:
        silent_since = run.wait_for(r":2\] start$", 1)
        code, _, err = run.finish()
        ended = time.monotonic()
    assert code == 124, err
    # caught at the hang timeout, not at the program's 300 s: the slack is generous for a
    # loaded 2-core machine (a dump step through slurmd, py-spy on 4 tasks)
    assert ended - silent_since <= hang + grace + 20.0
    assert "instance 2 on" in err and "hung (no progress for 3 s)" in err
    for i in range(4):
        log = (logs / f"instance-{i}.log").read_text()
        assert bool(re.search(PYSPY_THREAD, log, re.M)) == pyspy, (i, log)
        assert ("most recent call first" in log) != pyspy, (i, log)  # SIGUSR1 without py-spy
    hung_log = (logs / "instance-2.log").read_text()
    if pyspy:
        assert re.search(r"^ +wait_for_the_loader \(hang\.py:6\)$", hung_log, re.M), hung_log
        assert re.search(r":2\] +wait_for_the_loader \(hang\.py:6\)$", err, re.M)  # stderr
    else:
        assert "line 6 in wait_for_the_loader" in hung_log, hung_log
    assert_verdict(err, logs, re.findall(r"instance 2 on (\S+) hung", err)[0])
    assert squeue_empty(slurm_env)  # the dump step included
