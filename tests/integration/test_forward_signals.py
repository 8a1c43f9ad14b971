"""--forward-signals with real processes: a chosen SIGHUP reaches every instance (on this machine
and on the ssh test hosts, past hydra under mpiexec), the program learns it as its checkpoint
signal (poprun_py.dist.on_checkpoint), the job goes on; SIGUSR2, not chosen, is ignored by
poprun-py and reaches no instance. Under mpirun and srun (no SIGHUP) USR2 alone is chosen and
USR1 reaches no rank. Nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.test_launch_hosts_cli import only_sshd, spec_for
from tests.integration.test_long_run_hosts import (
    Streamed,
    launch_args,
    started,
    stopped_at_the_end,
)
from tests.integration.test_slurm_cli import squeue_empty
from tests.slurmcluster import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

CHECKPOINT = """
import os, signal, sys, time
import poprun_py.dist as dist
got = []
dist.on_checkpoint(lambda *a: got.append("ckpt"))
signal.signal(getattr(signal, sys.argv[1]), lambda *a: got.append("other"))
rank = os.environ["RANK"]
print("ready", os.environ["POPRUN_CHECKPOINT_SIGNAL"], rank, flush=True)
deadline, told = time.monotonic() + 60, 0
while got.count("ckpt") < 2 and time.monotonic() < deadline:
    if len(got) > told:
        print("got", " ".join(got[told:]), rank, flush=True)
        told = len(got)
    time.sleep(0.02)
print("done", " ".join(got), rank, flush=True)
sys.exit(0 if got == ["ckpt", "ckpt"] else 5)
"""
"""Checkpoints on every checkpoint signal (POPRUN_CHECKPOINT_SIGNAL); records the signal named
by its argument too; ends after the second checkpoint, saying what it got (``done ckpt ckpt
RANK``: not the other signal)."""


def twice_after_the_other(
    run: Streamed, n: int, chosen: int = signal.SIGHUP, other: int = signal.SIGUSR2
) -> tuple[int, str, str]:
    """``other`` (not forwarded), then ``chosen``; once every instance said it got it,
    ``chosen`` again (an ``other`` wrongly passed on was sent before it: poprun-py forwards in
    order)."""
    run.wait_for(rf"\] ready {signal.Signals(chosen).name} \d$", n)
    run.proc.send_signal(other)
    run.proc.send_signal(chosen)
    run.wait_for(r"\] got .*ckpt", n)
    assert run.proc.poll() is None  # the job goes on
    run.proc.send_signal(chosen)
    return run.finish()


def assert_every_rank_checkpointed_twice(code: int, out: str, err: str, n: int) -> None:
    assert code == 0, err
    for rank in range(n):
        assert re.search(rf"\] done ckpt ckpt {rank}$", out, re.M), out
    assert "other" not in out and "interrupted" not in err


@pytest.mark.parametrize(
    "backend", ["local", pytest.param("mpiexec", marks=pytest.mark.requires("mpiexec.hydra"))]
)
def test_a_chosen_hup_reaches_every_local_instance_and_usr2_does_not(
    tmp_path: Path, backend: str
) -> None:
    program = tmp_path / "checkpoint.py"
    program.write_text(CHECKPOINT)
    args = ["launch", "-H", "localhost", "-n", "3", "-r", "3", "-b", backend]
    args += ["--forward-signals", "hup", "--", PY, str(program), "SIGUSR2"]
    with stopped_at_the_end(started(args, tmp_path, env=ENV)) as run:
        code, out, err = twice_after_the_other(run, 3)
    assert_every_rank_checkpointed_twice(code, out, err, 3)


@pytest.mark.hosts
@pytest.mark.parametrize("backend", ["ssh", "mpiexec"])
def test_a_chosen_hup_reaches_every_instance_on_every_host_and_usr2_does_not(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    program = tmp_path / "checkpoint.py"
    program.write_text(CHECKPOINT)
    args = ("--forward-signals", "SIGHUP", "--", PY, str(program), "SIGUSR2")
    with stopped_at_the_end(started(launch_args(spec, backend, 4, *args), tmp_path)) as run:
        code, out, err = twice_after_the_other(run, 4)
    assert_every_rank_checkpointed_twice(code, out, err, 4)
    only_sshd(test_cluster_4)


@pytest.mark.hosts
def test_under_mpirun_a_chosen_usr2_alone_reaches_every_rank_and_usr1_does_not(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    """Open MPI's mpirun cannot pass SIGHUP on (refused before launch): USR2 alone, then."""
    spec = spec_for(test_cluster_4, tmp_path)
    program = tmp_path / "checkpoint.py"
    program.write_text(CHECKPOINT)
    args = ("--forward-signals", "usr2", "--", PY, str(program), "SIGUSR1")
    with stopped_at_the_end(started(launch_args(spec, "mpirun", 4, *args), tmp_path)) as run:
        code, out, err = twice_after_the_other(run, 4, signal.SIGUSR2, signal.SIGUSR1)
    assert_every_rank_checkpointed_twice(code, out, err, 4)
    only_sshd(test_cluster_4)


@pytest.mark.hosts
def test_under_slurm_a_chosen_usr2_alone_reaches_every_task_and_usr1_does_not(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """srun ends the step on SIGHUP (refused before launch): USR2 alone, through srun."""
    program = tmp_path / "checkpoint.py"
    program.write_text(CHECKPOINT)
    nodes = ",".join(slurm_cluster.node_names[:2])
    args = ["launch", "-b", "slurm", "-H", nodes, "-r", "4", "-n", "4", "--time", "5"]
    args += ["--forward-signals", "USR2", "--", PY, str(program), "SIGUSR1"]
    with stopped_at_the_end(started(args, tmp_path, env=slurm_env)) as run:
        code, out, err = twice_after_the_other(run, 4, signal.SIGUSR2, signal.SIGUSR1)
    assert_every_rank_checkpointed_twice(code, out, err, 4)
    assert squeue_empty(slurm_env)
