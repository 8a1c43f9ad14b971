"""A hang's verdict (core/stacks.py): stacks read from py-spy's and faulthandler's real output,
grouped by the main thread's place whatever the thread ids, addresses and install paths, and
one line naming the odd ranks."""

from __future__ import annotations

import json

from poprun_py.core.stacks import describe, main_thread, threads, verdict

PYSPY = """\
Process {pid}: /usr/bin/python3 /tmp/stuck.py x
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    {inner} ({file}:{line})
    train (stuck.py:8)
    <module> (stuck.py:10)
Thread {tid} (idle): "helper"
    <lambda> (stuck.py:9)
    Thread.run (threading.py:982)
    Thread._bootstrap (threading.py:1002)
""".splitlines()

FAULTHANDLER = """\
Current thread 0x{tid:016x} (most recent call first):
  File "/tmp/stuck.py", line 9 in <lambda>
  File "{prefix}/lib/python3.11/threading.py", line 982 in run
  File "{prefix}/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x{main:016x} (most recent call first):
  File "/home/u/{file}", line {line} in {inner}
  File "/home/u/stuck.py", line 8 in train
  File "/home/u/stuck.py", line 10 in <module>
""".splitlines()


def pyspy(pid: int, inner: str = "all_reduce", file: str = "stuck.py", line: int = 6) -> list[str]:
    return [x.format(pid=pid, tid=pid + 40, inner=inner, file=file, line=line) for x in PYSPY]


def faulthandler(
    tid: int, inner: str = "all_reduce", file: str = "stuck.py", line: int = 6
) -> list[str]:
    values = {"tid": tid, "main": tid + 0x1000, "prefix": f"/opt/py{tid}", "file": file}
    return [x.format(**values, line=line, inner=inner) for x in FAULTHANDLER]


def test_py_spy_threads_are_read_innermost_first_and_the_main_thread_is_picked() -> None:
    found = threads(["step 3 loss 0.5", *pyspy(100), "later output"])
    assert [t.name for t in found] == ["MainThread", "helper"]
    main = main_thread(found)
    assert main is not None
    assert main.frames == (
        "all_reduce (stuck.py:6)",
        "train (stuck.py:8)",
        "<module> (stuck.py:10)",
    )


def test_faulthandler_threads_are_read_and_the_main_thread_is_the_one_running_the_module() -> None:
    found = threads(faulthandler(0x7F00))
    assert len(found) == 2
    main = main_thread(found)
    assert main is not None  # not the "Current thread" that caught the signal: the helper
    assert main.frames[0] == "all_reduce (stuck.py:6)"
    assert main.frames[-1] == "<module> (stuck.py:10)"


def test_thread_ids_addresses_and_paths_do_not_split_a_group() -> None:
    dumps = {0: pyspy(100), 1: pyspy(205), 2: pyspy(377)}
    assert len(verdict(dumps, {}).groups) == 1
    both = {0: faulthandler(0x7F00), 1: faulthandler(0x7A55)}
    assert len(verdict(both, {}).groups) == 1


def test_the_verdict_names_the_odd_rank_and_its_host() -> None:
    dumps = {r: pyspy(100 + r) for r in range(8)}
    dumps[5] = pyspy(105, inner="load_batch", file="data.py", line=88)
    hosts = {r: f"node0{1 + r // 2}" for r in range(8)}
    hang = verdict(dumps, hosts)
    assert hang.text == (
        "7 of 8 ranks wait in all_reduce (stuck.py:6); "
        "rank 5 on node03 is in load_batch (data.py:88)"
    )
    assert [g.ranks for g in hang.groups] == [(5,), (0, 1, 2, 3, 4, 6, 7)]
    assert hang.groups[0].hosts == ("node03",)


def test_groups_are_listed_smallest_first_and_ranks_without_stacks_are_named() -> None:
    dumps = {r: pyspy(r) for r in range(6)}
    dumps[1] = dumps[2] = pyspy(1, inner="save", file="ckpt.py", line=3)
    dumps[4] = ["no stacks here"]
    hang = verdict(dumps, {r: "h1" if r < 3 else "h2" for r in range(6)})
    assert [len(g.ranks) for g in hang.groups] == [2, 3]
    assert hang.text == (
        "3 of 6 ranks wait in all_reduce (stuck.py:6); ranks 1, 2 on h1 are in save (ckpt.py:3); "
        "no stacks from rank 4 (h2)"
    )
    assert hang.no_stacks == (4,)


def test_the_same_place_everywhere_says_so() -> None:
    hang = verdict({0: pyspy(1), 1: faulthandler(2)}, {0: "a", 1: "b"})
    assert hang.text == "all 2 ranks are in all_reduce (stuck.py:6)"


def test_no_stacks_at_all_and_many_odd_groups() -> None:
    assert verdict({0: [], 1: ["x"]}, {0: "h1", 1: "h1"}).text == "no stacks from ranks 0, 1 (h1)"
    dumps = {r: pyspy(r, inner=f"f{r}") for r in range(5)}
    dumps.update({r: pyspy(r) for r in range(5, 9)})
    text = verdict(dumps, {}).text
    assert text.startswith("4 of 9 ranks wait in all_reduce (stuck.py:6); rank 0 on ? is in f0")
    assert text.endswith("; 2 more groups")


def test_json_and_the_printed_groups() -> None:
    dumps = {
        0: pyspy(1),
        1: pyspy(2, inner="load_batch", file="data.py", line=88),
        2: [],
        3: pyspy(4),
    }
    hang = verdict(dumps, {0: "h1", 1: "h2", 2: "h3", 3: "h4"})
    data = json.loads(json.dumps(hang.to_json()))
    assert data["verdict"] == hang.text and data["ranks"] == 4 and data["no_stacks"] == [2]
    assert data["groups"][0] == {
        "ranks": [1],
        "hosts": ["h2"],
        "where": "load_batch (data.py:88)",
        "frames": ["load_batch (data.py:88)", "train (stuck.py:8)", "<module> (stuck.py:10)"],
    }
    lines = describe(hang)
    assert lines[0] == f"hang verdict: {hang.text}"
    assert lines[1:3] == ["  rank 1 on h2:", "    load_batch (data.py:88)"]
