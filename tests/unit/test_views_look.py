"""The one look (issue 22): the table style, its fitting to a width, colour only on a terminal
and never with NO_COLOR, the topology folded per host with ranges and a counted ellipsis."""

from __future__ import annotations

import io
import sys

import pytest

from poprun_py.core import look
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.core.views import host_lines, plan_lines


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def plan_of(hosts: str, replicas: int, instances: int, numa: int = 0) -> LaunchPlan:
    topology = uniform(numa, 8, 2) if numa else None
    cluster = cluster_from_hosts(parse_hosts(hosts), topology=topology)
    return make_plan(cluster, JobSpec(("t",), replicas, instances))


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert look.use_colour(Tty(), {"TERM": "xterm"})
    assert not look.use_colour(io.StringIO(), {"TERM": "xterm"})
    assert not look.use_colour(Tty(), {"TERM": "xterm", "NO_COLOR": "1"})
    assert look.use_colour(Tty(), {"TERM": "xterm", "NO_COLOR": ""})  # empty: not set
    assert not look.use_colour(Tty(), {"TERM": "dumb"})
    assert look.paint("x", "error", colour=False) == "x"
    assert look.bold_header(["a  b", "1  2"], True) == ["\x1b[1ma  b\x1b[0m", "1  2"]


def test_piped_output_is_80_columns_wide() -> None:
    assert look.output_width(io.StringIO()) == 80
    assert look.output_width(None) == 80


def test_a_table_gives_way_in_its_widest_column_but_keeps_the_first_whole() -> None:
    rows = [["adhoc-20261201-210500-3f2a", "node[01-16]", "a long detail that goes on"]]
    lines = look.fit_table(("id", "hosts", "detail"), rows, 50)
    assert max(map(len, lines)) == 50
    assert lines[1].startswith("adhoc-20261201-210500-3f2a  ")
    assert lines[1].endswith("…")
    narrow = look.fit_table(("id", "hosts", "detail"), rows, 10)
    assert narrow == [
        "id                          hosts  detail",
        "adhoc-20261201-210500-3f2a  node…  a lon…",
    ]
    assert look.fit_table(("a",), [["1"]], 80) == look.table_lines(("a",), [["1"]])


def test_the_topology_is_folded_per_host_with_aligned_fields() -> None:
    lines = host_lines(plan_of("h1,node02", 8, 4, numa=2))
    assert lines == [
        "h1:     instances 0-1 | NUMA 0-1 | CPUs 0-15 | devices 0-3 | replicas 0-3",
        "node02: instances 2-3 | NUMA 0-1 | CPUs 0-15 | devices 0-3 | replicas 4-7",
    ]
    assert len({line.index("|") for line in lines}) == 1


def test_past_the_limit_the_hosts_are_counted() -> None:
    lines = host_lines(plan_of("n[0001-2048]", 2048, 2048))
    assert len(lines) == 65
    assert lines[-1] == "… 1,984 more hosts (--format json)"


def test_no_line_of_the_plan_is_wider_than_80_with_2048_hosts() -> None:
    plan = plan_of("node[0001-2048]", 8192, 2048, numa=2)
    for width in (80, 40):
        lines = plan_lines(plan, width)
        assert max(map(len, lines)) <= width
        assert lines[0] == "poprun-py topology"


def test_preflight_faults_fold_their_problem_within_80_columns() -> None:
    from poprun_py.errors import Fault
    from poprun_py.launch.summary import fault_lines

    detail = "no address in 198.18.1.0/24 (has: " + ", ".join(["10.0.0.1"] * 12) + ")"
    faults = [Fault(f"node{k:04}", "network", detail) for k in range(70)]
    lines = fault_lines(faults)
    assert lines[0] == "preflight failed: 70 fault(s), nothing was started"
    assert lines[1].split() == ["host", "check", "problem"]
    assert lines[2].startswith("node0000  network  no address in 198.18.1.0/24 (has:")
    assert max(map(len, lines)) <= 80
    assert lines[-1] == "… 6 more faults"


def test_errors_are_red_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from poprun_py.cli import _error

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for stream, shown in ((Tty(), "\x1b[1;31merror:\x1b[0m"), (io.StringIO(), "error:")):
        monkeypatch.setattr("sys.stderr", stream)
        _error("boom")
        assert stream.getvalue() == f"poprun-py: {shown} boom\n"
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("sys.stderr", Tty())
    _error("boom")
    assert "\x1b" not in sys.stderr.getvalue()


def test_status_lists_nodes_in_the_one_style_with_ids_whole() -> None:
    from types import SimpleNamespace as NS

    from poprun_py.cli.provision_cmd import _status_table

    record = NS(cluster="pod16", provider="aws", phase="ready")
    node = NS(name="node01", address="198.18.1.11", state="running", resource_id="i-" + "0" * 40)
    rows = [NS(record=record, nodes=(node, node), error=None)]
    lines = _status_table(rows)  # type: ignore[arg-type]
    assert lines[0].split() == ["cluster", "provider", "phase", "node", "address", "state", "id"]
    assert lines[1].split() == [
        "pod16",
        "aws",
        "ready",
        "node01",
        "198.18.1.11",
        "running",
        node.resource_id,
    ]
    assert lines[2].split() == ["node01", "198.18.1.11", "running", node.resource_id]


def test_host_lines_too_wide_to_align_stand_alone_before_being_cut() -> None:
    cluster = cluster_from_hosts(parse_hosts("node[0001-2048]"), topology=uniform(2, 32, 4))
    plan = make_plan(cluster, JobSpec(("t",), replicas=16384, instances=4096))
    lines = host_lines(plan)
    assert (
        lines[2] == "node0003: instances 4-5 | NUMA 0-1 | CPUs 0-63 | devices 0-7 | replicas 16-23"
    )
    assert max(map(len, lines)) <= 80


def test_on_a_terminal_the_plan_tables_have_bold_headers_and_nothing_else_changes() -> None:
    plan = plan_of("h1,node02", 8, 4, numa=2)
    plain, bold = plan_lines(plan), plan_lines(plan, colour=True)
    changed = [(a, b) for a, b in zip(plain, bold, strict=True) if a != b]
    assert changed == [
        (plain[k], f"\x1b[1m{plain[k]}\x1b[0m") for k in [plain.index(a) for a, _ in changed]
    ]
    assert [a.split()[0] for a, _ in changed] == ["instance"]
