"""Host expressions: lists, NodeSet ranges, hostfiles, Slurm nodelists, and bad names."""

import pytest

from poprun_py.core.hosts import HostEntry, parse_hostfile_text, parse_hosts, slurm_hosts
from poprun_py.errors import HostExprError


def names(expr: str) -> list[str]:
    return [h.name for h in parse_hosts(expr)]


def test_plain_list_keeps_order() -> None:
    assert names("b,a,c") == ["b", "a", "c"]


def test_ranges_with_padding_and_mixed_terms() -> None:
    assert names("node[01-03,10],gpu[1-2]") == [
        "node01",
        "node02",
        "node03",
        "node10",
        "gpu1",
        "gpu2",
    ]


def test_ip_addresses_allowed() -> None:
    assert names("198.18.0.11,198.18.0.12") == ["198.18.0.11", "198.18.0.12"]


def test_hostfile_with_slots_comments_blank_lines() -> None:
    text = "# cluster\nnode1 slots=4\n\n  node2   slots=4  # second\nnode[3-4] slots=2\n"
    assert parse_hostfile_text(text) == [
        HostEntry("node1", 4),
        HostEntry("node2", 4),
        HostEntry("node3", 2),
        HostEntry("node4", 2),
    ]


def test_at_hostfile_is_read_through_callable() -> None:
    entries = parse_hosts("@hf", read=lambda path: "a slots=2\nb slots=2\n")
    assert entries == [HostEntry("a", 2), HostEntry("b", 2)]


def test_slurm_nodelist() -> None:
    assert [h.name for h in slurm_hosts({"SLURM_JOB_NODELIST": "cn[001-003]"}) or []] == [
        "cn001",
        "cn002",
        "cn003",
    ]
    assert slurm_hosts({}) is None


@pytest.mark.parametrize(
    "expr",
    ["", " ", "a,,b", "a;rm -rf x", "$(reboot)", "a b", "n[1-", "n[3-1]", "a,a", "-rf", "@"],
)
def test_bad_expressions(expr: str) -> None:
    with pytest.raises(HostExprError):
        parse_hosts(expr, read=lambda p: "")


@pytest.mark.parametrize(
    "text", ["", "# only a comment\n", "a slots=x\n", "a slots=0\n", "a cpus=4\n", "a;b slots=1\n"]
)
def test_bad_hostfiles(text: str) -> None:
    with pytest.raises(HostExprError):
        parse_hostfile_text(text)
