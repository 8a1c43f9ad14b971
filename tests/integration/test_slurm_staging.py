"""`--backend slurm` with a job directory the nodes do not share, on the real test Slurm.

The session's test nodes each have a private, empty ``JOBS_ROOT`` (a tmpfs in their slurmd's
mount namespace, see tests/slurmcluster.py), as real nodes have their own /tmp; the rest of the
filesystem (the program, this checkout, /tmp itself) is shared. A launch without
``--output-dir`` writes its job files under ``JOBS_ROOT`` here, which no node can see: the step
must carry them (``srun --bcast`` stages the task script, each task writes its shard beside
it), and the staged files must be gone from every node afterwards."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from poprun_py.launch.launcher import JOBS_ROOT
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.slurm


def srun_each(cluster: SlurmCluster, env: Mapping[str, str], script: str) -> list[str]:
    nodes = cluster.node_names
    argv = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--time=1", "sh", "-c", script]  # fmt: skip
    out = subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_nodes_do_not_see_this_machines_job_directories(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    mine = Path(JOBS_ROOT) / f"probe-{uuid.uuid4().hex[:8]}"
    mine.mkdir(parents=True)
    try:
        (mine / "here").write_text("x")
        shared = tmp_path / "here"
        shared.write_text("x")
        probe = f"test -e {mine}/here && echo seen || echo unseen; test -e {shared} && echo shared"
        assert sorted(srun_each(slurm_cluster, slurm_env, probe)) == sorted(
            ["unseen", "shared"] * len(slurm_cluster.node_names)
        )
    finally:
        (mine / "here").unlink()
        mine.rmdir()


def test_launch_without_output_dir_stages_its_job_files_on_every_node(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        (data / f"part-{i}.txt").write_text("x" * (i + 1))
    nodes = slurm_cluster.node_names
    files = '$(tr "\\n" , <"$POPRUN_SHARD_FILE")'
    show = f'echo "RANK=$RANK HOST=$(hostname) SHARD=$POPRUN_SHARD_FILE FILES={files}"'
    argv = [sys.executable, "-m", "poprun_py", "launch", "--backend", "slurm",
            "--hosts", ",".join(nodes), "-n", "3", "--no-numa-aware", "--time", "5",
            "--input", str(data / "*.txt"), "--", "sh", "-c", show]  # fmt: skip
    staged = "poprun" + JOBS_ROOT.replace("/", "-")  # the stage path srun.j2 derives from it
    before = set(Path("/tmp").glob(f"{staged}-*"))
    proc = subprocess.run(argv, env=slurm_env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=90, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    found = re.findall(r"\[(\S+):(\d)\] RANK=(\d) HOST=(\S+) SHARD=(\S+) FILES=(\S*)", proc.stdout)
    assert len(found) == 3, proc.stdout + proc.stderr
    shards: list[str] = []
    for host, index, rank, actual, shard, files in sorted(found, key=lambda f: f[1]):
        assert (host, index, rank, actual) == (nodes[int(index)], index, index, nodes[int(index)])
        # the job directory was not there: the task wrote its shard beside the staged script
        assert re.fullmatch(rf"/tmp/{re.escape(staged)}-\S+\.shard-{index}\.txt", shard)
        shards += [f for f in files.split(",") if f]
    assert sorted(shards) == sorted(str(p) for p in data.glob("*.txt"))  # each file once
    left = set(Path("/tmp").glob(f"{staged}-*")) - before
    assert left == set(), "staged files left on the nodes"
    assert "warning" not in proc.stderr
