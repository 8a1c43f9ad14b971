"""Issue 20, item 9: node ranges keep the user's order, and a host named twice is refused
whichever form names it twice; a bad range is one poprun-py line."""

from __future__ import annotations

import pytest

from poprun_py.cli import run
from poprun_py.core.hosts import parse_hostfile_text, parse_hosts
from poprun_py.errors import HostExprError
from poprun_py.prepare.job import LaunchOptions, prepare


def names(expr: str) -> list[str]:
    return [h.name for h in parse_hosts(expr)]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("node[07,03]", ["node07", "node03"]),
        ("node[10-11,02]", ["node10", "node11", "node02"]),
        ("n[2,1]-ib", ["n2-ib", "n1-ib"]),
        ("rack[2,1]-n[9-10]", ["rack2-n9", "rack2-n10", "rack1-n9", "rack1-n10"]),
        ("n[1-7/3]", ["n1", "n4", "n7"]),
        ("n[9-11],n[08-08]", ["n9", "n10", "n11", "n08"]),
    ],
)
def test_ranges_expand_in_the_order_written(expr: str, expected: list[str]) -> None:
    assert names(expr) == expected


def test_the_first_host_of_a_range_is_master_addr() -> None:
    prep = prepare(LaunchOptions(program=("t",), hosts="node[07,03]"), environ={})
    assert prep.plan.master_addr == "node07"
    assert [h.name for h in prep.plan.hosts] == ["node07", "node03"]


@pytest.mark.parametrize("expr", ["node[1,1]", "node[1-2],node2", "node1,node1", "n[1-3,2]"])
def test_a_host_named_twice_is_refused_in_either_form(expr: str) -> None:
    with pytest.raises(HostExprError, match="is listed twice"):
        parse_hosts(expr)


def test_a_hostfile_range_naming_a_host_twice_is_refused() -> None:
    entries = parse_hostfile_text("n[1,1] slots=2\n")
    with pytest.raises(HostExprError, match="'n1' is listed twice"):
        parse_hosts("@f", read=lambda path: "n[1,1] slots=2\n")
    assert len(entries) == 2  # the file's text itself parses; the host list refuses it


@pytest.mark.parametrize(
    ("expr", "fault"),
    [
        ("node[03-01]", "bad node range 'node[03-01]': 03-01 counts down; write [01-03]"),
        ("node[a-c]", "bad node range 'node[a-c]': 'a-c' is not N, N-M or N-M/STEP"),
        ("node[]", "bad node range 'node[]'"),
        ("node[1-4/0]", "step 0 must be at least 1"),
    ],
)
def test_a_bad_range_is_one_poprun_line_exit_2(
    expr: str, fault: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["plan", "-H", expr, "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fault in err, err
    assert "ClusterShell" not in err and "RangeSet" not in err
