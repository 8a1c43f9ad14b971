"""slurm: after a node failure the root cause is the node's failure, not a task Slurm killed on
another node because of it -- whichever of srun's lines came first (poprun_py/backends/slurm.py,
TaskReport and task_results). On the test Slurm: tests/integration/test_slurm_spares.py."""

from __future__ import annotations

import signal

import pytest

from poprun_py.backends.slurm import NODE_FAILED, TaskReport, task_results
from poprun_py.core.result import InstanceState
from poprun_py.launch.restarts import why_failed
from tests.unit.test_slurm_unit import HOSTS, _supervised

NODE = "srun: error: Node failure on n2"
KILLED = "srun: error: n1: tasks 0-1: Killed"


@pytest.mark.parametrize("lines", [(NODE, KILLED), (KILLED, NODE)])
def test_the_root_cause_is_the_failed_node(lines: tuple[str, str]) -> None:
    report = TaskReport()
    for line in lines:
        report.scan(line)
    result = task_results(_supervised(137), HOSTS, report)
    root = result.root_cause
    assert root is not None and root.host == "n2" and root.state is InstanceState.LOST
    assert root.detail == NODE_FAILED
    assert why_failed(result) == f"instance 2 on n2 lost contact with host n2 ({NODE_FAILED})"
    killed = result.instances[:2]
    assert [r.state for r in killed] == [InstanceState.STOPPED] * 2
    assert {r.signal for r in killed} == {signal.SIGKILL}
    assert {r.detail for r in killed} == {"step ended after node n2 failed"}
    assert [r.index for r in result.failures] == [2, 3]


def test_a_task_that_failed_on_its_own_before_the_node_failure_stays_the_root_cause() -> None:
    report = TaskReport()
    report.scan("srun: error: n1: task 0: Exited with exit code 3")
    report.scan(NODE)
    result = task_results(_supervised(1), HOSTS, report)
    root = result.root_cause
    assert root is not None and (root.index, root.exit_code) == (0, 3)
    assert {r.state for r in result.instances[2:]} == {InstanceState.LOST}
