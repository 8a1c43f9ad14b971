"""Issue 23: a NUMA node's ``memory:`` in a cluster spec, Kubernetes-style quantities read by
``parse_memory`` and written by ``format_memory``, a host's memory as its NUMA nodes' sum, and
a bad value as one spec error (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from poprun_py.cli import run
from poprun_py.core.topology import (
    NumaNode,
    Topology,
    TopologyError,
    format_memory,
    parse_memory,
    uniform,
    within,
)
from poprun_py.errors import SpecError
from poprun_py.prepare.specfile import parse_cluster

GI, GB = 2**30, 10**9


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (4096, 4096),
        (0, 0),
        ("4096", 4096),
        ("96Gi", 96 * GI),
        ("1Ki", 1024),
        ("3Mi", 3 * 2**20),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("512G", 512 * GB),
        ("1k", 1000),
        ("1K", 1000),
        ("7M", 7 * 10**6),
        ("2T", 2 * 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1.5Ti", 3 * 2**39),
        ("0.5Ki", 512),
    ],
)
def test_parse_memory(value: int | str, size: int) -> None:
    assert parse_memory(value) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "-1 is not a memory size: less than 0"),
        ("-1Gi", "is not a memory size"),
        ("96GB", "'96GB' is not a memory size: bytes, or a number with a unit such as 96Gi"),
        ("96gi", "is not a memory size"),
        ("1ki", "is not a memory size"),
        ("Gi", "is not a memory size"),
        ("", "is not a memory size"),
        (" 1Gi", "is not a memory size"),
        ("1e9", "is not a memory size"),
        ("1.", "is not a memory size"),
        (".5Gi", "is not a memory size"),
        ("1.5", "'1.5' is not a whole number of bytes"),
        ("0.1Ki", "not a whole number of bytes"),
        (True, "True is not a memory size"),
    ],
)
def test_parse_memory_refuses(value: int | str, message: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse_memory(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (96 * GI, "96Gi"),
        (512 * GB, "512G"),
        (1000 * 2**20, "1000Mi"),  # 1000Mi, not 1024000Ki nor 1048576k
        (1024, "1Ki"),
        (1000, "1k"),
        (1536, "1536"),  # 1.5Ki is not whole: bytes
        (2**40, "1Ti"),
        (10**18, "1E"),
        (1, "1"),
        (0, "0"),
    ],
)
def test_format_memory_picks_the_smallest_whole_number(size: int, text: str) -> None:
    assert format_memory(size) == text
    assert parse_memory(text) == size


def test_format_memory_round_trips() -> None:
    for size in (*(2**k for k in range(64)), *(10**k for k in range(19)), 3 * GI, 12345678):
        assert parse_memory(format_memory(size)) == size


def test_a_host_s_memory_is_its_numa_nodes_together_when_every_one_is_known() -> None:
    two = Topology((NumaNode(0, (0,), memory=48 * GI), NumaNode(1, (1,), memory=48 * GI)))
    assert two.memory == 96 * GI
    assert Topology((NumaNode(0, (0,), memory=GI), NumaNode(1, (1,)))).memory is None
    assert uniform(2, 4).memory is None
    assert Topology(()).memory is None
    assert within(two, (1,)).memory == 48 * GI  # the NUMA nodes a cpuset keeps, with theirs


# ---------------------------------------------------------------- the spec's memory:

SPEC = """\
name: mem
hosts:
  - {name: "n[1-2]", topology: big}
topologies:
  big:
    numa_nodes:
      - {id: 0, cpus: "0-7", devices: [0, 1], memory: 48Gi}
      - {id: 1, cpus: "8-15", devices: [2, 3], memory: 51539607552}
"""


def test_the_spec_s_memory_is_bytes_on_each_numa_node() -> None:
    spec = parse_cluster(SPEC, "mem.yaml")
    topology = spec.hosts[1].topology
    assert topology is not None
    assert [n.memory for n in topology.numa_nodes] == [48 * GI, 48 * GI]
    assert topology.memory == 96 * GI
    inline = "name: x\nhosts:\n  - name: h1\n    topology:\n      numa_nodes:\n" + (
        "        - {cpus: [0, 1], memory: 512G}\n"
    )
    [host] = parse_cluster(inline, "x.yaml").hosts
    assert host.topology is not None and host.topology.memory == 512 * GB
    undeclared = parse_cluster(
        SPEC.replace(", memory: 48Gi", "").replace(", memory: 51539607552", "")
    )
    assert undeclared.hosts[0].topology is not None
    assert undeclared.hosts[0].topology.memory is None


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("48Gi", "96GB", "mem.yaml:7: topologies.big.numa_nodes.0.memory: '96GB' is not a memory"),
        ("48Gi", "-1", "mem.yaml:7: topologies.big.numa_nodes.0.memory: -1 is not a memory"),
        ("48Gi", "0.5", "topologies.big.numa_nodes.0.memory: expected a memory size"),
        ("48Gi", "yes", "topologies.big.numa_nodes.0.memory: expected a memory size"),
        ("48Gi", '"1.5"', "topologies.big.numa_nodes.0.memory: '1.5' is not a whole number"),
        (
            ", memory: 48Gi",
            "",
            "mem.yaml:7: topologies.big.numa_nodes.0: no memory, but NUMA node 1",
        ),
        (", memory: 51539607552", "", "topologies.big.numa_nodes.1: no memory, but NUMA node 0"),
    ],
)
def test_a_bad_memory_is_a_spec_error_at_its_key(old: str, new: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_cluster(SPEC.replace(old, new, 1), "mem.yaml")
    assert message in str(caught.value)


def test_memory_0_on_every_numa_node_is_refused_0_on_one_is_not() -> None:
    one = SPEC.replace("51539607552", "0")
    topology = parse_cluster(one, "mem.yaml").hosts[0].topology
    assert topology is not None and topology.memory == 48 * GI  # a memory-less NUMA node
    with pytest.raises(SpecError, match=r"numa_nodes\.0\.memory: 0 on every NUMA node"):
        parse_cluster(one.replace("48Gi", "0"), "mem.yaml")


def test_the_plan_json_has_memory_where_it_is_declared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mem.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    assert run(["plan", "-f", "json", "-c", str(spec), "train.py"]) == 0
    host = json.loads(capsys.readouterr().out)["hosts"][0]
    assert [n["memory"] for n in host["numa_nodes"]] == [48 * GI, 48 * GI]
    assert run(["plan", "-f", "json", "-H", "a", "train.py"]) == 0
    assert json.loads(capsys.readouterr().out)["hosts"][0]["numa_nodes"] == []


@pytest.mark.parametrize("value", ["96GB", "-5", "1.5", "[1]", "lots"])
def test_the_cli_says_a_bad_memory_in_one_line_exit_2_and_writes_nothing(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "mem.yaml"
    spec.write_text(SPEC.replace("48Gi", value), encoding="utf-8")
    code = run(["render", "--backend", "k8s", "--image", "i", "-c", str(spec), "train.py"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    [line] = err.strip().splitlines()
    assert line.startswith(f"poprun-py: error: {spec}:7: topologies.big.numa_nodes.0.memory: ")
    assert list(tmp_path.iterdir()) == [spec]
