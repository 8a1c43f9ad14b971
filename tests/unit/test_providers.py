"""Providers: registry, state files, inventory, and the up/down lifecycle over a fake provider."""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from poprun_py.core.spec import ClusterSpec, Defaults, HostSpec, ProviderSpec
from poprun_py.core.topology import NumaNode, Topology
from poprun_py.errors import ProvisionError, UnknownNameError, UsageError
from poprun_py.prepare.specfile import parse_cluster
from poprun_py.providers import PROVIDERS, get_provider
from poprun_py.providers.base import ProvisionContext
from poprun_py.providers.inventory import inventory_dict, inventory_text
from poprun_py.providers.lifecycle import down, spec_from_record, status, up
from poprun_py.providers.records import Node, ProvisionRecord, Resource
from poprun_py.providers.state import ClusterState, list_states, state_root, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- registry


def test_registry_names_every_provider() -> None:
    assert sorted(PROVIDERS) == ["aws", "local", "static"]
    assert {name: get_provider(name).name for name in PROVIDERS} == {
        "aws": "aws",
        "local": "local",
        "static": "static",
    }


def test_unknown_provider_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_provider("gcp")
    assert str(err.value) == "unknown provider 'gcp'; choose one of: aws, local, static"
    assert err.value.exit_code == 2


# ---------------------------------------------------------------- state files


def test_state_root_follows_env_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POPRUN_PY_STATE_DIR", str(tmp_path / "s"))
    assert state_root() == tmp_path / "s" / "clusters"
    monkeypatch.delenv("POPRUN_PY_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert state_root() == tmp_path / "x" / "poprun-py" / "clusters"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_root() == tmp_path / "home" / ".local" / "state" / "poprun-py" / "clusters"


def test_state_file_round_trips_with_mode_0600(tmp_path: Path) -> None:
    state = ClusterState.of("demo", tmp_path)
    record = ProvisionRecord(
        "demo",
        "aws",
        nodes=(Node("n1", "10.0.0.1", "ubuntu", 22, "/k.pem", "i-1", "running"),),
        resources=(Resource("key-pair", "kp"),),
        known_hosts="/kh",
        settings={"kind": "aws", "num_nodes": 1},
    )
    state.save(record)
    assert state.load() == record
    assert mode(state.record_path) == 0o600


def test_state_writes_are_atomic_and_leave_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "clusters" / "x.json"
    write_private(target, "one")
    write_private(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]
    assert mode(target.parent) == 0o700


def test_missing_state_is_none_and_damaged_state_is_an_error(tmp_path: Path) -> None:
    state = ClusterState.of("demo", tmp_path)
    assert state.load() is None
    state.record_path.write_text("{not json")
    with pytest.raises(ProvisionError, match="cannot read state file"):
        state.load()
    state.record_path.write_text(json.dumps({"nodes": []}))
    with pytest.raises(ProvisionError, match="damaged state file"):
        state.load()


def test_remove_deletes_every_state_file_and_list_finds_clusters(tmp_path: Path) -> None:
    a, b = ClusterState.of("a", tmp_path), ClusterState.of("b", tmp_path)
    for state in (a, b):
        state.save(ProvisionRecord(state.name, "static"))
    for path in (a.inventory_path, a.known_hosts_path, a.key_path):
        write_private(path, "x")
    assert [s.name for s in list_states(tmp_path)] == ["a", "b"]
    a.remove()
    a.remove()  # twice is harmless
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


def test_bad_cluster_names_are_refused() -> None:
    for name in ("", "../x", "a/b", "-x", "x" * 65):
        with pytest.raises(UsageError):
            ClusterState.of(name)


# ---------------------------------------------------------------- inventory


def test_inventory_is_a_cluster_spec_that_launch_reads(tmp_path: Path) -> None:
    topo = Topology((NumaNode(0, (0, 1, 2, 3), (0, 1)), NumaNode(1, (4, 5, 6, 7), (2, 3))))
    spec = ClusterSpec(
        "demo",
        hosts=(HostSpec("pa1", topology=topo, slots=2),),
        env={"PYTHONUNBUFFERED": "1"},
        defaults=Defaults(backend="ssh", replicas=4, mpi_args=("--mca", "x", "y")),
        workdir="/srv/run",
        provider=ProviderSpec(kind="local", num_nodes=2),
        setup="echo hi",
    )
    record = ProvisionRecord(
        "demo",
        "local",
        nodes=(
            Node("pa1", "198.18.3.11", "root", 22, "/id"),
            Node("pa2", "198.18.3.12", "root", 2222, "/id"),
        ),
        known_hosts=str(tmp_path / "kh"),
    )
    parsed = parse_cluster(inventory_text(spec, record), "inv.yaml")
    assert [(h.name, h.address, h.user, h.port, h.identity_file) for h in parsed.hosts] == [
        ("pa1", "198.18.3.11", "root", 22, "/id"),
        ("pa2", "198.18.3.12", "root", 2222, "/id"),
    ]
    assert parsed.known_hosts == str(tmp_path / "kh")
    assert parsed.hosts[0].topology == topo and parsed.hosts[0].slots == 2
    assert parsed.hosts[1].topology is None
    assert parsed.defaults == spec.defaults
    assert (parsed.env, parsed.workdir) == ({"PYTHONUNBUFFERED": "1"}, "/srv/run")
    assert parsed.provider is None and parsed.setup is None


def test_inventory_keeps_the_numa_nodes_memory() -> None:
    gib = 1 << 30
    topo = Topology((NumaNode(0, (0, 1), memory=48 * gib), NumaNode(1, (2, 3), memory=48 * gib)))
    spec = ClusterSpec("mem", hosts=(HostSpec("pa1", topology=topo),))
    record = ProvisionRecord("mem", "local", nodes=(Node("pa1", "198.18.3.11", "root", 22, "/id"),))
    text = inventory_text(spec, record)
    assert "48Gi" in text
    parsed = parse_cluster(text, "inv.yaml").hosts[0].topology
    assert parsed == topo and parsed is not None and parsed.memory == 96 * gib


def test_inventory_leaves_out_what_is_unset() -> None:
    record = ProvisionRecord("bare", "static", nodes=(Node("h", "h"),))
    assert inventory_dict(ClusterSpec("bare", ()), record) == {
        "name": "bare",
        "hosts": [{"name": "h", "address": "h", "port": 22}],
    }


# ---------------------------------------------------------------- lifecycle over a fake


@dataclass
class FakeProvider:
    """Records calls; creates nodes named after the spec; optionally skips SSH."""

    reachable: bool = True
    calls: list[str] = field(default_factory=list)
    existing: set[str] = field(default_factory=set)
    name: str = "static"

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        return None

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        self.calls.append("create")
        self.existing.add(spec.name)
        nodes = tuple(Node(f"n{i}", f"198.18.9.{10 + i}", "root") for i in (1, 2))
        record = ProvisionRecord(spec.name, self.name, nodes=nodes, phase="created")
        ctx.state.save(record)
        return record

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        return tuple(replace(n, state="fine") for n in record.nodes)

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        self.calls.append("wait")
        return self.reachable

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        self.calls.append(f"terminate(record={record is not None})")
        if spec.name not in self.existing:
            return ()
        self.existing.discard(spec.name)
        return (Resource("thing", spec.name),)


def test_up_writes_record_and_inventory_then_down_removes_them(tmp_path: Path) -> None:
    fake = FakeProvider(reachable=False)
    spec = ClusterSpec("demo", (), setup="never runs: no SSH")
    result = up(spec, root=tmp_path, provider=fake)
    assert fake.calls == ["create", "wait"]
    assert result.reachable is False and result.setup == ()
    state = ClusterState.of("demo", tmp_path)
    saved = state.load()
    assert saved is not None and saved.phase == "ready" and saved.setup_sha256 is None
    assert result.inventory == state.inventory_path and mode(result.inventory) == 0o600
    assert [h.name for h in parse_cluster(result.inventory.read_text()).hosts] == ["n1", "n2"]
    gone = down(spec, root=tmp_path, provider=fake)
    assert gone.removed == (Resource("thing", "demo"),) and gone.had_state
    assert list(tmp_path.iterdir()) == []
    again = down(spec, root=tmp_path, provider=fake)
    assert again.removed == () and not again.had_state
    assert fake.calls[-2:] == ["terminate(record=True)", "terminate(record=False)"]


def test_down_with_a_damaged_state_file_still_terminates(tmp_path: Path) -> None:
    fake = FakeProvider()
    fake.existing.add("demo")
    state = ClusterState.of("demo", tmp_path)
    write_private(state.record_path, "{garbage")
    result = down(ClusterSpec("demo", ()), root=tmp_path, provider=fake)
    assert result.removed == (Resource("thing", "demo"),)
    assert fake.calls == ["terminate(record=False)"] and not state.record_path.exists()


def test_status_lists_clusters_with_refreshed_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeProvider()
    up(ClusterSpec("demo", ()), root=tmp_path, provider=fake)
    monkeypatch.setitem(PROVIDERS, "static", lambda: fake)
    (row,) = status(tmp_path)
    assert row.record.cluster == "demo" and row.error is None
    assert [n.state for n in row.nodes] == ["fine", "fine"]
    assert [n.state for n in status(tmp_path, refresh=False)[0].nodes] == ["unknown", "unknown"]


def test_spec_from_record_rebuilds_what_down_needs() -> None:
    record = ProvisionRecord(
        "lab",
        "static",
        nodes=(Node("g1", "10.1.1.1", "train", 2222, "/k"),),
        known_hosts="/kh",
        settings={"kind": "static", "num_nodes": None, "future_key": 1},
    )
    spec = spec_from_record(record)
    assert spec.provider == ProviderSpec(kind="static")
    assert [(h.name, h.address, h.user, h.port) for h in spec.hosts] == [
        ("g1", "10.1.1.1", "train", 2222)
    ]
    assert spec.known_hosts == "/kh"
