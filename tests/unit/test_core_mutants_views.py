"""The plan's text views and JSON, character for character: the topology table (folded and
not), the per-instance and hardware tables, the summary and ``--format json``'s keys.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
what a user reads -- a range ``0-2`` against a single ``3``, the fold at 33 cells, the unit of a
byte count, a ``-`` for what an instance lacks -- that the other tests let change unnoticed.
"""

from dataclasses import replace

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.shard import InputSet, Shard
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology, uniform
from poprun_py.core.views import (
    hardware_lines,
    instance_lines,
    instance_row,
    plan_dict,
    summary_lines,
    topology_lines,
)

GPUS = Topology(
    (
        NumaNode(0, (0, 1, 2, 3), (0, 1), ("mlx5_0:1",)),
        NumaNode(1, (4, 5, 6, 7), (2, 3), ("mlx5_1:1",)),
    ),
    device_kind="nvidia",
)


def plan_of(hosts: str, replicas: int, instances: int) -> LaunchPlan:
    return make_plan(cluster_from_hosts(parse_hosts(hosts)), JobSpec(("t",), replicas, instances))


def gpu_plan() -> LaunchPlan:
    """Two GPU hosts on a --network, NIC affinity, groups of 2, five padded input files."""
    return make_plan(
        cluster_from_hosts(parse_hosts("h1,h2"), topology=GPUS),
        JobSpec(
            ("train.py", "--lr", "0.1"),
            replicas=8,
            instances=4,
            group_size=2,
            master_port=29600,
            network="10.0.0.0/8",
            nic_affinity=True,
            eval_pad=2,
        ),
        InputSet(("a", "b", "c", "d", "e"), (5000, 4000, 3000, 2000, 1000)),
        interfaces={"h1": ("eth1", "10.0.0.1"), "h2": ("eth2", "10.0.0.2")},
    )


def test_the_topology_table_spans_each_cell_over_its_children_whatever_their_widths() -> None:
    assert topology_lines(plan_of("h1,h2", 12, 4)) == [
        "| hosts     |           h1          |            h2           |",
        "| instances |     0     |     1     |     2     |      3      |",
        "| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 |",
    ]


def test_three_hosts_each_span_their_own_instances() -> None:
    assert topology_lines(plan_of("h1,h2,h3", 12, 6)) == [
        "| hosts     |       h1      |       h2      |        h3       |",
        "| instances |   0   |   1   |   2   |   3   |   4   |    5    |",
        "| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 | 11 |",
    ]


def test_up_to_32_replicas_and_instances_are_shown_one_cell_each() -> None:
    lines = topology_lines(plan_of("h1,h2", 32, 32))
    assert lines[1].endswith("| 30 | 31 |")
    assert lines[2].endswith("| 30 | 31 |")
    assert topology_lines(plan_of("h1", 32, 16))[2].endswith("| 29 | 30 | 31 |")


def test_over_32_replicas_fold_into_one_range_per_instance() -> None:
    assert topology_lines(plan_of("h1,h2", 34, 2)) == [
        "| hosts     |  h1  |   h2  |",
        "| instances |  0   |   1   |",
        "| replicas  | 0-16 | 17-33 |",
    ]


def test_over_32_instances_fold_into_one_range_per_host() -> None:
    assert topology_lines(plan_of("h1,h2,h3", 66, 33)) == [
        "| hosts     |  h1  |   h2  |   h3  |",
        "| instances | 0-10 | 11-21 | 22-32 |",
        "| replicas  | 0-21 | 22-43 | 44-65 |",
    ]


def test_the_instance_table_shows_ranges_cpulists_groups_and_padding() -> None:
    assert instance_lines(gpu_plan()) == [
        "instance  host  local  replicas  NUMA  CPUs  devices  groups  files      bytes",
        "0         h1    0      0-1       0     0-3   0-1      0       1 + 1 pad  4.9 KiB",
        "1         h1    1      2-3       1     4-7   2-3      1       1 + 1 pad  3.9 KiB",
        "2         h2    0      4-5       0     0-3   0-1      2       1 + 1 pad  2.9 KiB",
        "3         h2    1      6-7       1     4-7   2-3      3       2          2.9 KiB",
    ]


def test_an_unbound_instance_shows_dashes_and_several_groups_with_commas() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(1, 2, 2)),
        JobSpec(("t",), 6, 2, group_size=2, numa_aware=False, devices_per_replica=0),
    )
    assert instance_lines(plan) == [
        "instance  host  local  replicas  NUMA  CPUs  devices  groups  files  bytes",
        "0         h1    0      0-2       -     -     -        0,1     0      0 B",
        "1         h2    0      3-5       -     -     -        1,2     0      0 B",
    ]


def test_the_instance_table_stops_at_its_limit_and_says_how_many_more() -> None:
    plan = plan_of("h[1-3]", 3, 3)
    lines = instance_lines(plan, limit=2)
    assert [line.split()[0] for line in lines[1:3]] == ["0", "1"]
    assert lines[1] == "0         h1    0      0         -     -     -        -       0      0 B"
    assert lines[3:] == ["... and 1 more instances (--format json)"]
    assert len(instance_lines(plan, limit=3)) == 4
    assert instance_lines(plan_of("h1", 65, 65))[64:] == [
        "63        h1    63     63        -     -     -        -       0      0 B",
        "... and 1 more instances (--format json)",
    ]
    assert len(instance_lines(plan_of("h1", 64, 64))) == 1 + 64


def test_bytes_are_shown_in_binary_units_up_to_tib() -> None:
    inst = plan_of("h1", 1, 1).instances[0]
    shown = {
        n: instance_row(plan_of("h1", 1, 1), replace(inst, shard=Shard(("f",), n)))[-1]
        for n in (0, 1023, 1024, 2048, 1536 * 1024, 1024**2, 1024**3, 1024**4, 2 * 1024**5)
    }
    assert shown == {
        0: "0 B",
        1023: "1023 B",
        1024: "1.0 KiB",
        2048: "2.0 KiB",
        1536 * 1024: "1.5 MiB",
        1024**2: "1.0 MiB",
        1024**3: "1.0 GiB",
        1024**4: "1.0 TiB",
        2 * 1024**5: "2048.0 TiB",
    }


def test_the_hardware_table_lists_each_instances_variables_and_dashes_for_missing_ones() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h[1-3]"), topology=uniform(1, 2, 2)),
        JobSpec(("t",), 3, 3),
        interfaces={"h2": ("eth0", "10.0.0.2")},
    )
    assert hardware_lines(plan, limit=2) == [
        "",
        "instance  host  GLOO_SOCKET_IFNAME  NCCL_SOCKET_IFNAME  UCX_NET_DEVICES",
        "0         h1    -                   -                   -",
        "1         h2    eth0                eth0                eth0",
    ]
    assert len(hardware_lines(plan)) == 2 + 3


def test_the_hardware_table_of_many_instances_stops_at_64() -> None:
    cluster = cluster_from_hosts(parse_hosts("h1"), topology=uniform(1, 65, 0))
    plan = make_plan(cluster, JobSpec(("t",), 65, 65), interfaces={"h1": ("eth0", "10.0.0.1")})
    assert len(hardware_lines(plan)) == 2 + 64


def test_an_empty_device_list_is_shown_as_two_quotes() -> None:
    topo = replace(uniform(1, 2, 2), device_kind="nvidia")
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1"), topology=topo),
        JobSpec(("t",), 1, 1, devices_per_replica=0),
    )
    assert hardware_lines(plan) == [
        "",
        "instance  host  CUDA_VISIBLE_DEVICES  CUDA_DEVICE_ORDER",
        "0         h1    ''                    PCI_BUS_ID",
    ]


def test_the_summary_states_sizes_sources_numa_groups_network_and_notes() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(1, 2, 2)),
        JobSpec(("t",), 6, 2, group_size=2, numa_aware=False, devices_per_replica=0),
    )
    assert summary_lines(plan) == [
        "6 replicas on 2 instances (--instances) on 2 host(s); 3 replica(s) per instance, "
        "0 device(s) per replica",
        "topology: declared; NUMA-aware: no",
        "replica groups of 2: cross hosts",
        "network: none chosen (no --network): MASTER_ADDR is h1's SSH address (h1); "
        "Gloo and NCCL pick their own interface",
        "note: replica groups of 2 cross host boundaries: 3 replicas per host is not a multiple "
        "of 2",
        "note: NUMA binding is off (--no-numa-aware): instances are not bound",
    ]
    assert summary_lines(gpu_plan())[1:4] == [
        "topology: declared; NUMA-aware: yes",
        "replica groups of 2: stay within hosts",
        "network: 10.0.0.0/8 (--network): interface(s) eth1, eth2; MASTER_ADDR 10.0.0.1",
    ]


def test_the_summary_lists_every_topology_source_once_in_order() -> None:
    cluster = cluster_from_hosts(parse_hosts("h1,h2,h3"))
    cluster = replace(cluster, hosts=(replace(cluster.hosts[0], topology=GPUS), *cluster.hosts[1:]))
    plan = make_plan(cluster, JobSpec(("t",), 3, 3), default_topology=uniform(1, 2))
    assert summary_lines(plan)[1] == "topology: assumed, declared; NUMA-aware: yes"


def test_the_plan_json_has_every_documented_key() -> None:
    data = plan_dict(gpu_plan())
    node = {"id": 0, "cpus": [0, 1, 2, 3], "devices": [0, 1], "nics": ["mlx5_0:1"]}
    node1 = {"id": 1, "cpus": [4, 5, 6, 7], "devices": [2, 3], "nics": ["mlx5_1:1"]}
    assert {k: v for k, v in data.items() if k not in ("hosts", "instances")} == {
        "num_replicas": 8,
        "num_instances": 4,
        "instances_source": "--instances",
        "devices_per_replica": 1,
        "numa_aware": True,
        "group_size": 2,
        "groups_cross_hosts": False,
        "master_addr": "10.0.0.1",
        "master_port": 29600,
        "program": ["train.py", "--lr", "0.1"],
        "notes": [],
        "network": "10.0.0.0/8",
        "network_choice": "10.0.0.0/8 (--network): interface(s) eth1, eth2; MASTER_ADDR 10.0.0.1",
        "device_env": None,
        "nic_affinity": True,
    }
    assert data["hosts"][1] == {
        "index": 1,
        "name": "h2",
        "address": "h2",
        "slots": None,
        "topology_source": "declared",
        "device_kind": "nvidia",
        "interface": ["eth2", "10.0.0.2"],
        "numa_nodes": [node, node1],
        "instances": [2, 3],
    }
    assert data["instances"][3] == {
        "hardware_env": {
            "CUDA_VISIBLE_DEVICES": "2,3",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "NCCL_IB_HCA": "=mlx5_1:1",
            "UCX_NET_DEVICES": "mlx5_1:1",
            "GLOO_SOCKET_IFNAME": "eth2",
            "NCCL_SOCKET_IFNAME": "eth2",
        },
        "index": 3,
        "host": "h2",
        "host_index": 1,
        "local_index": 1,
        "num_local_instances": 2,
        "replica_offset": 6,
        "num_local_replicas": 2,
        "numa_nodes": [1],
        "cpus": [4, 5, 6, 7],
        "devices": [2, 3],
        "groups": [3],
        "shard": {"files": ["d", "e"], "bytes": 3000, "padding": 0},
    }


def test_a_host_without_topology_or_interface_has_nulls_in_the_json() -> None:
    host = plan_dict(plan_of("h1", 1, 1))["hosts"][0]
    assert (host["device_kind"], host["interface"], host["numa_nodes"]) == (None, None, [])


def test_a_host_name_longer_than_its_cells_widens_them_and_every_row_stays_aligned() -> None:
    from poprun_py.core.hosts import parse_hosts
    from poprun_py.core.plan import make_plan
    from poprun_py.core.spec import JobSpec, cluster_from_hosts
    from poprun_py.core.views import topology_lines

    cluster = cluster_from_hosts(parse_hosts("a-rather-long-host-name-01,h2"))
    lines = topology_lines(make_plan(cluster, JobSpec(("t",), replicas=8, instances=4)))
    assert lines == [
        "| hosts     | a-rather-long-host-name-01 |       h2      |",
        "| instances |      0       |      1      |   2   |   3   |",
        "| replicas  |   0   |  1   |  2   |  3   | 4 | 5 | 6 | 7 |",
    ]
