"""Spare hosts on the slurm backend (poprun_py/backends/slurm.py, slurm_alloc.py): the
allocation holds the spares and survives a node failure (``--no-kill``), and the tasks of a node
srun reports failed are lost (so a restart puts a spare in that node's place, inside the
allocation). On the test Slurm: tests/integration/test_slurm_spares.py."""

from __future__ import annotations

from poprun_py.backends.slurm import (
    NODE_FAILED,
    TaskReport,
    slurm_request,
    spares_alone,
    task_results,
)
from poprun_py.backends.slurm_alloc import SlurmRequest, request_options
from poprun_py.core.result import InstanceState
from poprun_py.prepare.job import LaunchOptions, prepare, spares_only
from tests.unit.test_slurm_unit import HOSTS, _supervised


def test_the_tasks_of_a_failed_node_are_lost_and_the_others_as_before() -> None:
    report = TaskReport()
    report.scan("srun: error: Node failure on n2")
    report.scan("srun: error: n2: tasks 2-3: Killed")
    report.scan("srun: error: n1: tasks 0-1: Killed")
    result = task_results(_supervised(137), HOSTS, report)
    assert [r.state for r in result.instances][2:] == [InstanceState.LOST] * 2
    assert {r.detail for r in result.instances[2:]} == {NODE_FAILED}
    assert result.lost_hosts == ("n2",)
    assert all(r.state is not InstanceState.LOST for r in result.instances[:2])
    assert report.failed_nodes.keys() == {"n2"}


def test_the_allocation_holds_the_spares_and_survives_a_node_failure() -> None:
    def request(spares: str | None) -> SlurmRequest:
        options = LaunchOptions(program=("t",), hosts="n1,n2", spare_hosts=spares, backend="slurm")
        return slurm_request(prepare(options, environ={}))

    with_spare = request("n3")
    assert with_spare.nodelist == ("n1", "n2", "n3") and with_spare.no_kill
    assert "--no-kill" in request_options(with_spare)
    without = request(None)
    assert without.nodelist == ("n1", "n2") and not without.no_kill
    assert "--no-kill" not in request_options(without)


def test_the_spares_preflight_asks_for_each_spare_once_and_none_outside_an_allocation() -> None:
    """The restarts preflight the spares beside the hosts (spares_only): planned on the spares
    alone, each is one node (not counted again as a spare); outside an allocation that
    preflight asks Slurm for nothing (it would wait for the job's allocation, which holds
    them)."""
    options = LaunchOptions(program=("t",), hosts="n1,n2", spare_hosts="n3", backend="slurm")
    prep = prepare(options, environ={})
    alone = spares_only(prep)
    assert alone is not None and spares_alone(alone) and not spares_alone(prep)
    assert slurm_request(alone).nodelist == ("n3",) and slurm_request(alone).nodes == 1
