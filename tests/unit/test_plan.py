"""The planner: layout, NUMA split, devices, defaults, groups, and refusals."""

from pathlib import Path

import pytest

from poprun_py.core.hosts import HostEntry, parse_hosts
from poprun_py.core.plan import make_plan, replan_with_topologies
from poprun_py.core.shard import InputSet
from poprun_py.core.spec import ClusterSpec, Defaults, JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.errors import PlanError
from poprun_py.prepare.specfile import load_cluster

POD16 = str(Path(__file__).resolve().parents[2] / "clusters" / "pod16.yaml")

POD = uniform(8, 16, 2)  # 8 NUMA nodes x 16 CPUs, 2 devices each


def cluster(expr: str = "h[1-2]", topo=POD) -> ClusterSpec:
    return cluster_from_hosts(parse_hosts(expr), topology=topo)


def job(replicas: int, instances: int | None = None, **kw: object) -> JobSpec:
    return JobSpec(("train.py",), replicas=replicas, instances=instances, **kw)  # type: ignore[arg-type]


def test_replicas_split_over_instances_and_instances_over_hosts() -> None:
    plan = make_plan(cluster("h[1-2]"), job(8, 4))
    got = [
        (i.index, i.host, i.local_index, i.replica_offset, i.num_local_replicas)
        for i in plan.instances
    ]
    assert got == [(0, "h1", 0, 0, 2), (1, "h1", 1, 2, 2), (2, "h2", 0, 4, 2), (3, "h2", 1, 6, 2)]


def test_poprun_example_16_instances_64_replicas_on_16_hosts() -> None:
    spec = load_cluster(POD16)
    plan = make_plan(spec, job(64, 16, devices_per_replica=4))
    assert {i.num_local_replicas for i in plan.instances} == {4}
    first = plan.instances[0]
    assert first.numa_nodes == tuple(range(8)) and first.devices == tuple(range(16))


def test_spreadnuma_divides_nodes_evenly() -> None:
    plan = make_plan(cluster("h1"), job(4, 4))
    assert [i.numa_nodes for i in plan.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert plan.instances[1].cpus == tuple(range(32, 64))


def test_more_instances_than_nodes_share_and_split_cpus() -> None:
    plan = make_plan(cluster("h1", uniform(2, 4)), job(4, 4))
    assert [i.numa_nodes for i in plan.instances] == [(0,), (0,), (1,), (1,)]
    assert [i.cpus for i in plan.instances] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_no_numa_aware_means_no_binding() -> None:
    plan = make_plan(cluster("h1"), job(2, 2, numa_aware=False))
    assert all(i.cpus == () and i.numa_nodes == () for i in plan.instances)
    assert any("NUMA binding is off" in n for n in plan.notes)


def test_devices_assigned_in_order_per_instance() -> None:
    plan = make_plan(cluster("h1"), job(8, 2, devices_per_replica=2))
    assert plan.instances[0].devices == tuple(range(8))
    assert plan.instances[1].devices == tuple(range(8, 16))


def test_hosts_without_devices_get_none() -> None:
    plan = make_plan(cluster("h1", uniform(1, 2)), job(2, 2, devices_per_replica=4))
    assert all(i.devices == () for i in plan.instances)


def test_default_instances_one_per_host_and_shown() -> None:
    plan = make_plan(cluster("h[1-4]"), job(8))
    assert plan.num_instances == 4
    assert plan.instances_source == "default: one instance per host"


def test_default_instances_from_hostfile_slots() -> None:
    spec = cluster_from_hosts([HostEntry("a", 2), HostEntry("b", 2)], topology=POD)
    plan = make_plan(spec, job(8))
    assert plan.num_instances == 4 and plan.instances_source == "default: hostfile slots"


def test_default_instances_from_cluster_defaults() -> None:
    spec = cluster("h[1-2]")
    spec = ClusterSpec(name="c", hosts=spec.hosts, defaults=Defaults(instances=4))
    plan = make_plan(spec, job(8))
    assert plan.num_instances == 4 and "cluster c" in plan.instances_source


@pytest.mark.parametrize(
    ("replicas", "instances", "hosts", "extra", "message"),
    [
        (6, 4, "h1", {}, "not a multiple of --instances"),
        (8, 3, "h[1-2]", {}, "is not a multiple of --instances"),
        (4, 2, "h[1-4]", {}, "not a multiple of the number of hosts"),
        (2, 4, "h1", {}, "more instances (4) than replicas (2)"),
        (0, None, "h1", {}, "--replicas must be at least 1"),
        (4, 0, "h1", {}, "--instances must be at least 1"),
        (64, 2, "h1", {"devices_per_replica": 4}, "has 16 devices"),
        (8, 2, "h1", {"group_size": 3}, "not a multiple of --group-size"),
        (8, 2, "h1", {"group_size": 0}, "--group-size must be at least 1"),
        (2, 2, "h1", {"devices_per_replica": -1}, "--devices-per-replica"),
    ],
)
def test_impossible_plans_refused(replicas, instances, hosts, extra, message) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_plan(cluster(hosts), job(replicas, instances, **extra))


def test_groups_within_hosts() -> None:
    plan = make_plan(cluster("h[1-2]"), job(16, 4, group_size=4))
    assert not plan.groups_cross_hosts
    assert [i.groups for i in plan.instances] == [(0,), (1,), (2,), (3,)]


def test_groups_crossing_hosts_are_reported() -> None:
    plan = make_plan(cluster("h[1-4]"), job(8, 4, group_size=4))
    assert plan.groups_cross_hosts
    assert any("cross host boundaries" in n and "only 2 replica(s)" in n for n in plan.notes)


def test_instance_spanning_several_groups() -> None:
    plan = make_plan(cluster("h1"), job(8, 2, group_size=2))
    assert plan.instances[0].groups == (0, 1) and plan.instances[1].groups == (2, 3)


def test_shards_attached_to_instances() -> None:
    inputs = InputSet(tuple(f"/d/{i}" for i in range(10)), (1,) * 10)
    plan = make_plan(cluster("h[1-2]"), job(4, 2), inputs)
    files = [f for i in plan.instances for f in i.shard.files]
    assert sorted(files) == sorted(inputs.paths)


def test_eval_pad_without_inputs_refused() -> None:
    with pytest.raises(PlanError, match="--eval-pad needs input files"):
        make_plan(cluster("h1"), job(2, 2, eval_pad=4))


def test_replan_with_discovered_topology_keeps_shards() -> None:
    inputs = InputSet(("/a", "/b"), (1, 2))
    plan = make_plan(cluster("h[1-2]", None), job(4, 4), inputs)
    assert all(i.cpus == () for i in plan.instances)
    again = replan_with_topologies(plan, {"h1": uniform(2, 2), "h2": uniform(2, 2)})
    assert [i.cpus for i in again.instances] == [(0, 1), (2, 3), (0, 1), (2, 3)]
    assert [i.shard for i in again.instances] == [i.shard for i in plan.instances]
    assert {h.topology_source for h in again.hosts} == {"discovered"}


def test_plan_is_deterministic() -> None:
    assert make_plan(cluster("h[1-4]"), job(32, 8)) == make_plan(cluster("h[1-4]"), job(32, 8))


def test_sync_root_is_the_scripts_directory_never_an_argument_directory(tmp_path) -> None:
    from poprun_py.launch.launcher import sync_root

    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    plan = make_plan(cluster("h1"), JobSpec(("python", str(script), "--out", "/tmp"), 1, 1))
    assert sync_root(plan) == str(script.parent)
    plan = make_plan(
        cluster("h1"), JobSpec(("python", "-m", "x", "--data", "/"), 1, 1, workdir="/w")
    )
    assert sync_root(plan) == "/w"
