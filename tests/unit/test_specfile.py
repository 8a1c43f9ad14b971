"""Cluster specs: the shipped examples load and plan; YAML details map onto the spec."""

import json
import re
from pathlib import Path

import pytest

from poprun_py.cli import run
from poprun_py.core.plan import make_plan
from poprun_py.core.spec import JobSpec
from poprun_py.errors import SpecError
from poprun_py.prepare.specfile import load_cluster, parse_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "clusters"
POD16 = str(EXAMPLES / "pod16.yaml")

CLUSTERS = sorted(EXAMPLES.glob("*.yaml"))


def test_at_least_three_examples() -> None:
    names = {p.stem for p in CLUSTERS}
    assert {"local-2", "testhosts-4", "pod16"} <= names


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.stem for p in CLUSTERS])
def test_every_example_loads_and_plans(path: Path) -> None:
    spec = load_cluster(path)
    d = spec.defaults
    plan = make_plan(
        spec,
        JobSpec(
            ("train.py",),
            replicas=d.replicas or len(spec.hosts),
            instances=d.instances,
            devices_per_replica=d.devices_per_replica or 1,
            group_size=d.group_size,
        ),
    )
    assert plan.num_instances >= len(spec.hosts)


def test_pod16_topology() -> None:
    spec = load_cluster(POD16)
    assert len(spec.hosts) == 16
    topo = spec.hosts[0].topology
    assert topo is not None
    assert len(topo.numa_nodes) == 8 and len(topo.devices) == 16 and len(topo.cpus) == 128
    assert spec.hosts[15].address == "198.18.1.26"


def test_ssh_defaults_apply_to_hosts() -> None:
    spec = parse_cluster(
        "name: c\nssh: {user: alice, port: 2222, known_hosts: /k}\n"
        "hosts:\n  - name: a\n  - name: b\n    user: bob\n"
    )
    assert [(h.user, h.port) for h in spec.hosts] == [("alice", 2222), ("bob", 2222)]
    assert spec.known_hosts == "/k"


def test_inline_topology_and_provider() -> None:
    spec = parse_cluster(
        "name: c\nhosts:\n  - name: a\n    topology:\n      numa_nodes:\n"
        "        - {cpus: [0, 1], devices: [0]}\nprovider: {kind: aws, region: us-east-1}\n"
    )
    assert spec.hosts[0].topology is not None and spec.hosts[0].topology.devices == (0,)
    assert spec.provider is not None and spec.provider.kind == "aws"


def test_error_names_file_line_and_key() -> None:
    with pytest.raises(SpecError) as err:
        parse_cluster("name: c\nhosts:\n  - name: a\n    slots: 0\n", "c.yaml")
    assert str(err.value).startswith("c.yaml:4: hosts.0.slots: ")


def test_plan_json_is_the_only_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "-c", POD16, "-f", "json", "train.py"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_replicas"] == 64 and data["num_instances"] == 16
    inst = data["instances"][3]
    for key in (
        "index",
        "host",
        "local_index",
        "replica_offset",
        "num_local_replicas",
        "numa_nodes",
        "cpus",
        "devices",
        "shard",
    ):
        assert key in inst
    assert set(inst["shard"]) >= {"files", "bytes", "padding"}
    assert [h["name"] for h in data["hosts"]][:2] == ["node01", "node02"]


def test_plan_table_has_topology_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "-H", "h1,h2", "-b", "local", "-r", "4", "-n", "2", "t.py"]) == 0
    out = capsys.readouterr().out
    # issue 22: one line a host, with ranges; NUMA nodes, CPUs and devices are this machine's
    for host, instance, replicas in (("h1", 0, "0-1"), ("h2", 1, "2-3")):
        fields = rf"instances {instance} \| NUMA \S+ \| CPUs \S+ \| \w+ \S+ \| replicas"
        line = rf"{host}: {fields} {replicas}"
        assert re.search(line, out), out
    assert "4 replicas on 2 instances (--instances) on 2 host(s)" in out


def test_plan_with_inputs_and_eval_pad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(5):
        (tmp_path / f"{i}.rec").write_bytes(b"x" * (i + 1))
    assert (
        run(
            [
                "plan",
                "-H",
                "localhost",
                "-r",
                "2",
                "-n",
                "2",
                "-i",
                f"{tmp_path}/*.rec",
                "--eval-pad",
                "2",
                "-f",
                "json",
                "t",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    shards = [i["shard"] for i in data["instances"]]
    assert [len(s["files"]) for s in shards] == [4, 4]
    assert sum(s["padding"] for s in shards) == 3
