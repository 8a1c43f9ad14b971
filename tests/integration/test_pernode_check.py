"""``launch --check`` in per-node mode, for real (issue 23): the nodes are network namespaces
without sshd, on a management network (the coordinator's) and a data network (``--network``:
MASTER_ADDR's, which the check tests), each running ``poprun-py launch --node-rank K ...
--check`` as a pod would.

Covered: a check that passes, then the job on the same joined nodes (one join: node 0's table
on stderr, every instance's file); a node whose data link is down (every node exits 3, the bad
node named on every node, the program never run); the same detached (the check's round, then
the supervisors' round; the job runs to completion). After each: no process left in any node's
namespace.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers import netns_data
from poprun_py.providers.netns import TestCluster
from tests.integration.test_pernode import Pods, sshless_cluster
from tests.integration.test_pernode_detach import DetachedPods

pytestmark = pytest.mark.hosts

CHECK = ("--check", "--check-timeout", "3")


def data_link(cluster: TestCluster, index: int, up: bool) -> None:
    def run(argv: list[str]) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    netns_data.set_data_link(run, cluster.hosts[index].netns, index, up=up)


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    """Three hosts with a data network, their sshd stopped."""
    yield from sshless_cluster("pk", data_network=True)


def network(cluster: TestCluster) -> tuple[str, str]:
    assert cluster.data_subnet is not None
    return "--network", str(cluster.data_subnet)


@pytest.fixture(autouse=True)
def links_up(cluster: TestCluster) -> Iterator[None]:
    """Every data link up again after each test."""
    yield
    for k in range(3):
        data_link(cluster, k, up=True)


@pytest.fixture
def pods(cluster: TestCluster, tmp_path: Path) -> Iterator[Pods]:
    made = Pods(cluster, tmp_path)
    try:
        yield made
    finally:
        made.stop()
    assert made.leftovers() == {}, "processes left in the nodes' namespaces"


def wrote(out: Path) -> str:
    return f'echo "$RANK on $(hostname)" > {out}/ran-$RANK'


def test_launch_check_passes_then_runs_the_job_on_the_joined_nodes(
    pods: Pods, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    started = time.monotonic()
    nodes = pods.start_all(["sh", "-c", wrote(out)], *CHECK, *network(pods.cluster))
    codes = [node.wait(90) for node in nodes]
    took = time.monotonic() - started
    assert codes == [0, 0, 0], [n.stderr for n in nodes]
    hosts = [h.name for h in pods.cluster.hosts]
    ran = {p.name: p.read_text() for p in out.iterdir()}
    assert ran == {f"ran-{k}": f"{k} on {host}\n" for k, host in enumerate(hosts)}, ran
    err = nodes[0].stderr
    assert "check: 3/3 host(s) ok" in err, err
    first = [line.split()[0] for line in err.splitlines() if line.strip()]
    assert [word for word in first if word in hosts] == hosts, err  # the table's rows
    for node in nodes[1:]:  # the other nodes served the check and the job: no table there
        assert "host(s) ok" not in node.stderr and not node.stdout, node.stderr
    print(f"launch --check on 3 nodes: {took:.2f} s")


def test_a_failing_check_stops_every_node_with_exit_3_naming_the_bad_node(
    pods: Pods, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    bad = pods.cluster.hosts[2].name
    data_link(pods.cluster, 2, up=False)  # the check finds it: it cannot reach MASTER_ADDR
    nodes = pods.start_all(["sh", "-c", wrote(out)], *CHECK, *network(pods.cluster))
    codes = [node.wait(90) for node in nodes]
    assert codes == [3, 3, 3], [n.stderr for n in nodes]
    assert list(out.iterdir()) == []  # the program never ran
    err = nodes[0].stderr
    assert "check: 2/3 host(s) ok" in err, err
    table = [line for line in err.splitlines() if "cannot reach MASTER_ADDR" in line]
    assert table and table[0].split()[0] == bad, err
    for node in nodes[1:]:  # the root cause, on every node
        assert "node 0's launcher says why" in node.stderr, node.stderr
        assert bad in node.stderr and "cannot reach MASTER_ADDR" in node.stderr, node.stderr


@pytest.fixture
def detached(cluster: TestCluster, tmp_path: Path) -> Iterator[DetachedPods]:
    made = DetachedPods(cluster, tmp_path)
    try:
        yield made
        left = made.leftovers()
    finally:
        made.stop()
        made.clear()
    assert left == {}, "processes left in the nodes' namespaces"


def test_detached_launch_check_checks_then_detaches_the_job(
    detached: DetachedPods, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ids = detached.detach_all(["sh", "-c", wrote(out)], *CHECK, *network(detached.cluster))
    assert "check: 3/3 host(s) ok" in detached.nodes[0].stderr, detached.nodes[0].stderr
    for rank, job_id in enumerate(ids):
        done = detached.run(rank, "wait", job_id)
        assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ran-0", "ran-1", "ran-2"]


def test_detached_a_failing_check_detaches_nothing(detached: DetachedPods, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    data_link(detached.cluster, 1, up=False)
    program = ["sh", "-c", wrote(out)]
    nodes = [detached.detach(k, program, *CHECK, *network(detached.cluster)) for k in range(3)]
    codes = [node.wait(90) for node in nodes]
    assert codes == [3, 3, 3], [n.stderr for n in nodes]
    bad = detached.cluster.hosts[1].name
    assert all(bad in node.stderr for node in nodes), [n.stderr for n in nodes]
    assert list(out.iterdir()) == []
    for rank in range(3):  # no job was handed to a supervisor
        listed = detached.run(rank, "jobs", "--format", "json")
        assert listed.returncode == 0 and '"id"' not in listed.stdout, listed.stdout
