"""Input shards and manifests: the exact deal, ties, huge sizes, the uneven-shard lines and the
manifest's faults.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
a rule a user meets -- equal files dealt in path order, a file listed out of order or twice, a
padding-only shard counted as empty, the line a manifest fault is on -- that the other tests let
change unnoticed.
"""

import pytest

from poprun_py.core.shard import (
    InputFile,
    InputSet,
    Shard,
    _fast_columns,
    assign_shards,
    human_bytes,
    parse_manifest,
    parse_manifest_columns,
    refuse_uneven,
    uneven_shards,
)
from poprun_py.errors import InputError


def files_of(shards: list[Shard]) -> list[tuple[str, ...]]:
    return [s.files for s in shards]


def sized(**sizes: int) -> list[InputFile]:
    return [InputFile(path, size) for path, size in sizes.items()]


def test_each_round_gives_its_largest_file_to_the_shard_lightest_so_far() -> None:
    shards = assign_shards(sized(a=10, b=9, c=5, d=5, e=1, f=1), 2)
    assert files_of(shards) == [("a", "d", "f"), ("b", "c", "e")]
    assert [s.bytes for s in shards] == [16, 15]


def test_files_of_equal_size_are_dealt_in_path_order() -> None:
    assert files_of(assign_shards(sized(d=10, c=10, b=10, a=10), 2)) == [("a", "c"), ("b", "d")]


def test_shards_of_equal_load_take_files_in_shard_order() -> None:
    files = [InputFile(f"f{i:02d}", 1) for i in range(40)]
    assert files_of(assign_shards(files, 20)) == [
        (f"f{k:02d}", f"f{k + 20:02d}") for k in range(20)
    ]


def test_lighter_shards_take_the_next_round_first_and_equal_ones_in_shard_order() -> None:
    sizes = [5] * 10 + [3] * 10 + [1] * 20
    files = [InputFile(f"f{i:02d}", size) for i, size in enumerate(sizes)]
    expected = [(f"f{k:02d}", f"f{k + 30:02d}") for k in range(10)]
    expected += [(f"f{k:02d}", f"f{k + 10:02d}") for k in range(10, 20)]
    assert files_of(assign_shards(files, 20)) == expected


def test_sizes_too_big_for_the_fast_sort_key_still_go_largest_first() -> None:
    huge = 2**62
    shards = assign_shards(sized(a=1, b=huge, c=huge - 1, d=huge, e=2**61), 2)
    assert files_of(shards) == [("b", "c"), ("a", "d", "e")]
    # 2**60 + 1 and 2**60, alternately: the larger ones first, each kind in path order
    many = [InputFile(f"f{i:02d}", 2**60 + i % 2) for i in range(40)]
    first = tuple(f"f{i:02d}" for i in range(40) if i % 4 < 2)
    assert files_of(assign_shards(many, 2))[0] == first


@pytest.mark.parametrize("listed", [("a", "c", "b"), ("b", "a", "c"), ("c", "b", "a")])
def test_the_deal_does_not_depend_on_the_listing_order(listed: tuple[str, ...]) -> None:
    sizes = {"a": 3, "b": 2, "c": 1}
    shards = assign_shards(InputSet(listed, tuple(sizes[p] for p in listed)), 2)
    assert files_of(shards) == [("a",), ("b", "c")]


def test_a_file_listed_twice_is_dealt_once_whichever_it_is() -> None:
    inputs = InputSet(("a", "b", "b", "c", "c"), (1, 2, 2, 3, 3))
    assert files_of(assign_shards(inputs, 3)) == [("c",), ("b",), ("a",)]


def test_a_shard_without_files_is_padded_with_the_largest_file() -> None:
    shards = assign_shards(sized(a=5, b=3), 3, eval_pad=1)
    assert shards[2] == Shard(("a",), 0, 1)


def test_the_number_of_shards_must_be_at_least_one() -> None:
    with pytest.raises(InputError) as caught:
        assign_shards(sized(a=1), 0)
    assert str(caught.value) == "the number of shards must be at least 1"


def test_a_shard_of_padding_only_counts_as_empty_and_not_as_the_lightest() -> None:
    shards = [Shard(("a", "a"), 10, 1), Shard(("a",), 0, 1)]
    assert uneven_shards(shards) == [
        "1 of 2 instances gets no input files (1 files for 2 instances): instance 1"
    ]


def test_a_shard_of_no_bytes_is_many_times_lighter() -> None:
    assert uneven_shards([Shard(("a",), 10), Shard(("b",), 0)]) == [
        "the largest input shard (10 B, instance 0) is many times the smallest (0 B, instance 1),"
        " over 2x: split the big files, or give more files than instances"
    ]


def test_eight_empty_instances_are_all_named() -> None:
    shards = [Shard(("a",), 1)] + [Shard()] * 8
    assert uneven_shards(shards)[0].endswith("instances 1, 2, 3, 4, 5, 6, 7, 8")
    assert uneven_shards([*shards, Shard()])[0].endswith("2, 3, 4, 5, 6, 7, 8 and 1 more")


def test_strict_shards_refuse_at_the_factor_given() -> None:
    shards = [Shard(("a",), 10), Shard(("b",), 6)]
    refuse_uneven(shards)
    with pytest.raises(InputError) as caught:
        refuse_uneven(shards, factor=1.5)
    assert str(caught.value) == (
        "uneven input shards (--strict-shards): the largest input shard (10 B, instance 0) is "
        "1.7x the smallest (6 B, instance 1), over 1.5x: split the big files, or give more "
        "files than instances"
    )


def test_human_bytes_switch_unit_at_1024() -> None:
    shown = [human_bytes(n) for n in (1023, 1024, 1024**2 - 1, 1024**2, 1024**3, 1024**4)]
    assert shown == ["1023 B", "1.0 KiB", "1024.0 KiB", "1.0 MiB", "1.0 GiB", "1.0 TiB"]
    assert human_bytes(1536 * 1024**2) == "1.5 GiB"


def test_simple_manifests_take_the_fast_split_and_others_do_not() -> None:
    assert _fast_columns("a 1\nb 22\n") == (["a", "b"], [1, 22])
    for text in ("", "a 1\n#b 2\n", "a\t1\n", "a 1\r\n", "a 1 b\n", "a x\n", "a  1\n", "\na 1"):
        assert _fast_columns(text) is None


def test_a_manifest_comment_is_skipped_even_when_it_looks_like_a_line() -> None:
    assert parse_manifest("b 2\n#a 1\n") == [("b", 2)]


def test_a_manifest_path_may_hold_spaces_and_end_without_a_size() -> None:
    assert parse_manifest("my file 3\nnotes x5\n# c\nzero 0\n") == [
        ("my file", 3),
        ("notes x5", None),
        ("zero", 0),
    ]


def test_manifest_faults_name_the_source_and_the_line() -> None:
    with pytest.raises(InputError) as caught:
        parse_manifest("a 1\nb -3\n", "m.txt")
    assert str(caught.value) == "m.txt:2: negative size for 'b'"
    with pytest.raises(InputError) as caught:
        parse_manifest("")
    assert str(caught.value) == "manifest: the manifest lists no files"
    with pytest.raises(InputError) as caught:
        parse_manifest_columns("# none\n")
    assert str(caught.value) == "manifest: the manifest lists no files"
