"""The Slurm preflight step at its seam (poprun_py/backends/slurm_discover.py), with stand-in
``srun``/``squeue``/``scancel``/``scontrol`` scripts on PATH: a step that does not answer in time
is killed and cancelled by its own name, nothing of it left; a step that fails as a whole is one
fault, not one per node; a node the job holds only in part is planned without its topology. The
real step runs on the test Slurm (tests/integration/test_network_slurm.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from poprun_py.backends import slurm_discover
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.errors import PreflightError
from poprun_py.process.proctree import alive


def plan(hosts: str = "n[1-2]") -> LaunchPlan:
    return make_plan(cluster_from_hosts(parse_hosts(hosts)), JobSpec(("true",), replicas=2))


def tools(tmp_path: Path, srun: str, scontrol: str = "") -> dict[str, str]:
    """Stand-ins on PATH: ``srun`` runs ``srun`` (its --job-name saved), ``squeue --steps``
    lists that name as step 7.0, ``scancel`` records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": 'for a; do case $a in --job-name=*) echo "${a#--job-name=}" > "$D/name";; esac;'
        ' done\necho $$ > "$D/pid"\n' + srun,
        "squeue": 'case "$*" in *--steps*) echo "7.0 $(cat "$D/name")";; esac',
        "scancel": 'echo "$*" >> "$D/scancel"',
        "scontrol": scontrol,
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "D": str(tmp_path)}


def test_a_step_without_an_answer_is_killed_and_cancelled_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_discover, "TIMEOUT", 0.5)
    env = tools(tmp_path, "exec sleep 30")
    monkeypatch.setenv("PATH", env["PATH"])
    t0 = time.monotonic()
    with pytest.raises(PreflightError, match=r"preflight step: no answer in 0\.5 s"):
        slurm_discover.discover_nodes(plan(), env, "7")
    assert time.monotonic() - t0 < 10
    name = (tmp_path / "name").read_text().strip()
    assert name.startswith("poprun-preflight-") and name != "poprun-preflight-"
    assert (tmp_path / "scancel").read_text().split() == ["--signal=KILL", "7.0"]
    assert not alive({int((tmp_path / "pid").read_text())})  # srun is gone


def test_a_step_failing_as_a_whole_is_one_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = 'echo "srun: error: Unable to create step: Invalid node name" >&2; exit 1'
    env = tools(tmp_path, failing)
    monkeypatch.setenv("PATH", env["PATH"])
    with pytest.raises(PreflightError) as caught:
        slurm_discover.discover_nodes(plan(), env, "7")
    assert [(f.host, f.check) for f in caught.value.faults] == [("localhost", "srun")]
    assert "Invalid node name" in caught.value.faults[0].detail


SYSFS = 'echo "topology sysfs"; echo "/sys/devices/system/node/node0/cpulist:0-3"'


def test_only_nodes_the_job_holds_whole_keep_their_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = f'for r in 0 1; do ( echo "host n$((r + 1))"; {SYSFS} ) | sed "s/^/$r: /"; done'
    held = "echo JobId=7 Nodes=n1 CPU_IDs=0-3 Mem=0 Nodes=n2 CPU_IDs=0-1 Mem=0"
    env = tools(tmp_path, answer, held)
    monkeypatch.setenv("PATH", env["PATH"])
    report = slurm_discover.discover_nodes(plan(), env, "7")
    topologies = report.topologies
    assert topologies["n1"] is not None and len(topologies["n1"].cpus) == 4
    assert topologies["n2"] is None  # 2 of its 4 CPUs are the job's: not bound from it
    assert "holds only some CPUs of node(s) n2 (2 of 4)" in report.warnings[-1]
