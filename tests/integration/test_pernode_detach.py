"""``launch --detach`` in per-node mode, for real (issue 23): the nodes are network namespaces
without sshd, each with a job root and a registry of its own (as separate machines have), and
each runs ``poprun-py launch --node-rank K ... --detach`` as a pod would. Every launcher returns
with its job id and leaves a supervisor on its node; ``jobs``, ``logs``, ``stop`` and ``wait``
then run on the nodes.

Covered: a job that runs to completion (``wait`` on every node gives its exit code, node 0's
``logs`` every instance's output), ``stop`` on node 0 (every node's instances stopped, every
supervisor gone, nothing left in any namespace), ``stop`` on another node (its part stopped,
node 0 finds it lost), and a failing instance on one node (named as the root cause by node 0's
``wait`` and ``jobs``; the other nodes' parts end with its code, and name it too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster, host_pids
from tests.integration.helpers import unique_sleep
from tests.integration.test_pernode import NAME_HOST, PY, REPO, Node, Pods, pids_of, sshless_cluster

pytestmark = pytest.mark.hosts

PORT = 29434
DEADLINE = 60.0


class DetachedPods(Pods):
    """Pods whose launchers detach; each node has its own job root and registry."""

    def env(self, rank: int) -> dict[str, str]:
        home = self.tmp / f"node{rank}"
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "POPRUN_PY_JOB_ROOT": str(home / "root"),
            "XDG_STATE_HOME": str(home / "state"),
        }

    def on_node(self, rank: int, *words: str) -> list[str]:
        host = self.cluster.hosts[rank]
        return [
            *("ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", NAME_HOST),
            *("sh", host.name, PY, "-m", "poprun_py", *words),
        ]

    def detach(self, rank: int, program: Sequence[str], *extra: str) -> Node:
        argv = self.on_node(
            rank,
            "launch",
            *("--node-rank", str(rank), "--nnodes", str(len(self.cluster.hosts))),
            *("--coordinator", f"{self.cluster.hosts[0].address}:{PORT}"),
            *("--secret-file", str(self.secret), "--hosts", self.names),
            *("--no-numa-aware", "--join-timeout", "20s", "--detach", *extra, "--", *program),
        )
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, cwd=REPO, env=self.env(rank), start_new_session=True,
        )  # fmt: skip
        node = Node(rank, self.cluster.hosts[rank], process)
        self.nodes.append(node)
        return node

    def detach_all(self, program: Sequence[str], *extra: str) -> list[str]:
        """Every node's ``launch --detach`` at once (as pods start); their job ids."""
        nodes = [self.detach(k, program, *extra) for k in range(len(self.cluster.hosts))]
        codes = [node.wait(DEADLINE) for node in nodes]
        assert codes == [0] * len(nodes), [n.stderr for n in nodes]
        return [node.stdout.strip().splitlines()[-1] for node in nodes]

    def run(self, rank: int, *words: str) -> subprocess.CompletedProcess[str]:
        """A jobs command on node ``rank``, as its user would run it there."""
        return subprocess.run(
            self.on_node(rank, *words), capture_output=True, text=True, cwd=REPO,
            env=self.env(rank), timeout=DEADLINE, check=False,
        )  # fmt: skip

    def job(self, rank: int, job_id: str) -> dict[str, object]:
        done = self.run(rank, "jobs", "--format", "json")
        assert done.returncode == 0, done.stderr
        [found] = [r for r in json.loads(done.stdout) if r["id"] == job_id]
        return dict(found)

    def clear(self) -> None:
        """After a failed test: whatever still runs in the nodes' namespaces (the test's)."""
        for host in self.cluster.hosts:
            for pid in host_pids(host.netns):
                with_pid(pid, signal.SIGKILL)


def with_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    """Three hosts for the module, their sshd stopped."""
    yield from sshless_cluster("pd")


@pytest.fixture
def pods(cluster: TestCluster, tmp_path: Path) -> Iterator[DetachedPods]:
    made = DetachedPods(cluster, tmp_path)
    try:
        yield made
        left = made.leftovers()
    finally:
        made.stop()
        made.clear()
    assert left == {}, "processes left in the nodes' namespaces"


def until(what: str, check: object, within: float = DEADLINE) -> None:
    """Poll ``check()`` until it is true, failing after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def test_a_detached_job_runs_to_completion_and_wait_gives_its_exit_code(
    pods: DetachedPods,
) -> None:
    ids = pods.detach_all(["sh", "-c", 'echo "on $(hostname)"'])
    hosts = [h.name for h in pods.cluster.hosts]
    assert all(f"-node{k}-" in job_id for k, job_id in enumerate(ids)), ids
    joined = pods.nodes[1].stderr
    assert "node 1 of 3 joined the coordinator" in joined, joined
    for rank, job_id in enumerate(ids):
        done = pods.run(rank, "wait", job_id)
        assert done.returncode == 0, done.stderr
        assert f"job {job_id} succeeded (exit code 0)" in done.stderr, done.stderr
    logs = pods.run(0, "logs", ids[0])
    for k, host in enumerate(hosts):  # node 0's log has every node's instance
        assert f"[{host}:{k}] on {host}" in logs.stdout, logs.stdout
    record = pods.job(0, ids[0])
    assert record["state"] == "succeeded" and record["hosts"] == hosts, record
    part = pods.job(2, ids[2])
    assert part["state"] == "succeeded" and part["hosts"] == [hosts[2]], part
    assert pods.run(1, "jobs", "--format", "json").stdout.count('"id"') == 1  # its part only
    secret = pods.secret.read_text().strip()
    for rank, job_id in enumerate(ids):  # the record: the secret file's path, never the secret
        path = pods.tmp / f"node{rank}" / "root" / "jobs" / "detached" / job_id / "job.json"
        assert path.stat().st_mode & 0o777 == 0o600
        launch = json.loads(path.read_text())["options"]["launch"]
        assert launch["secret_file"] == str(pods.secret) and launch["node_rank"] == rank
        assert secret not in path.read_text()


def test_stop_on_node_0_stops_every_nodes_instances(pods: DetachedPods) -> None:
    mark = unique_sleep()
    ids = pods.detach_all(["sh", "-c", f"exec sleep {mark}"])
    hosts = pods.cluster.hosts
    until("every node's instance runs", lambda: all(pids_of(h, mark) for h in hosts))
    stopped = pods.run(0, "stop", ids[0])
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {ids[0]} stopped" in stopped.stderr, stopped.stderr
    for rank, job_id in enumerate(ids):
        done = pods.run(rank, "wait", job_id)
        assert done.returncode == 130, (rank, done.stderr)
        assert f"job {job_id} stopped" in done.stderr, done.stderr
    assert [pids_of(h, mark) for h in hosts] == [[], [], []]


def test_a_failing_instance_on_one_node_is_the_root_cause(pods: DetachedPods) -> None:
    mark, trigger = unique_sleep(), pods.tmp / "fail-now"
    script = (
        f'if [ "$RANK" = 2 ]; then while [ ! -e {trigger} ]; do sleep 0.1; done; exit 7; fi; '
        f"exec sleep {mark}"
    )
    ids = pods.detach_all(["sh", "-c", script])
    trigger.touch()  # every instance runs: now instance 2 fails
    bad = pods.cluster.hosts[2].name
    done = pods.run(0, "wait", ids[0])
    assert done.returncode == 7, done.stderr
    assert f"job {ids[0]} failed (exit code 7): instance 2 on {bad} exited with code 7" in (
        done.stderr
    ), done.stderr
    record = pods.job(0, ids[0])
    assert record["exit_code"] == 7 and f"instance 2 on {bad}" in str(record["reason"]), record
    for rank in (1, 2):  # the other nodes' parts end with the job's code and its root cause
        part = pods.run(rank, "wait", ids[rank])
        assert part.returncode == 7 and f"instance 2 on {bad} exited" in part.stderr, part.stderr
    assert [pids_of(h, mark) for h in pods.cluster.hosts] == [[], [], []]


def test_stop_on_another_node_stops_its_part_and_node_0_finds_it_lost(
    pods: DetachedPods,
) -> None:
    mark = unique_sleep()
    ids = pods.detach_all(["sh", "-c", f"exec sleep {mark}"])
    hosts = pods.cluster.hosts
    until("every node's instance runs", lambda: all(pids_of(h, mark) for h in hosts))
    stopped = pods.run(2, "stop", ids[2])
    assert stopped.returncode == 0 and f"job {ids[2]} stopped" in stopped.stderr, stopped.stderr
    done = pods.run(0, "wait", ids[0])
    assert done.returncode == 255, done.stderr
    assert f"host {hosts[2].name}" in done.stderr and "lost" in done.stderr, done.stderr
    assert pods.run(1, "wait", ids[1]).returncode == 255
    assert pods.run(2, "wait", ids[2]).returncode == 130
    assert [pids_of(h, mark) for h in hosts] == [[], [], []]
