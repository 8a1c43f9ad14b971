"""A big ``mpiexec`` job across real test hosts: the form whose command line does not grow
(one context of every rank; each rank reads its line of the job's ``appfile``, staged on every
host by the agents) places every rank on its plan host, with its environment, and MPI works
(an allreduce over every rank), as the inline form does in ``test_mpiexec.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun_py.backends.mpi import source_address
from poprun_py.backends.mpiexec import mpiexec_args
from poprun_py.providers.netns import TestCluster
from poprun_py.render.job import render_job
from tests.integration.test_mpiexec import (
    assert_clean,
    mpi_program,
    plan_on,
    ranks_seen,
    run,
    staged,
)

__all__ = ["mpi_program"]  # the fixture, compiled once per module

pytestmark = pytest.mark.mpi


@pytest.mark.hosts
def test_big_mpiexec_form_across_four_hosts_through_the_agents(
    mpi_program: str,  # the fixture imported above
    test_cluster_4: TestCluster,
    tmp_path: Path,
) -> None:
    plan = plan_on(test_cluster_4, [mpi_program], per_host=3)
    here = source_address(test_cluster_4.hosts[0].address)
    args = mpiexec_args((), local_address=str(here))
    job = render_job(plan, "mpiexec", job_dir=str(tmp_path / "job"), mpi_args=args, argv_limit=1)
    assert job.launcher[job.launcher.index("-n") + 1] == "12"  # one context of every rank
    assert job.launcher[-1] == "poprun-rank" and "appfile" in job.files
    with staged(test_cluster_4, job) as agents:
        result, lines = run(job, agents)
    assert result.ok, lines
    ranks = ranks_seen(lines)
    n = plan.num_instances
    assert sorted(ranks) == list(range(n))
    for inst in plan.instances:
        seen = ranks[inst.index]
        assert (seen["rank"], seen["size"], seen["allreduce"]) == (inst.index, n, n * (n + 1) // 2)
        assert seen["hostname"] == inst.host == test_cluster_4.hosts[inst.host_index].name
        assert seen["RANK"] == str(inst.index)
        assert seen["POPRUN_HOST_INDEX"] == str(inst.host_index)
    assert_clean(test_cluster_4, mpi_program)
