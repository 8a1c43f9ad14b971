"""Host expressions, hostfiles and Slurm nodelists: the exact hosts and the exact messages.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
a rule a user meets -- a step of 1, a comment holding '#', ``max_slots=``, an IPv6 host, the
line a hostfile fault is on -- that the other tests let change unnoticed.
"""

import pytest

from poprun_py.core.hosts import (
    HostEntry,
    expand_range,
    parse_hostfile_text,
    parse_hosts,
    read_hostfile,
    slurm_hosts,
    validate_host_name,
)
from poprun_py.errors import HostExprError


def names(expr: str) -> list[str]:
    return [h.name for h in parse_hosts(expr)]


def refusal(call, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(HostExprError) as caught:
        call(*args)
    return str(caught.value)


def test_a_step_of_one_is_every_node_and_a_step_below_one_is_refused() -> None:
    assert names("n[1-3/1]") == ["n1", "n2", "n3"]
    assert names("n[1-7/3]") == ["n1", "n4", "n7"]
    assert refusal(parse_hosts, "n[1-3/0]") == (
        "bad node range 'n[1-3/0]': step 0 must be at least 1"
    )


@pytest.mark.parametrize("term", ["a]b", "a[1]b]c", "a[1]b[", "rack[1"])
def test_brackets_that_do_not_pair_up_are_refused_by_the_range_expander(term: str) -> None:
    assert refusal(expand_range, term) == (
        f"bad node range {term!r}: brackets must pair up, unnested"
    )


def test_nested_brackets_are_refused_as_a_range_fault() -> None:
    assert refusal(parse_hosts, "n[[1]]") == (
        "bad node range 'n[[1]]': brackets must pair up, unnested"
    )
    assert refusal(parse_hosts, "n[1]]") == "bad host expression 'n[1]]': unbalanced ']'"


def test_an_empty_element_of_a_list_is_named() -> None:
    assert refusal(parse_hosts, "a,,b") == "bad host list 'a,,b': empty element"


def test_ipv6_hosts_are_accepted_and_bad_names_name_their_context() -> None:
    assert names("::1,fe80::1") == ["::1", "fe80::1"]
    assert validate_host_name("fe80::1") == "fe80::1"
    assert refusal(validate_host_name, "a b") == (
        "bad host name 'a b': use letters, digits, '.', '-' and '_' only"
    )


def test_a_hostfile_comment_may_hold_a_hash_and_max_slots_are_accepted() -> None:
    text = "a slots=2 # first # rack 1\nb max_slots=8\nc slots=1 max-slots=4\n"
    assert parse_hostfile_text(text) == [HostEntry("a", 2), HostEntry("b"), HostEntry("c", 1)]
    assert parse_hostfile_text("d\n")[0].slots is None


def test_hostfile_faults_name_the_file_and_the_line() -> None:
    text = "a\n# spare\nb slots=4=5\n"
    assert refusal(parse_hostfile_text, text, "hosts.txt") == (
        "hosts.txt:3: slots must be a positive integer"
    )
    assert refusal(parse_hostfile_text, "a\nb cores=4\n") == (
        "hostfile:2: unknown field 'cores=4' in 'b cores=4'"
    )
    assert refusal(parse_hostfile_text, "# none\n") == "hostfile: no hosts listed"
    assert refusal(parse_hostfile_text, "bad!name\n") == (
        "bad host name 'bad!name': use letters, digits, '.', '-' and '_' only"
    )


def test_an_at_hostfile_is_read_through_the_reader_and_its_faults_name_it() -> None:
    files = {"h.txt": "a slots=2\nb\nc wrong=1\n"}
    assert refusal(parse_hosts, "@h.txt", files.__getitem__) == (
        "h.txt:3: unknown field 'wrong=1' in 'c wrong=1'"
    )
    assert refusal(parse_hosts, "@") == "'@' must be followed by a hostfile path"
    assert refusal(parse_hosts, "@h.txt") == "cannot read hostfile 'h.txt' here"


def test_a_hostfile_that_cannot_be_read_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert refusal(read_hostfile, str(tmp_path / "none")).endswith("does not exist")
    assert refusal(read_hostfile, str(tmp_path)).startswith(
        f"cannot read hostfile {str(tmp_path)!r}: "
    )


def test_slurm_nodelist_falls_back_to_the_old_name_and_faults_say_slurm() -> None:
    assert [h.name for h in slurm_hosts({"SLURM_NODELIST": "n[1-2]"}) or []] == ["n1", "n2"]
    assert slurm_hosts({}) is None
    assert refusal(slurm_hosts, {"SLURM_JOB_NODELIST": "n1,bad!"}) == (
        "bad Slurm node name 'bad!': use letters, digits, '.', '-' and '_' only"
    )
