"""Per-node mode for real (issue 23): the nodes are network namespaces whose sshd is stopped
first -- nothing here uses SSH -- and each runs ``poprun-py launch --node-rank K --nnodes N
--coordinator NODE0:PORT ...`` as a pod would (its own UTS namespace, the secret in a file).

Covered: a plain job on three nodes (every node's output, the ssh backend's environment), a
gloo all-reduce through it, a node's instance killed (the others stopped, the root cause
named, a --max-restarts restart), a node's launcher killed (the node lost; with a restart,
the node's launcher started again as Kubernetes restarts a pod), a plan that differs, a wrong
secret, a node that never comes, no coordinator, a port in use. After each: no process left
in any node's namespace.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from poprun_py.launch import launcher
from poprun_py.prepare.job import LaunchOptions, prepare
from poprun_py.providers.netns import TestCluster, TestHost, host_pids
from tests.integration.helpers import PYSPY_THREAD, unique_sleep

pytestmark = pytest.mark.hosts

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
PORT = 29433
NAME_HOST = 'hostname "$1"; shift; exec "$@"'  # a pod's own host name, then the launcher
CONTRACT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Node:
    """One node's launcher and what it printed (read as it comes)."""

    rank: int
    host: TestHost
    process: subprocess.Popen[str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for pipe, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err)):
            threading.Thread(target=_collect, args=(pipe, lines), daemon=True).start()

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        time.sleep(0)  # the readers end with the pipes
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    @property
    def stdout(self) -> str:
        return "".join(self.out)


def _collect(pipe: object, lines: list[str]) -> None:
    for line in iter(pipe.readline, ""):  # type: ignore[attr-defined]
        lines.append(line)


class Pods:
    """The cluster's hosts as pods: no sshd, a shared secret file, launchers started at will."""

    def __init__(self, cluster: TestCluster, tmp: Path):
        self.cluster, self.tmp = cluster, tmp
        self.secret = self.secret_file("s", "the-shared-secret-0123456789")
        self.nodes: list[Node] = []

    def secret_file(self, name: str, text: str) -> Path:
        path = self.tmp / f"secret-{name}"
        path.write_text(text + "\n")
        path.chmod(0o600)
        return path

    @property
    def names(self) -> str:
        return ",".join(h.name for h in self.cluster.hosts)

    def start(
        self,
        rank: int,
        program: Sequence[str],
        *extra: str,
        secret: Path | None = None,
        command: str = "launch",
    ) -> Node:
        host = self.cluster.hosts[rank]
        argv = [
            *("ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", NAME_HOST),
            *("sh", host.name, PY, "-m", "poprun_py", command),
            *("--node-rank", str(rank), "--nnodes", str(len(self.cluster.hosts))),
            *("--coordinator", f"{self.cluster.hosts[0].address}:{PORT}"),
            *("--secret-file", str(secret or self.secret), "--hosts", self.names),
            *("--no-numa-aware", "--join-timeout", "20s"),
            *extra,
            "--",
            *program,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, cwd=REPO, env=env, start_new_session=True,
        )  # fmt: skip
        node = Node(rank, host, process)
        self.nodes.append(node)
        return node

    def start_all(self, program: Sequence[str], *extra: str) -> list[Node]:
        return [self.start(k, program, *extra) for k in range(len(self.cluster.hosts))]

    def stop(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                with_pgid(node.process.pid, signal.SIGKILL)
                node.process.wait(10)

    def leftovers(self, within: float = 10.0) -> dict[str, list[int]]:
        """Processes still in any node's namespace once ``within`` seconds have passed (or
        none are)."""
        deadline = time.monotonic() + within
        while True:
            left = {h.name: host_pids(h.netns) for h in self.cluster.hosts}
            left = {name: pids for name, pids in left.items() if pids}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def with_pgid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def stop_sshd(host: TestHost) -> None:
    """The host without its sshd: nothing answers on port 22."""
    with_pid = host.sshd_pid
    try:
        os.kill(with_pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{with_pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(OSError), socket.create_connection((host.address, 22), timeout=2):
        pass


def sshless_cluster(prefix: str, *, data_network: bool = False) -> Iterator[TestCluster]:
    """Three hosts, their sshd stopped (nodes as pods: no SSH anywhere); destroyed at the end
    (``data_network``: each also on a data network, providers/netns_data.py)."""
    from tests.hostfixtures import _Clusters

    clusters = _Clusters()
    try:
        made = clusters.make(3, prefix, data_network=data_network)
        for host in made.hosts:
            stop_sshd(host)
        yield made
    finally:
        clusters.destroy_all()


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    """Three hosts for the module, their sshd stopped."""
    yield from sshless_cluster("pn")


@pytest.fixture
def pods(cluster: TestCluster, tmp_path: Path) -> Iterator[Pods]:
    made = Pods(cluster, tmp_path)
    try:
        yield made
    finally:
        made.stop()
    assert made.leftovers() == {}, "processes left in the nodes' namespaces"


# ---------------------------------------------------------------- jobs


def test_a_plain_job_runs_on_every_node_with_the_ssh_backends_environment(pods: Pods) -> None:
    names = "|".join(CONTRACT)
    probe = f'echo "on $(hostname):"; env | grep -E "^(POPRUN_[A-Z_]*|{names})=" | sort'
    nodes = pods.start_all(["sh", "-c", probe])
    codes = [node.wait(90) for node in nodes]
    assert codes == [0, 0, 0], [n.stderr for n in nodes]
    out = nodes[0].stdout
    hosts = [h.name for h in pods.cluster.hosts]
    for k, host in enumerate(hosts):  # each instance ran on its own node
        assert f"[{host}:{k}] on {host}:" in out, out
    ranks = {line.split("]")[0]: line for line in out.splitlines() if "] RANK=" in line}
    assert sorted(r.split("=")[1] for r in ranks.values()) == ["0", "1", "2"], out
    assert out.count("] WORLD_SIZE=3\n") == 3, out
    given = {line.split("] ", 1)[1].split("=")[0] for line in out.splitlines() if "=" in line}
    wanted = ssh_contract(pods, ["sh", "-c", probe])
    assert wanted <= given, sorted(wanted - given)
    assert not nodes[1].stdout and not nodes[2].stdout  # node 0 shows the job's output


def ssh_contract(pods: Pods, program: Sequence[str]) -> set[str]:
    """The variable names the ssh backend gives an instance of the same job (rendered)."""
    opts = LaunchOptions(hosts=pods.names, program=tuple(program), numa_aware=False, backend="ssh")
    job = launcher.render_for_show(prepare(opts), None)
    names = set(job.instances[0].env)
    return {n for n in names if n.startswith("POPRUN_") or n in CONTRACT}


GLOO = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(value)
dist.destroy_process_group()
print("sum", value.item())
"""


@pytest.mark.torch
def test_torch_gloo_all_reduce_through_per_node_mode(pods: Pods) -> None:
    pytest.importorskip("torch")
    nodes = pods.start_all([PY, "-c", GLOO])
    codes = [node.wait(180) for node in nodes]
    assert codes == [0, 0, 0], nodes[0].stderr
    assert nodes[0].stdout.count("sum 6.0") == 3, nodes[0].stdout


# ---------------------------------------------------------------- failures


def running(node: Node, count: int, within: float = 60.0) -> None:
    """Until node 0 has shown ``count`` "up" lines (every instance is running)."""
    deadline = time.monotonic() + within
    while node.stdout.count(" up\n") < count:
        assert time.monotonic() < deadline, node.stdout + node.stderr
        assert node.process.poll() is None, node.stderr
        time.sleep(0.05)


def pids_of(host: TestHost, marker: str) -> list[int]:
    found = []
    for pid in host_pids(host.netns):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and b"sh\0-c" not in cmdline:
            found.append(pid)
    return found


def test_a_node_whose_launcher_is_killed_is_lost_and_the_others_stop(pods: Pods) -> None:
    mark = unique_sleep()
    nodes = pods.start_all(["sh", "-c", f"echo up; exec sleep {mark}"])
    running(nodes[0], 3)
    with_pgid(nodes[2].process.pid, signal.SIGKILL)  # the pod is gone, launcher and all
    codes = [node.wait(60) for node in nodes[:2]]
    lost = pods.cluster.hosts[2].name
    assert codes == [255, 255], nodes[0].stderr
    assert f"host {lost}" in nodes[0].stderr and "lost" in nodes[0].stderr, nodes[0].stderr
    assert "node 0's launcher says why" in nodes[1].stderr


def test_a_killed_instance_stops_the_others_and_a_restart_follows(pods: Pods) -> None:
    mark = unique_sleep()
    first = f'if [ "$POPRUN_RESTART_COUNT" = 0 ]; then echo up; exec sleep {mark}; fi; echo again'
    nodes = pods.start_all(["sh", "-c", first], "--max-restarts", "1", "--restart-delay", "0")
    running(nodes[0], 3)
    host = pods.cluster.hosts[1]
    [victim] = pids_of(host, mark)
    os.kill(victim, signal.SIGKILL)
    codes = [node.wait(90) for node in nodes]
    assert codes == [0, 0, 0], nodes[0].stderr
    err = nodes[0].stderr
    assert "restarting (1/1)" in err and host.name in err and "SIGKILL" in err, err
    assert nodes[0].stdout.count(" again\n") == 3, nodes[0].stdout


def test_a_lost_node_that_comes_back_is_restarted_with_the_others(pods: Pods) -> None:
    mark = unique_sleep()
    again = f'if [ "$POPRUN_RESTART_COUNT" = 0 ]; then echo up; exec sleep {mark}; fi; echo again'
    program = ["sh", "-c", again]
    extra = ("--max-restarts", "1", "--restart-delay", "0")
    nodes = pods.start_all(program, *extra)
    running(nodes[0], 3)
    with_pgid(nodes[2].process.pid, signal.SIGKILL)
    nodes[2].wait(10)
    back = pods.start(2, program, *extra)  # as Kubernetes restarts a failed pod
    codes = [node.wait(90) for node in (*nodes[:2], back)]
    assert codes == [0, 0, 0], nodes[0].stderr
    assert "lost contact with host" in nodes[0].stderr, nodes[0].stderr
    assert "attempt 1: ok" in nodes[0].stderr, nodes[0].stderr
    assert nodes[0].stdout.count(" again\n") == 3, nodes[0].stdout


def test_a_node_whose_plan_differs_is_refused(pods: Pods) -> None:
    nodes = [pods.start(k, ["echo", "other" if k == 1 else "same"]) for k in range(3)]
    codes = [node.wait(60) for node in nodes]
    assert codes == [3, 3, 3], [n.stderr for n in nodes]
    name = pods.cluster.hosts[1].name
    assert f"node 1 ({name}) made a different plan" in nodes[0].stderr, nodes[0].stderr
    assert "plan differs" in nodes[1].stderr
    assert "same" not in nodes[0].stdout  # nothing started


def test_a_wrong_secret_is_refused(pods: Pods) -> None:
    wrong = pods.secret_file("wrong", "another-secret-0123456789")
    extra = ("--join-timeout", "4s")
    nodes = [pods.start(k, ["true"], *extra, secret=wrong if k == 2 else None) for k in range(3)]
    codes = [node.wait(60) for node in nodes]
    assert codes == [3, 3, 3], [n.stderr for n in nodes]
    assert "did not prove the shared secret" in nodes[2].stderr, nodes[2].stderr
    name = pods.cluster.hosts[2].name
    assert f"node 2 ({name}) has not joined within 4 s" in nodes[0].stderr, nodes[0].stderr
    assert "refused" in nodes[0].stderr


def test_a_node_that_never_comes_is_named_within_the_join_timeout(pods: Pods) -> None:
    started = time.monotonic()
    nodes = [pods.start(k, ["true"], "--join-timeout", "3s") for k in range(2)]
    codes = [node.wait(60) for node in nodes]
    assert codes == [3, 3], [n.stderr for n in nodes]
    assert time.monotonic() - started < 3 + 20  # the timeout, and a launcher's start
    name = pods.cluster.hosts[2].name
    assert f"node 2 ({name}) has not joined within 3 s" in nodes[0].stderr, nodes[0].stderr


def test_no_coordinator_is_one_line_and_exit_3(pods: Pods) -> None:
    node = pods.start(1, ["true"], "--join-timeout", "1s")
    assert node.wait(60) == 3
    lines = node.stderr.strip().splitlines()
    assert len(lines) == 1 and "node 1 cannot reach the coordinator" in lines[0], lines


def test_a_port_in_use_is_one_line_and_exit_3(pods: Pods) -> None:
    host = pods.cluster.hosts[0]
    listen = (
        f"import socket, time; s = socket.create_server(('', {PORT})); "
        "print(1, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, PY, "-c", listen],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "1\n"
        node = pods.start(0, ["true"], "--join-timeout", "2s")
        assert node.wait(60) == 3
        lines = node.stderr.strip().splitlines()
        assert len(lines) == 1 and f"cannot listen on port {PORT}: in use" in lines[0], lines
    finally:
        with_pgid(holder.pid, signal.SIGKILL)
        holder.wait(10)


# ---------------------------------------------------------------- the ssh backend's rules


def test_usr1_reaches_every_node_and_timeout_stops_them_all(pods: Pods) -> None:
    waiting = 'trap "echo got usr1" USR1; echo up; while :; do sleep 0.1; done'
    nodes = pods.start_all(["sh", "-c", waiting], "--timeout", "12s")
    running(nodes[0], 3)
    os.kill(nodes[0].process.pid, signal.SIGUSR1)  # to node 0's launcher: forwarded to all
    deadline = time.monotonic() + 10
    while nodes[0].stdout.count(" got usr1\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert nodes[0].stdout.count(" got usr1\n") == 3, nodes[0].stdout
    codes = [node.wait(60) for node in nodes]
    assert codes == [124, 124, 124], nodes[0].stderr


HANG = """
import os, time
import poprun_py.dist  # registers faulthandler (the agents' fallback without py-spy)
print("start", flush=True)
def wait_for_the_loader():
    time.sleep(300)  # hung: no output, no heartbeat
if os.environ["RANK"] == "2":
    wait_for_the_loader()
while True:
    poprun_py.dist.heartbeat()
    time.sleep(0.2)
"""


def test_a_hang_is_caught_with_every_nodes_stacks(pods: Pods, tmp_path: Path) -> None:
    program = tmp_path / "hang.py"
    program.write_text(HANG)
    logs = tmp_path / "logs"
    nodes = pods.start_all([PY, str(program)], "--hang-timeout", "3", "-o", str(logs))
    codes = [node.wait(90) for node in nodes]
    assert codes == [124, 124, 124], nodes[0].stderr
    hung = pods.cluster.hosts[2].name
    assert f"instance 2 on {hung} hung (no progress for 3 s)" in nodes[0].stderr, nodes[0].stderr
    for i in range(3):  # every node's agent dumped its instance's stack
        log = (logs / f"instance-{i}.log").read_text()
        # faulthandler's dump (SIGUSR1), or py-spy's where the hosts' PATH has it
        assert "most recent call first" in log or re.search(PYSPY_THREAD, log, re.M), (i, log)
    assert "wait_for_the_loader" in (logs / "instance-2.log").read_text()


def test_check_runs_on_every_node_and_node_0_shows_the_table(pods: Pods) -> None:
    nodes = [pods.start(k, ["true"], "--check-timeout", "30", command="check") for k in range(3)]
    codes = [node.wait(90) for node in nodes]
    assert codes == [0, 0, 0], [n.stdout + n.stderr for n in nodes]
    rows = nodes[0].stdout.splitlines()
    assert [row.split()[0] for row in rows[1:4]] == [h.name for h in pods.cluster.hosts], rows
    assert not nodes[1].stdout and not nodes[2].stdout
