"""Preflight inside a real test Slurm: one step checks every node and discovers its hardware.
With ``--network`` it finds each node's interface (``GLOO_SOCKET_IFNAME``, ``MASTER_ADDR`` on
the network), and a network no node is on is exit 3 naming the nodes; without a declared
topology the nodes' discovered NUMA topology binds the instances where the job holds whole
nodes, and inside a shared allocation Slurm places them (with a warning); a program missing on
the nodes is exit 3 before anything starts; ``check`` runs on the nodes. Nothing is left in
squeue."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.core.topology import parse_cpulist
from poprun_py.prepare.discover import discover_local
from tests.integration.test_slurm_cli import logs, poprun, squeue_empty
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

SHOW = 'echo "$RANK $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME $MASTER_ADDR"'
AFFINITY = "echo $RANK $SLURMD_NODENAME $(grep Cpus_allowed_list /proc/self/status | cut -f2)"


def test_slurm_nodes_get_their_interface_in_the_network(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = slurm_cluster.nodes[:2]
    out = tmp_path / "out"
    args = ["launch", "--backend", "slurm", "--hosts", ",".join(n.name for n in nodes)]
    proc = poprun(
        [*args, "-n", "2", "--time", "5", "-o", str(out), "--network", "198.18.0.0/15",
         "--", "sh", "-c", SHOW],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert logs(out, 2) == [[str(i), "eth0", "eth0", nodes[0].address] for i in range(2)]
    marker = tmp_path / "ran"
    proc = poprun(
        [*args, "--time", "5", "--network", "198.19.254.0/24", "--", "touch", str(marker)],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert (
        all(n.name in proc.stderr for n in nodes) and "no address in 198.19.254.0/24" in proc.stderr
    )
    assert squeue_empty(slurm_env)


def node_hardware(slurm_cluster: SlurmCluster) -> dict[str, int]:
    """The CPUs and threads per core Slurm gives each test node (slurm.conf, from this
    machine's ``slurmd -C``: the nodes are namespaces of it)."""
    line = next(x for x in slurm_cluster.conf.read_text().splitlines() if x.startswith("NodeName="))
    fields = dict(part.split("=", 1) for part in line.split())
    return {"cpus": int(fields["CPUs"]), "threads": int(fields["ThreadsPerCore"])}


def test_slurm_nodes_topology_is_discovered_and_binds_the_instances_on_whole_nodes(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    every = set(discover_local().cpus)  # the nodes share this machine's sysfs: what they find
    hardware = node_hardware(slurm_cluster)
    nodes = slurm_cluster.node_names[:2]
    out = tmp_path / "out"
    args = ["launch", "--backend", "slurm", "--hosts", ",".join(nodes), "--time", "5"]
    per_node = hardware["cpus"]  # one task per CPU: the allocation holds each node whole
    proc = poprun(
        [*args, "-n", str(2 * per_node), "-o", str(out), "--", "sh", "-c", AFFINITY],
        slurm_env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    seen = logs(out, 2 * per_node)
    for node in nodes:  # each node's instances: CPUs of their own, all of them between them
        mine = [set(parse_cpulist(line[2])) for line in seen if line[1] == node]
        assert len(mine) == per_node and all(mine), seen
        assert sum(len(cpus) for cpus in mine) == len(set().union(*mine)), seen  # disjoint
        assert set().union(*mine) == every, seen
    assert "holds only some CPUs" not in proc.stderr
    inside = ["salloc", "--nodes=2", "--ntasks=2", f"--nodelist={','.join(nodes)}", "-t", "5"]
    proc = subprocess.run(
        [*inside, sys.executable, "-m", "poprun_py", *args[:-2], "-n", "2", "-o", str(out),
         "--", "sh", "-c", AFFINITY],
        env=slurm_env, cwd=tmp_path, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip  # inside the user's allocation, not exclusive: one core of each node
    assert proc.returncode == 0, proc.stderr
    placed = [line[2] for line in logs(out, 2)]  # by Slurm, on the CPUs the job holds
    assert all(parse_cpulist(cpus) for cpus in placed), placed
    held, total = hardware["threads"], len(every)  # a core: its threads
    shared = f"holds only some CPUs of node(s) {nodes[0]} ({held} of {total}), {nodes[1]} ("
    # one core is the whole node only on a one-core machine: then no warning is due
    assert (shared in proc.stderr) == (held < total), proc.stderr
    assert squeue_empty(slurm_env)


def test_a_program_missing_on_the_slurm_nodes_is_a_preflight_fault(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = slurm_cluster.node_names[:2]
    proc = poprun(
        ["launch", "--backend", "slurm", "--hosts", ",".join(nodes), "--time", "5",
         "--", "/no/such/trainer", "--steps", "3"],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert all(n in proc.stderr for n in nodes) and "/no/such/trainer" in proc.stderr
    assert "not an executable file" in proc.stderr
    assert squeue_empty(slurm_env)


def test_check_runs_on_the_slurm_nodes_through_the_step(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = slurm_cluster.node_names[:2]
    proc = poprun(
        ["check", "--backend", "slurm", "--hosts", ",".join(nodes), "-n", "4", "--time", "5",
         "--network", "198.18.0.0/15", "--format", "json"],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [h["host"] for h in report["hosts"]] == list(nodes), report
    assert all(h["ok"] and h["instances"] == 2 for h in report["hosts"]), report
    assert squeue_empty(slurm_env)
