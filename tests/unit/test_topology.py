"""Topology parsers: cpulists, sysfs trees (1-node and 8-node fixtures), lscpu output."""

from pathlib import Path

import pytest

from poprun_py.core.topology import (
    TopologyError,
    format_cpulist,
    parse_cpulist,
    parse_lscpu,
    parse_sysfs_nodes,
    uniform,
)
from poprun_py.prepare.discover import discover_local, parse_node_lines, read_sysfs

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", (0,)),
        ("0-3", (0, 1, 2, 3)),
        ("0-1,8-9\n", (0, 1, 8, 9)),
        ("0-7:2", (0, 2, 4, 6)),
        ("3,1,2", (1, 2, 3)),
        ("", ()),
    ],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["a", "3-1", "1--2", "0-"])
def test_parse_cpulist_refuses_garbage(bad: str) -> None:
    with pytest.raises(TopologyError):
        parse_cpulist(bad)


def test_format_cpulist_round_trips() -> None:
    cpus = (0, 1, 2, 5, 7, 8, 9)
    assert format_cpulist(cpus) == "0-2,5,7-9"
    assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_one_node_fixture_tree() -> None:
    topo = read_sysfs(FIXTURES / "sysfs-1node")
    assert [n.id for n in topo.numa_nodes] == [0]
    assert topo.cpus == (0, 1)


def test_eight_node_fixture_tree_two_sockets_with_hyperthreads() -> None:
    topo = read_sysfs(FIXTURES / "sysfs-8node")
    assert [n.id for n in topo.numa_nodes] == list(range(8))
    assert topo.numa_nodes[3].cpus == tuple(range(48, 64)) + tuple(range(176, 192))
    assert len(topo.cpus) == 256


def test_nodes_sorted_numerically_not_lexically() -> None:
    topo = parse_sysfs_nodes({f"node{i}": str(i) for i in (10, 2, 1)})
    assert [n.id for n in topo.numa_nodes] == [1, 2, 10]


def test_lscpu_output() -> None:
    topo = parse_lscpu((FIXTURES / "lscpu-2node.txt").read_text())
    assert [(n.id, n.cpus) for n in topo.numa_nodes] == [(0, (0, 1)), (1, (2, 3))]


def test_lscpu_without_node_column_is_one_node() -> None:
    topo = parse_lscpu("# CPU,Core\n0,0\n1,1\n")
    assert [(n.id, n.cpus) for n in topo.numa_nodes] == [(0, (0, 1))]


def test_remote_script_output_parser() -> None:
    topo = parse_node_lines("node0 0-3\nnode1 4-7\n")
    assert [n.cpus for n in topo.numa_nodes] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_local_discovery_sees_this_machine() -> None:
    import os

    topo = discover_local()
    assert set(os.sched_getaffinity(0)) <= set(topo.cpus)


def test_uniform_topology_devices() -> None:
    topo = uniform(2, 4, 2)
    assert topo.devices == (0, 1, 2, 3)
    assert topo.numa_nodes[1].cpus == (4, 5, 6, 7)
