"""The launch plan: what a replan after discovery keeps and what it redoes, and the notes and
faults a user reads, word for word.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
a rule the other tests let change unnoticed -- every job setting surviving a replan, the notes
a replan drops or redoes, the host a replica-group note names, ``, ...`` after four hosts, the
NUMA nodes a device fault lists.
"""

from dataclasses import replace

import pytest

from poprun_py.core.hosts import HostEntry, parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan, network_choice, replan_with_topologies
from poprun_py.core.shard import InputSet
from poprun_py.core.spec import ClusterSpec, Defaults, EnvVar, JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology, uniform
from poprun_py.errors import PlanError

NETS = {"h1": ("eth1", "10.0.0.1"), "h2": ("eth1", "10.0.0.2")}


def assumed_plan(**job: object) -> LaunchPlan:
    """Two hosts of undeclared topology (this machine's assumed), every job setting given."""
    spec = JobSpec(
        ("t.py", "x"),
        4,
        2,
        devices_per_replica=0,
        group_size=4,
        env=(EnvVar("A", "1"),),
        workdir="/w",
        eval_pad=1,
        master_port=29700,
        network="10.0.0.0/8",
        device_env="MY_DEVS",
        nic_affinity=True,
    )
    return make_plan(
        cluster_from_hosts(parse_hosts("h1,h2")),
        replace(spec, **job),  # type: ignore[arg-type]
        InputSet(("a", "b", "c"), (3, 2, 1)),
        default_topology=uniform(1, 4),
    )


def test_a_replan_keeps_every_job_setting_and_each_instances_shard() -> None:
    plan = assumed_plan()
    unplaced = replace(uniform(2, 2, 1), devices_placed=False)
    again = replan_with_topologies(plan, {"h1": unplaced, "h2": unplaced}, NETS)
    kept = [
        *("program", "num_replicas", "num_instances", "devices_per_replica", "numa_aware"),
        *("instances_source", "group_size", "groups_cross_hosts", "env", "workdir"),
        *("master_port", "eval_pad", "network", "device_env", "nic_affinity"),
    ]
    assert {k: getattr(again, k) for k in kept} == {k: getattr(plan, k) for k in kept}
    assert [i.shard for i in again.instances] == [i.shard for i in plan.instances]
    assert [h.topology_source for h in again.hosts] == ["discovered", "discovered"]
    assert [i.numa_nodes for i in again.instances] == [(0, 1), (0, 1)]
    assert (again.master_addr, dict(again.interfaces)) == ("10.0.0.1", NETS)


def test_a_replan_drops_the_assumed_note_and_redoes_the_topology_notes() -> None:
    plan = assumed_plan()
    assert plan.notes == (
        "topology of 2 host(s) not declared; assumed to match this machine "
        "(1 NUMA node, 4 CPUs, 0 devices)",
        "replica groups of 4 cross host boundaries: each host has only 2 replica(s)",
        "binding would change nothing on h1, h2 (one NUMA node holds every CPU): those "
        "instances are not bound",
    )
    unplaced = replace(uniform(2, 2, 1), devices_placed=False)
    again = replan_with_topologies(plan, {"h1": unplaced, "h2": unplaced})
    assert again.notes == (
        "replica groups of 4 cross host boundaries: each host has only 2 replica(s)",
        "binding would change nothing on h1, h2 (an instance holds every CPU): those "
        "instances are not bound",
        "devices of h1, h2: the firmware reports numa_node -1; spread over the NUMA nodes in order",
    )


def test_a_replan_keeps_the_notes_of_the_inputs_and_the_defaults_source() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1,h2")),
        JobSpec(("t",), 2, numa_aware=False),
        InputSet(("a",), (1,)),
    )
    again = replan_with_topologies(plan, {"h1": uniform(2, 2), "h2": uniform(2, 2)})
    assert (
        again.notes
        == plan.notes
        == (
            "NUMA binding is off (--no-numa-aware): instances are not bound",
            "1 of 2 instances gets no input files (1 files for 2 instances): instance 1",
        )
    )
    assert (again.instances_source, again.numa_aware) == ("default: one instance per host", False)
    assert [i.cpus for i in again.instances] == [(), ()]


def test_a_replan_with_nothing_new_is_the_same_plan() -> None:
    plan = assumed_plan()
    assert replan_with_topologies(plan, {}) is plan
    assert replan_with_topologies(plan, {"h1": None}) is plan
    declared = make_plan(
        cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(1, 4)), JobSpec(("t",), 2)
    )
    assert replan_with_topologies(declared, {"h1": uniform(2, 2)}) is declared
    networked = replan_with_topologies(plan, {}, NETS)
    assert replan_with_topologies(networked, {}, dict(NETS)) is networked


def test_a_replan_for_the_network_alone_finds_the_new_master_address() -> None:
    plan = assumed_plan()
    assert plan.master_addr == "h1"
    again = replan_with_topologies(plan, {}, NETS)
    assert (again.master_addr, dict(again.interfaces)) == ("10.0.0.1", NETS)
    assert again.hosts[0].topology_source == "unknown"  # after discovery nothing is assumed


def test_a_replan_for_topologies_alone_keeps_the_interfaces_found_before() -> None:
    networked = replan_with_topologies(assumed_plan(), {}, NETS)
    again = replan_with_topologies(networked, {"h2": uniform(2, 2)})
    assert (again.master_addr, dict(again.interfaces)) == ("10.0.0.1", NETS)
    assert [h.topology_source for h in again.hosts] == ["unknown", "discovered"]


def test_the_network_note_says_this_machine_when_every_host_is_local() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("localhost")), JobSpec(("t",)))
    assert network_choice(plan) == (
        "none chosen (no --network): MASTER_ADDR is this machine (localhost); "
        "Gloo and NCCL pick their own interface"
    )


def test_the_group_note_names_the_first_host_whose_replicas_are_not_a_multiple() -> None:
    cluster = cluster_from_hosts([HostEntry("h1", 2), HostEntry("h2", 1), HostEntry("h3", 1)])
    plan = make_plan(cluster, JobSpec(("t",), 4, group_size=2))
    assert (
        "replica groups of 2 cross host boundaries: host h2 has 1 replica(s), not a multiple of 2"
        in plan.notes
    )


def test_the_group_note_says_why_when_every_host_has_as_many_replicas() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1,h2")), JobSpec(("t",), 6, 2, group_size=2))
    assert plan.notes == (
        "replica groups of 2 cross host boundaries: 3 replicas per host is not a multiple of 2",
    )


def slots_fault(count: int) -> str:
    hosts = [HostEntry(f"h{k}", 1) for k in range(1, count + 1)]
    with pytest.raises(PlanError) as caught:
        make_plan(cluster_from_hosts(hosts), JobSpec(("t",), 8, 8))
    return str(caught.value)


def test_a_slots_fault_shows_four_hosts_then_an_ellipsis() -> None:
    assert slots_fault(4) == (
        "the hosts' slots add up to 4 (h1 1, h2 1, h3 1, h4 1), not to --instances 8"
    )
    assert slots_fault(5) == (
        "the hosts' slots add up to 5 (h1 1, h2 1, h3 1, h4 1, ...), not to --instances 8"
    )


def test_a_device_fault_lists_the_numa_nodes_of_the_instance() -> None:
    topo = Topology(
        (
            NumaNode(0, (0,)),
            NumaNode(1, (1,)),
            NumaNode(2, (2,), (0, 1)),
            NumaNode(3, (3,), (2, 3)),
        )
    )
    cluster = cluster_from_hosts(parse_hosts("h1"), topology=topo)
    with pytest.raises(PlanError) as caught:
        make_plan(cluster, JobSpec(("t",), 4, 2))
    assert str(caught.value) == (
        "host h1: NUMA node(s) 0,1 give 0 device(s) per instance; 2 replica(s) x 1 device(s) "
        "need 2 (fewer devices per replica, or fewer instances per host)"
    )


def plan_fault(cluster: ClusterSpec, job: JobSpec, **kw: object) -> str:
    with pytest.raises(PlanError) as caught:
        make_plan(cluster, job, **kw)  # type: ignore[arg-type]
    return str(caught.value)


def test_plan_faults_are_one_line_each() -> None:
    one = cluster_from_hosts(parse_hosts("h1"))
    assert plan_fault(ClusterSpec("c", ()), JobSpec(("t",))) == "no hosts to run on"
    assert plan_fault(one, JobSpec(("t",), eval_pad=2)) == "--eval-pad needs input files (--input)"
    assert plan_fault(one, JobSpec(("t",), 4, 2), default_topology=uniform(1, 2, 2)) == (
        "host h1 has 2 devices; 2 instance(s) x 2 replica(s) x 1 device(s) need 4"
    )
    two = replace(
        cluster_from_hosts(parse_hosts("h1,h2")), name="c", defaults=Defaults(instances=3)
    )
    assert plan_fault(two, JobSpec(("t",), 3)) == (
        "3 instances (default of cluster c) is not a multiple of the number of hosts (2)"
    )


def test_without_numa_awareness_instances_take_their_devices_in_order() -> None:
    cluster = cluster_from_hosts(parse_hosts("h1"), topology=uniform(2, 2, 2))
    plan = make_plan(cluster, JobSpec(("t",), 4, 2, numa_aware=False))
    assert [i.devices for i in plan.instances] == [(0, 1), (2, 3)]


@pytest.mark.parametrize(
    ("count", "unbound", "unplaced"),
    [(3, "h1, h2, h3", "h1, h2, h3"), (5, "h1, h2, h3 (+2)", "h1, h2, h3 (+2)")],
)
def test_notes_name_three_hosts_then_say_how_many_more(
    count: int, unbound: str, unplaced: str
) -> None:
    topo = replace(uniform(1, 2, 1), devices_placed=False)
    cluster = cluster_from_hosts(parse_hosts(f"h[1-{count}]"), topology=topo)
    assert make_plan(cluster, JobSpec(("t",), count, count)).notes == (
        f"binding would change nothing on {unbound} (one NUMA node holds every CPU): those "
        "instances are not bound",
        f"devices of {unplaced}: the firmware reports numa_node -1; spread over the NUMA nodes "
        "in order",
    )
