"""Hostile strings reach the program byte for byte, through the local and the mpirun backends.

Program arguments, environment values, the program's own path, the working directory and input
file names carry spaces, quotes, ``$()``, backticks, ``;``, globs, newlines (not in file names:
a shard file holds one name a line) and non-ASCII. A child (examples/dump_args.py) prints what
it received as JSON; nothing may have been interpreted by a shell on the way.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from poprun_py.backends.local import LocalBackend
from poprun_py.backends.mpirun import MpirunBackend
from poprun_py.core.plan import LaunchPlan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.shard import InputFile, InputSet
from poprun_py.core.spec import EnvVar
from tests.integration.helpers import EXAMPLES, make_job, mpirun_job, need_mpi, plan_for

NASTY = [
    "two words",
    "it's",
    'say "hi"',
    "$(touch /tmp/pwned-poprun)",
    "`touch /tmp/pwned-poprun`",
    "a; touch /tmp/pwned-poprun",
    "line one\nline two",
    "tab\there",
    "*",
    "~",
    "$HOME",
    "back\\slash",
    "# not a comment",
    ":",
    "--flag=value",
    "",
    "naïve 東京 ✓",
]
FILE_NAMES = [n for n in NASTY if "\n" not in n and "/" not in n and n not in ("", "*", "~")]


def hostile_plan(
    tmp_path: Path, instances: int, workdir: bool = True
) -> tuple[LaunchPlan, list[str]]:
    """A plan whose program, args, env, workdir (when asked for) and inputs are all hostile."""
    weird = tmp_path / "dir with 'quotes' $(x) `y`; ünï"
    weird.mkdir()
    program = weird / "dump args.py"
    shutil.copy(EXAMPLES / "dump_args.py", program)
    workdir_path = tmp_path / "work dir; $(x)"
    workdir_path.mkdir()
    inputs = []
    for n, name in enumerate(FILE_NAMES):
        path = tmp_path / "inputs" / f"{n} {name}"
        path.parent.mkdir(exist_ok=True)
        path.write_text(name)
        inputs.append(InputFile(str(path), 100 + n))
    env = tuple(EnvVar(f"NASTY_{n}", value) for n, value in enumerate(NASTY))
    names = ",".join(e.name for e in env)
    env += (EnvVar("DUMP_ENV", names),)
    plan = plan_for(
        [sys.executable, str(program), *NASTY],
        "localhost",
        instances=instances,
        inputs=InputSet.of(inputs),
        env=env,
        workdir=str(workdir_path) if workdir else None,
    )
    return plan, [e.name for e in env[:-1]]


def check_received(
    result: LaunchResult, lines: list[tuple[int, str, str]], plan: LaunchPlan
) -> None:
    """Every instance received exactly what the plan says."""
    assert result.ok, lines
    seen = {i: json.loads(line) for i, s, line in lines if s == "stdout" and i >= 0}
    assert sorted(seen) == [inst.index for inst in plan.instances]
    for inst in plan.instances:
        got = seen[inst.index]
        assert got["argv"] == NASTY
        assert got["env"] == {f"NASTY_{n}": value for n, value in enumerate(NASTY)}
        assert got["cwd"] == (plan.workdir or os.getcwd())
        assert got["shard"] == list(inst.shard.files)
    assert not Path("/tmp/pwned-poprun").exists()


# Without a workdir the local backend starts instances with posix_spawn, with one through Popen.
@pytest.mark.parametrize("workdir", [False, True], ids=["posix_spawn", "popen-with-cwd"])
def test_hostile_strings_reach_local_instances_intact(tmp_path: Path, workdir: bool) -> None:
    plan, _ = hostile_plan(tmp_path, instances=2, workdir=workdir)
    lines: list[tuple[int, str, str]] = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)))
    result = LocalBackend().run(make_job(plan, tmp_path / "job"), opts)
    check_received(result, lines, plan)


@pytest.mark.mpi
def test_hostile_strings_reach_mpi_ranks_intact(tmp_path: Path) -> None:
    need_mpi()
    plan, _ = hostile_plan(tmp_path, instances=2)
    lines: list[tuple[int, str, str]] = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)))
    result = MpirunBackend().run(mpirun_job(plan, tmp_path), opts)
    check_received(result, lines, plan)
