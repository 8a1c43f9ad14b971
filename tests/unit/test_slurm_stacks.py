"""The slurm backend's stack dumps at their seams: the dump step's program finds a step's tasks
by their environment and reports them by rank, the launcher's side finds the step and reads
the records back."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence

import pytest

from poprun_py.backends import slurm_stacks
from poprun_py.backends.slurm_stacks import PROGRAM, PROGRAM_VAR, found, stacks_argv, step_id
from poprun_py.hostside.bundle import BOOTSTRAP, payload
from poprun_py.hostside.stackdump import find_pyspy
from poprun_py.hostside.step_dump import dump_step, report_step
from tests import requirements

TASK = """
import time
print("ready", flush=True)
def wait_here():
    time.sleep(60)
wait_here()
"""


@pytest.fixture
def task() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "SLURM_JOB_ID": "t-job", "SLURM_STEP_ID": "4", "SLURM_PROCID": "3"}
    proc = subprocess.Popen([sys.executable, "-c", TASK], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_steps_tasks_are_found_by_their_environment_under_slurms_rank(
    task: subprocess.Popen[bytes],
) -> None:
    assert dump_step("t-job", "4", None) == {3: None}
    assert dump_step("t-job", "5", None) == {}  # another step of the job


@pytest.mark.requires("ptrace")  # py-spy reads a task it did not start
def test_the_dump_step_reports_each_ranks_stacks_as_records(task: subprocess.Popen[bytes]) -> None:
    if find_pyspy() is None:
        pytest.skip(requirements.reason(["py-spy"]))
    out = io.BytesIO()
    report_step(["t-job", "4", "2"], out)
    dumps = found(out.getvalue().split(b"\n"))
    assert list(dumps) == [3]
    lines = dumps[3] or []
    assert any(line.startswith(b"Thread ") for line in lines), lines
    assert any(b"wait_here" in line for line in lines), lines
    assert out.getvalue().endswith(b"w 3 py-spy\n")


def test_the_dump_steps_program_ships_as_every_hostside_program_and_runs_alone() -> None:
    """One mechanism (the issue's): the bundle in a named variable, started by the bootstrap
    under ``python3 -S``; no source in srun's argv."""
    argv = stacks_argv("42", "7", ["n1"], "poprun-j", 0.5)
    start = argv.index("-c") - 2
    assert argv[start:] == ["python3", "-S", "-c", BOOTSTRAP, PROGRAM_VAR, "42", "7", "0.5"]
    text = payload(PROGRAM).text
    assert all(text not in a and "def report_step" not in a for a in argv)
    done = subprocess.run(
        [sys.executable, "-S", "-I", *argv[start + 2 : -3], "no-such-job", "0", "0.5"],
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"], PROGRAM_VAR: text},
    )
    assert done.stdout == b""  # no task of that step here


def test_records_become_rank_dumps_and_other_lines_are_ignored() -> None:
    lines = [b"s 2 Thread 1 (idle)", b"s 2     f (a.py:1)", b"w 2 py-spy", b"w 0 none", b"x 1 y"]
    assert found(lines) == {2: [b"Thread 1 (idle)", b"    f (a.py:1)"], 0: None}


def test_the_newest_running_step_of_the_jobs_name_is_dumped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listing = "42.1 poprun-j\n42.3 poprun-j\n42.4 poprun-j-stacks\n43.5 poprun-j\n42.2 other\n"
    asked: list[Sequence[str]] = []

    def client(argv: Sequence[str], environ: Mapping[str, str], timeout: float | None) -> str:
        asked.append(argv)
        return listing

    monkeypatch.setattr(slurm_stacks, "client", client)
    assert step_id("42", ["poprun-j"], {}) == "3"
    assert step_id("42", ["nothing"], {}) is None
    assert "--jobs=42" in asked[0] and "--steps" in asked[0]
