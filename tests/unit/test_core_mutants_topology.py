"""Topology text as hosts print it (cpulists, sysfs node names, ``lscpu -p`` with and without
its header or a NUMA column) and the faults, word for word.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
a rule the other tests let change unnoticed -- ``lscpu -p``'s comment header, an empty node
column (a machine without NUMA), an empty cpulist element, ``1 NUMA node`` in the singular.
"""

import pytest

from poprun_py.core.topology import (
    TopologyError,
    parse_cpulist,
    parse_lscpu,
    parse_sysfs_nodes,
    uniform,
)


def refusal(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(TopologyError) as caught:
        call(*args)
    return str(caught.value)


def nodes(text: str) -> list[tuple[int, tuple[int, ...]]]:
    return [(n.id, n.cpus) for n in parse_lscpu(text).numa_nodes]


def test_one_numa_node_is_described_in_the_singular() -> None:
    assert uniform(1, 2).describe() == "1 NUMA node, 2 CPUs, 0 devices"
    assert uniform(2, 2, 1).describe() == "2 NUMA nodes, 4 CPUs, 2 devices"


def test_an_empty_cpulist_element_is_skipped_not_the_end() -> None:
    assert parse_cpulist("0,,2-3,") == (0, 2, 3)


def test_cpulist_faults_are_one_line() -> None:
    assert refusal(parse_cpulist, "3-1") == "bad cpulist range '3-1': end before start"
    assert refusal(parse_cpulist, "0,x") == "bad cpulist element 'x' in '0,x'"


def test_sysfs_faults_are_one_line() -> None:
    assert refusal(parse_sysfs_nodes, {"cpu0": "0"}) == (
        "bad NUMA node name 'cpu0'; expected nodeN"
    )
    assert refusal(parse_sysfs_nodes, {}) == "no NUMA nodes found"


def test_lscpu_p_with_its_comment_header() -> None:
    text = (
        "# The following is the parsable format, which can be fed to other\n"
        "# programs. Each different item in every column has an unique ID\n"
        "# starting usually from zero.\n"
        "# CPU,Core,Socket,Node,,L1d,L1i,L2,L3\n"
        "0,0,0,0,,0,0,0,0\n"
        "1,1,0,1,,1,1,1,0\n"
    )
    assert nodes(text) == [(0, (0,)), (1, (1,))]


def test_lscpu_p_without_a_header_reads_cpu_core_socket_node_and_skips_blank_lines() -> None:
    assert nodes("2,0,0,1\n\n0,0,0,0\n1,1,0,1\n") == [(0, (0,)), (1, (1, 2))]


def test_an_empty_node_column_means_node_0() -> None:
    assert nodes("# CPU,Core,Socket,Node\n0,0,0,\n1,1,0,\n") == [(0, (0, 1))]


def test_lscpu_faults_are_one_line() -> None:
    assert refusal(parse_lscpu, "0,x,0,zero\n") == "bad lscpu line '0,x,0,zero'"
    assert refusal(parse_lscpu, "# CPU,Node\n") == "lscpu output lists no CPUs"
