"""Uneven input shards (issue 20, item 19): an instance with no files, or a heaviest shard over
UNEVEN_FACTOR times the lightest, is a plan note; ``--strict-shards`` (spec:
``defaults.strict_shards``) refuses it instead, exit 2 with one line; ``--input DIR`` means every
file under DIR (recursively, hidden ones left out), and a pattern matching only directories
says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun_py.cli import run
from poprun_py.core.shard import UNEVEN_FACTOR, InputFile, assign_shards, uneven_shards
from poprun_py.errors import InputError
from poprun_py.prepare.inputs import collect_inputs
from poprun_py.prepare.job import LaunchOptions, prepare


def files(root: Path, sizes: dict[str, int]) -> Path:
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    return root


def plan_notes(tmp_path: Path, pattern: str, instances: int, **opts: object) -> tuple[str, ...]:
    options = LaunchOptions(
        hosts="localhost",
        instances=instances,
        inputs=(pattern,),
        workdir=str(tmp_path),
        program=("true",),
        **opts,  # type: ignore[arg-type]
    )
    return prepare(options, environ={}).plan.notes


def test_more_instances_than_files_is_a_note_naming_the_empty_instances(tmp_path: Path):
    files(tmp_path / "data", {f"f{i:02}.rec": 100 for i in range(16)})
    notes = plan_notes(tmp_path, "data/*.rec", 32)
    empty = [n for n in notes if "no input files" in n]
    assert empty == [
        "16 of 32 instances get no input files (16 files for 32 instances): "
        "instances 16, 17, 18, 19, 20, 21, 22, 23 and 8 more"
    ]


def test_one_big_file_is_a_note_with_both_sizes_and_the_factor(tmp_path: Path):
    files(tmp_path / "data", {"big.rec": 1_000_000, "small.rec": 13_000})
    notes = plan_notes(tmp_path, "data/*.rec", 2)
    uneven = [n for n in notes if "largest input shard" in n]
    assert len(uneven) == 1
    assert "(976.6 KiB, instance 0)" in uneven[0] and "(12.7 KiB, instance 1)" in uneven[0]
    assert f"over {UNEVEN_FACTOR:g}x" in uneven[0]


def test_even_shards_and_no_inputs_give_no_shard_note(tmp_path: Path):
    files(tmp_path / "data", {f"f{i}.rec": 1000 + i for i in range(8)})
    assert not [n for n in plan_notes(tmp_path, "data/*.rec", 4) if "shard" in n or "input" in n]
    shards = assign_shards([InputFile("a", 100), InputFile("b", 201)], 2)
    assert uneven_shards(shards) == [uneven_shards(shards)[0]]  # 201 > 2 x 100
    assert uneven_shards(assign_shards([InputFile("a", 100), InputFile("b", 200)], 2)) == []


def test_padding_does_not_count_as_files():
    shards = assign_shards([InputFile("a", 10), InputFile("b", 10)], 3, eval_pad=1)
    assert [s.padding for s in shards] == [0, 0, 1]
    assert uneven_shards(shards)[0].startswith("1 of 3 instances gets no input files")


@pytest.mark.parametrize("where", ["flag", "spec"])
def test_strict_shards_refuses_uneven_shards_with_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
):
    files(tmp_path / "data", {f"f{i}.rec": 100 for i in range(2)})
    marker = tmp_path / "ran"
    args = ["launch", "--hosts", "localhost", "-n", "4", "-i", str(tmp_path / "data")]
    if where == "flag":
        args.append("--strict-shards")
    else:
        spec = tmp_path / "c.yaml"
        spec.write_text("name: c\nhosts: [{name: localhost}]\ndefaults: {strict_shards: true}\n")
        args += ["-c", str(spec)]
    code = run([*args, "--", "touch", str(marker)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "poprun-py: error: uneven input shards (--strict-shards): 2 of 4 instances get no "
        "input files (2 files for 4 instances): instances 2, 3"
    ]
    assert not marker.exists()


def test_no_strict_shards_overrides_the_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    files(tmp_path / "data", {"a.rec": 1})
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nhosts: [{name: localhost}]\ndefaults: {strict_shards: true}\n")
    args = ["plan", "-c", str(spec), "-n", "2", "-i", str(tmp_path / "data"), "true"]
    assert run(args) == 2
    capsys.readouterr()
    assert run([*args[:1], "--no-strict-shards", *args[1:]]) == 0
    assert "note: 1 of 2 instances gets no input files" in capsys.readouterr().out


def test_a_directory_means_every_file_under_it_hidden_ones_left_out(tmp_path: Path):
    files(tmp_path, {"d/a.rec": 1, "d/sub/b.rec": 2, "d/.hidden": 3, "d/.git/c": 4})
    found = collect_inputs(["d"], cwd=str(tmp_path))
    assert [Path(p).relative_to(tmp_path).as_posix() for p in found.paths] == [
        "d/a.rec",
        "d/sub/b.rec",
    ]
    assert found.sizes == (1, 2)


def test_an_empty_directory_and_a_pattern_of_directories_say_what_they_are(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    files(tmp_path, {"data/x/a.rec": 1})
    with pytest.raises(InputError, match=r"^--input 'empty' is a directory with no files in it$"):
        collect_inputs(["empty"], cwd=str(tmp_path))
    with pytest.raises(InputError, match=r"matches only directories \(1, e\.g\. data/x\)"):
        collect_inputs(["data/*"], cwd=str(tmp_path))
    with pytest.raises(InputError, match=r"^--input 'nothing\*' matches no files$"):
        collect_inputs(["nothing*"], cwd=str(tmp_path))
