"""``--network`` inside a real test Slurm: one discovery step finds each node's interface
(``GLOO_SOCKET_IFNAME``, ``MASTER_ADDR`` on the network), a network no node is on is exit 3
naming the nodes; nothing is left in squeue."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_slurm_cli import logs, poprun, squeue_empty
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm

SHOW = 'echo "$RANK $GLOO_SOCKET_IFNAME $NCCL_SOCKET_IFNAME $MASTER_ADDR"'


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
