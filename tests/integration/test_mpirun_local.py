"""The mpirun backend on one host: real Open MPI ranks, tagged output, failures, interrupts."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from poprun_py.backends.mpirun import MPIRUN_MISSING, FailureReport, MpirunBackend, TagDemux
from poprun_py.core.plan import LaunchPlan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.errors import BackendError
from poprun_py.process.output import LAUNCHER_INDEX, Output
from tests.integration.helpers import (
    EXAMPLES,
    example_inputs,
    left_behind,
    mpirun_job,
    need_mpi,
    plan_for,
    start_driver,
    unique_sleep,
    wait_ready,
    zombies,
)
from tests.ports import held_port

PY = sys.executable


def run_mpi(
    plan: LaunchPlan, tmp_path: Path, **options: object
) -> tuple[LaunchResult, list[tuple[int, str, str]]]:
    """Run through MpirunBackend with a capturing sink."""
    lines: list[tuple[int, str, str]] = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **options)  # type: ignore[arg-type]
    return MpirunBackend().run(mpirun_job(plan, tmp_path), opts), lines


@pytest.mark.mpi
def test_four_ranks_agree_with_the_plan(tmp_path: Path) -> None:
    need_mpi()
    plan = plan_for([PY, str(EXAMPLES / "mpi_check.py")], "localhost", instances=4)
    result, lines = run_mpi(plan, tmp_path, output_dir=tmp_path / "logs")
    assert result.ok, lines
    ranks = {i: json.loads(line) for i, s, line in lines if s == "stdout" and i >= 0}
    assert sorted(ranks) == [0, 1, 2, 3]
    for inst in plan.instances:
        seen = ranks[inst.index]
        assert (seen["rank"], seen["size"], seen["allreduce"]) == (inst.index, 4, 10)
        env = seen["env"]
        assert env["POPDIST_INSTANCE_INDEX"] == env["RANK"] == str(inst.index)
        assert env["POPDIST_NUM_INSTANCES"] == env["WORLD_SIZE"] == "4"
        assert env["POPDIST_REPLICA_INDEX_OFFSET"] == str(inst.replica_offset)
        log = (tmp_path / "logs" / f"instance-{inst.index}.log").read_text()
        assert json.loads(log)["rank"] == inst.index
    assert [r.state for r in result.instances] == ["exited"] * 4


@pytest.mark.mpi
def test_failing_rank_is_the_root_cause_and_the_rest_are_stopped(tmp_path: Path) -> None:
    need_mpi()
    marker = unique_sleep()
    script = f'if [ "$RANK" = 2 ]; then sleep 0.5; exit 3; fi; exec sleep {marker}'
    plan = plan_for(["sh", "-c", script], "localhost", instances=4)
    result, lines = run_mpi(plan, tmp_path, grace_period=3)
    assert result.exit_code == 3, lines
    assert result.root_cause is not None and result.root_cause.index == 2
    assert [r.state for r in result.instances] == ["stopped", "stopped", "exited", "stopped"]
    assert any(i == LAUNCHER_INDEX and "Process name" in line for i, _, line in lines)
    assert left_behind(f"sleep {marker}") == []
    assert zombies() == []


@pytest.mark.mpi
def test_training_example_under_mpi_uses_allreduce(tmp_path: Path) -> None:
    need_mpi()
    inputs = example_inputs(tmp_path / "data")
    program = [PY, str(EXAMPLES / "train.py"), "--steps", "20"]
    with held_port() as port:  # MASTER_PORT, the run's until it ends (tests/ports.py)
        plan = plan_for(program, "localhost", instances=4, inputs=inputs, master_port=port)
        result, lines = run_mpi(plan, tmp_path)
    assert result.ok, lines
    finals = {i: line for i, s, line in lines if s == "stdout" and line.startswith("final")}
    assert sorted(finals) == [0, 1, 2, 3]
    assert len({line.split(" instance ")[0] for line in finals.values()}) == 1


DRIVER = """
import json, pickle, sys
from poprun_py.core.result import RunOptions
from poprun_py.backends.mpirun import MpirunBackend
job = pickle.load(open(sys.argv[1], "rb"))
result = MpirunBackend().run(job, RunOptions(grace_period=3.0))
print(json.dumps({"interrupted": result.interrupted, "exit_code": result.exit_code,
                  "states": [r.state for r in result.instances]}), flush=True)
"""


@pytest.mark.mpi
def test_interrupting_mpirun_stops_every_rank(tmp_path: Path) -> None:
    need_mpi()
    marker = unique_sleep()
    plan = plan_for(["sh", "-c", f"echo ready; exec sleep {marker}"], "localhost", instances=3)
    driver = start_driver(DRIVER, mpirun_job(plan, tmp_path), tmp_path)
    wait_ready(driver, 3, "rank")
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=30)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary == {"interrupted": True, "exit_code": 130, "states": ["stopped"] * 3}
    assert left_behind(f"sleep {marker}") == []


def test_missing_mpirun_is_one_line_backend_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = mpirun_job(plan_for(["true"], "localhost", instances=2), tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendError) as caught:
        MpirunBackend().run(job, RunOptions())
    assert str(caught.value) == MPIRUN_MISSING


def demux(chunks: list[bytes]) -> tuple[list[tuple[int, str, str]], FailureReport]:
    """Feed ``chunks`` of mpirun's stdout through a TagDemux; return the lines it emits."""
    lines: list[tuple[int, str, str]] = []
    out = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {})
    report = FailureReport()
    feed = TagDemux(out, "stdout", report)
    for chunk in chunks:
        feed.feed(chunk)
    feed.close()
    return lines, report


def test_tag_demux_joins_pieces_of_a_rank_line_interleaved_with_other_ranks() -> None:
    # As Open MPI 4.1 wrote it: rank 2's line arrives in three tagged chunks.
    stream = (
        b"[1,2]<stdout>:hello[1,3]<stdout>:from 3\n"
        b"[1,2]<stdout>: [1,2]<stdout>:2\n"
        b"[1,0]<stderr>:oops\n"
    )
    lines, _ = demux([stream[:23], stream[23:31], stream[31:]])
    assert lines == [
        (3, "stdout", "from 3"),
        (2, "stdout", "hello 2"),
        (0, "stderr", "oops"),
    ]


def test_tag_demux_gives_untagged_lines_to_mpirun_and_reads_its_report() -> None:
    lines, report = demux(
        [b"[1,0]<stdout>:x\n--------\n  Process name: [[15968,1],2]\n  Exit code:    3\n\n"]
    )
    assert lines[0] == (0, "stdout", "x")
    assert [line for i, _, line in lines[1:] if i == LAUNCHER_INDEX][1:3] == [
        "  Process name: [[15968,1],2]",
        "  Exit code:    3",
    ]
    assert (report.rank, report.exit_code) == (2, 3)


def test_failure_report_reads_signals_and_aborts() -> None:
    by_signal = FailureReport()
    by_signal.scan("mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9")
    aborted = FailureReport()
    aborted.scan("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD with errorcode 5")
    assert (by_signal.rank, by_signal.signal) == (1, 9)
    assert (aborted.rank, aborted.exit_code) == (3, 5)
