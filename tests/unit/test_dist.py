"""poprun_py.dist: single-process defaults, agreement with env.instance_env, light imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py import dist
from poprun_py.core.env import instance_env, shard_text
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.shard import InputFile, InputSet
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("typer", "rich", "fabric", "paramiko", "jinja2", "pydantic", "poprun_py.cli")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No layout variable set, as in a program run on its own."""
    for name in dist.NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def a_plan() -> LaunchPlan:
    """2 hosts x 2 NUMA nodes, 4 instances, 8 replicas, groups of 4, 6 input files padded."""
    cluster = cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(2, 4, 2))
    files = InputSet.of([InputFile(f"/data/part-{i}", 100 - i) for i in range(6)])
    job = JobSpec(("t.py",), replicas=8, instances=4, group_size=4, eval_pad=2)
    return make_plan(cluster, job, files)


def test_defaults_describe_a_single_process(clean_env: pytest.MonkeyPatch) -> None:
    assert not dist.isPopdistEnvSet()
    assert (
        dist.getNumTotalReplicas(),
        dist.getNumInstances(),
        dist.getInstanceIndex(),
        dist.getLocalInstanceIndex(),
        dist.getNumLocalReplicas(),
        dist.getReplicaIndexOffset(),
        dist.getNumIpusPerReplica(),
    ) == (1, 1, 0, 0, 1, 0, 1)
    assert (dist.host_index(), dist.num_hosts(), dist.numa_nodes(), dist.cpus()) == (0, 1, (), ())
    assert (dist.shard_files(), dist.shard_padding()) == ([], 0)
    assert (dist.replica_groups(), dist.group_size()) == ((), 1)


def test_getters_read_what_instance_env_sets(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plan = a_plan()
    for inst in plan.instances:
        shard = tmp_path / f"shard-{inst.index}.txt"
        shard.write_text(shard_text(inst))
        for name, value in instance_env(plan, inst, str(shard)).items():
            clean_env.setenv(name, value)
        assert dist.isPopdistEnvSet() and dist.is_popdist_env_set()
        assert dist.num_total_replicas() == dist.getNumTotalReplicas() == 8
        assert dist.num_instances() == 4
        assert dist.instance_index() == dist.getInstanceIndex() == inst.index
        assert dist.local_instance_index() == inst.local_index
        assert dist.num_local_replicas() == inst.num_local_replicas == 2
        assert dist.replica_index_offset() == inst.replica_offset
        assert dist.num_devices_per_replica() == 1
        assert (dist.host_index(), dist.num_hosts(), dist.host_name()) == (
            inst.host_index,
            2,
            inst.host,
        )
        assert (dist.numa_nodes(), dist.cpus(), dist.devices()) == (
            inst.numa_nodes,
            inst.cpus,
            inst.devices,
        )
        assert dist.shard_files() == list(inst.shard.files)
        assert dist.shard_padding() == inst.shard.padding
        assert (dist.replica_groups(), dist.group_size()) == (inst.groups, 4)


def test_every_name_dist_reads_is_one_instance_env_sets() -> None:
    plan = a_plan()
    assert set(dist.NAMES) <= set(instance_env(plan, plan.instances[0], "/tmp/s"))


def test_importing_dist_pulls_in_no_heavy_module() -> None:
    code = "import json, sys, poprun_py.dist; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    loaded = json.loads(out)
    heavy = [m for m in loaded if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))]
    assert heavy == []
