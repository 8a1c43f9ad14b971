"""Slurm's preflight step checks the program and the working directory on the nodes even when
nothing is left to discover (every node's topology declared, no ``--network``: issue 20, item
16), with stand-in ``srun``/``scontrol`` on PATH inside a stand-in allocation. The real step
runs on the test Slurm (tests/integration/test_network_slurm.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun_py.backends.slurm import SlurmSession
from poprun_py.errors import PreflightError
from poprun_py.prepare.job import LaunchOptions, prepare

SPEC = """name: s
topologies:
  t:
    numa_nodes: [{id: 0, cpus: "0-1"}]
hosts: [{name: "n[1-2]", topology: t}]
"""
# each node's task: its name, then the check script's answers (workdir there, program missing)
ANSWER = (
    'for r in 0 1; do printf "$r: host n$((r + 1))\\n$r: cmd 0 0\\n"; done; echo ran > "$D/ran"'
)


def test_the_step_runs_and_names_a_missing_program_with_topologies_declared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"srun": ANSWER, "scontrol": "", "squeue": "", "scancel": ""}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("D", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC)
    opts = LaunchOptions(cluster=str(spec), backend="slurm", program=("no-such-program-q7",))
    prep = prepare(opts)
    session = SlurmSession(prep)
    try:
        with pytest.raises(PreflightError) as caught:
            session.preflight(prep)
    finally:
        session.close()
    assert (tmp_path / "ran").exists()
    assert [(f.host, f.check, f.detail) for f in caught.value.faults] == [
        (node, "program", "no-such-program-q7: not found on PATH") for node in ("n1", "n2")
    ]
