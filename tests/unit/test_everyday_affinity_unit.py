"""A machine's topology is what a process may use there: the CPUs of its affinity (``taskset``, a
cgroup's cpuset, a Slurm allocation), as hwloc and Open MPI see it. Binding an instance to a CPU
outside them fails (``numactl: <1> is invalid``) or escapes the user's ``taskset``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from poprun_py.core.topology import NumaNode, Topology, parse_sysfs_nodes, uniform, within
from poprun_py.preflight.probes import Checks, checks_argv, parse_check_output
from poprun_py.prepare.discover import discover_local, discover_machine, read_sysfs
from tests.unit.in_child import in_child

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CPU = min(os.sched_getaffinity(0))


def test_within_keeps_each_nodes_allowed_cpus_and_drops_a_node_left_empty() -> None:
    topo = uniform(2, 4)  # node0 0-3, node1 4-7
    assert within(topo, {1, 2}) == Topology((NumaNode(0, (1, 2)),))
    assert within(topo, {3, 4}) == Topology((NumaNode(0, (3,)), NumaNode(1, (4,))))
    assert within(topo, range(8)) == topo


def test_within_keeps_a_node_with_devices_and_a_memory_only_node() -> None:
    topo = Topology((NumaNode(0, (0, 1)), NumaNode(1, (2, 3), devices=(0,)), NumaNode(2, ())))
    assert within(topo, {0}).numa_nodes == (
        NumaNode(0, (0,)),
        NumaNode(1, (), devices=(0,)),  # its GPU is still there, and still on node 1
        NumaNode(2, ()),
    )


def test_within_a_set_that_names_none_of_the_cpus_leaves_the_topology_whole() -> None:
    topo = uniform(2, 2)
    assert within(topo, {7, 8}) is topo
    assert within(topo, ()) is topo


def test_the_check_scripts_topology_is_cut_to_the_logins_cpus() -> None:
    checks = Checks()
    argv = checks_argv(checks, numactl=False)
    pinned = ["taskset", "-c", str(CPU), *argv]
    out = subprocess.run(pinned, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert f"allowed {CPU}\n" in out.stdout
    _, report = parse_check_output("h1", checks, out.stdout)
    assert report.topology is not None
    assert report.topology.cpus == (CPU,)


def test_a_hosts_allowed_line_cuts_what_its_sysfs_says() -> None:
    sysfs = "/sys/devices/system/node/node{0}/cpulist:{1}\n"
    text = "allowed 2-3\ntopology sysfs\n" + sysfs.format(0, "0-1") + sysfs.format(1, "2-5")
    _, report = parse_check_output("h1", Checks(), text)
    assert report.topology == parse_sysfs_nodes({"node1": "2-3"})
    _, whole = parse_check_output("h1", Checks(), text.replace("allowed 2-3", "allowed x-"))
    assert whole.topology == parse_sysfs_nodes({"node0": "0-1", "node1": "2-5"})


def test_this_machines_topology_is_cut_to_this_processs_affinity() -> None:
    def pinned() -> tuple[tuple[int, ...], tuple[int, ...]]:
        os.sched_setaffinity(0, {CPU})
        return discover_local().cpus, discover_machine().cpus

    assert in_child(pinned) == ((CPU,), (CPU,))


def test_a_fixture_tree_is_another_machine_and_is_not_cut() -> None:
    def pinned() -> tuple[int, ...]:
        os.sched_setaffinity(0, {CPU})
        return discover_local(FIXTURES / "sysfs-8node").cpus

    assert in_child(pinned) == read_sysfs(FIXTURES / "sysfs-8node").cpus


def test_slurms_preflight_step_keeps_the_whole_node_to_compare_with_the_jobs_cpus() -> None:
    sysfs = "/sys/devices/system/node/node{0}/cpulist:{1}\n"
    text = "allowed 1\ntopology sysfs\n" + sysfs.format(0, "0-1")
    _, report = parse_check_output("n1", Checks(within_allowed=False), text)
    assert report.topology == parse_sysfs_nodes({"node0": "0-1"})
