"""Input shards: disjoint cover, balanced by bytes and count, deterministic, eval padding."""

import random

import pytest

from poprun_py.core.shard import InputFile, InputSet, assign_shards, parse_manifest
from poprun_py.errors import InputError


def random_files(n: int, seed: int) -> list[InputFile]:
    rng = random.Random(seed)
    return [
        InputFile(f"/data/f{i:05d}", rng.choice([1, 10, 1000, rng.randint(1, 10**6)]))
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("n", "k", "seed"),
    [(0, 3, 0), (1, 4, 1), (7, 3, 2), (100, 7, 3), (1000, 16, 4), (50, 50, 5), (10, 64, 6)],
)
def test_cover_balance_and_counts(n: int, k: int, seed: int) -> None:
    files = random_files(n, seed)
    shards = assign_shards(files, k)
    assert len(shards) == k
    listed = [f for s in shards for f in s.files]
    assert sorted(listed) == sorted(f.path for f in files)  # every file exactly once
    counts = [len(s.files) for s in shards]
    assert max(counts) - min(counts) <= 1
    if files:
        loads = [s.bytes for s in shards]
        assert max(loads) - min(loads) <= max(f.size for f in files)
        sizes = {f.path: f.size for f in files}
        assert all(s.bytes == sum(sizes[p] for p in s.files) for s in shards)


def test_independent_of_listing_order() -> None:
    files = random_files(200, 9)
    shuffled = files[:]
    random.Random(1).shuffle(shuffled)
    assert assign_shards(files, 8) == assign_shards(shuffled, 8)


def test_duplicates_listed_once() -> None:
    shards = assign_shards([InputFile("/a", 1), InputFile("/a", 1), InputFile("/b", 2)], 2)
    assert sorted(f for s in shards for f in s.files) == ["/a", "/b"]


def test_eval_pad_gives_equal_whole_batches_and_records_padding() -> None:
    files = random_files(10, 3)
    shards = assign_shards(files, 3, eval_pad=4)
    assert {len(s.files) for s in shards} == {4}
    assert sum(s.padding for s in shards) == 12 - 10
    for s in shards:
        real = s.files[: len(s.files) - s.padding]
        assert set(s.files[len(real) :]) <= set(real)  # padding repeats the shard's own files


def test_eval_pad_with_fewer_files_than_shards() -> None:
    shards = assign_shards([InputFile("/only", 5)], 3, eval_pad=2)
    assert [len(s.files) for s in shards] == [2, 2, 2]
    assert [s.padding for s in shards] == [1, 2, 2]


def test_bad_eval_pad() -> None:
    with pytest.raises(InputError):
        assign_shards([InputFile("/a", 1)], 2, eval_pad=0)


def test_manifest_with_and_without_sizes() -> None:
    text = "# data\n/data/a 100\n/data/b\t20\n/data/with space.rec\n\n/data/c 3\n"
    assert parse_manifest(text) == [
        ("/data/a", 100),
        ("/data/b", 20),
        ("/data/with space.rec", None),
        ("/data/c", 3),
    ]


def test_empty_manifest_refused() -> None:
    with pytest.raises(InputError, match="lists no files"):
        parse_manifest("# nothing\n\n", "m.txt")


def test_inputset_and_list_agree() -> None:
    files = random_files(30, 2)
    assert assign_shards(files, 4) == assign_shards(InputSet.of(files), 4)
