"""Issue 20, item 10: hostfile and spec ``slots`` place instances per host.

Each host runs its slots' worth of instances; local ranks, ``LOCAL_WORLD_SIZE`` and the NUMA
division follow per host, the plan shows it, and every backend's rendered commands follow.
Slots that do not add up to ``--instances`` are one line, exit 2.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.backends.slurm import slurm_request
from poprun_py.backends.slurm_alloc import SlurmRequest, request_options
from poprun_py.cli import run
from poprun_py.core.plan import LaunchPlan, make_plan, replan_with_topologies
from poprun_py.core.spec import ClusterSpec, HostSpec, JobSpec
from poprun_py.core.topology import uniform
from poprun_py.core.views import plan_dict, topology_lines
from poprun_py.errors import PlanError
from poprun_py.launch import launcher
from poprun_py.prepare.job import LaunchOptions, prepare, spares_only, with_hosts_replaced
from poprun_py.render.job import render_job


def hostfile(tmp_path: Path, *slots: int) -> str:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"198.18.0.{21 + k} slots={n}\n" for k, n in enumerate(slots)))
    return f"@{path}"


def plan_of(tmp_path: Path, *slots: int, **opts: object) -> LaunchPlan:
    options = LaunchOptions(program=("t",), hosts=hostfile(tmp_path, *slots), **opts)  # type: ignore[arg-type]
    return prepare(options, environ={}).plan


def per_host(plan: LaunchPlan) -> list[list[tuple[int, int, int]]]:
    """Per host: (index, local_index, num_local_instances) of its instances."""
    return [
        [
            (i, plan.instances[i].local_index, plan.instances[i].num_local_instances)
            for i in h.instances
        ]
        for h in plan.hosts
    ]


def test_slots_3_and_1_put_3_instances_on_the_first_host(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 3, 1, replicas=8)
    assert per_host(plan) == [[(0, 0, 3), (1, 1, 3), (2, 2, 3)], [(3, 0, 1)]]
    assert [(i.replica_offset, i.num_local_replicas) for i in plan.instances] == [
        (0, 2),
        (2, 2),
        (4, 2),
        (6, 2),
    ]
    assert any("198.18.0.21 3, 198.18.0.22 1" in n for n in plan.notes), plan.notes


def test_slots_3_and_2_make_5_instances_with_no_fault(tmp_path: Path) -> None:
    """They gave "--instances 5 is not a multiple of the number of hosts (2)"."""
    plan = plan_of(tmp_path, 3, 2)
    assert plan.num_instances == 5 and [len(h.instances) for h in plan.hosts] == [3, 2]


@pytest.mark.parametrize(
    ("slots", "args", "fault"),
    [
        (
            (3, 2),
            ["-n", "4"],
            "the hosts' slots add up to 5 (198.18.0.21 3, 198.18.0.22 2), not to --instances 4",
        ),
        ((3, 1), ["-n", "8", "-r", "8"], "add up to 4"),
    ],
)
def test_slots_that_do_not_add_up_are_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    slots: tuple[int, ...],
    args: list[str],
    fault: str,
) -> None:
    marker = tmp_path / "ran"
    argv = ["launch", "-b", "local", "-H", hostfile(tmp_path, *slots), *args]
    code = run([*argv, "--", "touch", str(marker)])  # local: no host is reached either way
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fault in err, err
    assert not marker.exists()


def test_slots_for_some_hosts_only_are_refused() -> None:
    cluster = ClusterSpec("c", (HostSpec("a", slots=2), HostSpec("b")))
    with pytest.raises(PlanError, match="host a has slots but host b has none"):
        make_plan(cluster, JobSpec(("t",), replicas=2))


def test_a_spec_default_that_does_not_divide_names_the_spec_not_a_flag() -> None:
    cluster = ClusterSpec("c", (HostSpec("a"), HostSpec("b")))
    cluster = replace(cluster, defaults=replace(cluster.defaults, instances=3))
    with pytest.raises(PlanError) as err:
        make_plan(cluster, JobSpec(("t",), replicas=3))
    assert "--instances" not in str(err.value) and "default of cluster c" in str(err.value)


def test_numa_division_and_devices_are_per_host() -> None:
    topo = uniform(2, 4, 2)  # 2 NUMA nodes x 4 CPUs, 2 devices each
    hosts = (HostSpec("a", slots=2, topology=topo), HostSpec("b", slots=1, topology=topo))
    plan = make_plan(ClusterSpec("c", hosts), JobSpec(("t",), replicas=3))
    a0, a1, b0 = plan.instances
    assert (a0.numa_nodes, a1.numa_nodes, b0.numa_nodes) == ((0,), (1,), (0, 1))
    assert (a0.devices, a1.devices, b0.devices) == ((0,), (2,), (0,))
    with pytest.raises(PlanError, match="host a has 4 devices; 2 instance"):
        make_plan(ClusterSpec("c", hosts), JobSpec(("t",), replicas=6, devices_per_replica=3))


def test_replica_groups_cross_hosts_when_a_host_s_share_does_not_divide() -> None:
    hosts = (HostSpec("a", slots=3), HostSpec("b", slots=1))
    plan = make_plan(ClusterSpec("c", hosts), JobSpec(("t",), replicas=4, group_size=2))
    assert plan.groups_cross_hosts
    assert "host a has 3 replica(s), not a multiple of 2" in " ".join(plan.notes)
    even = make_plan(ClusterSpec("c", hosts), JobSpec(("t",), replicas=8, group_size=2))
    assert not even.groups_cross_hosts


def test_the_plan_shows_each_host_s_share(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 3, 1, replicas=8)
    data = plan_dict(plan)
    assert [(h["slots"], h["instances"]) for h in data["hosts"]] == [(3, [0, 1, 2]), (1, [3])]
    assert [i["num_local_instances"] for i in data["instances"]] == [3, 3, 3, 1]
    assert topology_lines(plan)[1].count("|") == 6  # 4 instance cells between the borders
    big = plan_of(tmp_path, 30, 10)  # folded: one cell a host
    assert [c.strip() for c in topology_lines(big)[1].split("|")[2:4]] == ["0-29", "30-39"]


def test_the_plan_json_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "-H", hostfile(tmp_path, 1, 2), "-f", "json", "t"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [len(h["instances"]) for h in data["hosts"]] == [1, 2]


def test_a_replan_with_topologies_keeps_each_host_s_share(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, 3, 1, backend="ssh")
    found = {h.name: uniform(2, 2) for h in plan.hosts}
    again = replan_with_topologies(plan, found)
    assert per_host(again) == per_host(plan)


def rendered(tmp_path: Path, backend: str, *slots: int) -> tuple[LaunchPlan, str, dict[int, str]]:
    """The plan, the launcher's text with its files, and each instance's LOCAL_WORLD_SIZE."""
    prep = prepare(
        LaunchOptions(program=("t",), hosts=hostfile(tmp_path, *slots), backend=backend),
        environ={},
    )
    job = launcher.render(prep, str(tmp_path / "job"), {})
    text = " ".join(job.launcher) + "\n" + "\n".join(job.files.values())
    sizes = {c.index: dict(c.env)["LOCAL_WORLD_SIZE"] for c in job.instances}
    return prep.plan, text, sizes


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec", "slurm", "local"])
def test_every_backend_renders_each_host_s_share(tmp_path: Path, backend: str) -> None:
    _, text, sizes = rendered(tmp_path, backend, 3, 1)
    assert sizes == {0: "3", 1: "3", 2: "3", 3: "1"}
    expected = {
        "mpirun": ["198.18.0.21 slots=3\n198.18.0.22 slots=1", "-host 198.18.0.21:3"],
        "mpiexec": ["198.18.0.21:3\n198.18.0.22:1"],
        "slurm": ["--ntasks=4 --ntasks-per-node=3", "198.18.0.21\n" * 3 + "198.18.0.22\n"],
    }.get(backend, [])
    for part in expected:
        assert part in text, (part, text)


def test_srun_binds_per_task_only_when_every_host_runs_as_many(tmp_path: Path) -> None:
    topo = uniform(2, 4)
    hosts = (HostSpec("a", slots=2, topology=topo), HostSpec("b", slots=1, topology=topo))
    plan = make_plan(ClusterSpec("c", hosts), JobSpec(("t",), replicas=3))
    job = render_job(plan, "slurm", job_dir=str(tmp_path))
    assert "--cpu-bind=none" in job.launcher and "--ntasks-per-node=2" in job.launcher


def test_slurm_requests_the_most_tasks_a_node_runs(tmp_path: Path) -> None:
    prep = prepare(
        LaunchOptions(program=("t",), hosts=hostfile(tmp_path, 3, 1), backend="slurm"),
        environ={},
    )
    assert request_options(slurm_request(prep))[:3] == [
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=3",
    ]
    assert request_options(SlurmRequest(2, 4))[:3] == [
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
    ]


def test_a_spare_takes_the_lost_host_s_share(tmp_path: Path) -> None:
    path = tmp_path / "hf"
    path.write_text("a slots=2\nb slots=1\nc slots=5\n")
    prep = prepare(
        LaunchOptions(program=("t",), hosts=f"@{path}", spare_hosts="1", backend="ssh"),
        environ={},
    )
    again = with_hosts_replaced(prep, {"b": "c"})
    assert [(h.name, len(h.instances)) for h in again.plan.hosts] == [("a", 2), ("c", 1)]
    checked = spares_only(prep)
    assert checked is not None and [len(h.instances) for h in checked.plan.hosts] == [1]
