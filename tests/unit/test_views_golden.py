"""Golden text of what a person reads when the output is piped (80 columns): the plan with its
topology one host a line, a plan of 2,048 hosts, the failure summary and preflight's faults.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_views_golden.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.result import InstanceResult, InstanceState, LaunchResult
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.core.views import plan_lines
from poprun_py.errors import Fault
from poprun_py.launch.summary import fault_lines, summary_lines
from poprun_py.prepare.job import LaunchOptions, prepare

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = ROOT / "tests" / "golden" / "views"
WIDTH = 80


def pod16_text() -> str:
    options = LaunchOptions(cluster=str(ROOT / "clusters/pod16.yaml"), program=("python3", "t"))
    return "\n".join(plan_lines(prepare(options, environ={}).plan, WIDTH)) + "\n"


def hosts2048_text() -> str:
    cluster = cluster_from_hosts(parse_hosts("node[0001-2048]"), topology=uniform(2, 32, 4))
    plan = make_plan(cluster, JobSpec(("python3", "t"), replicas=8192, instances=2048))
    return "\n".join(plan_lines(plan, WIDTH)) + "\n"


def summary_text() -> str:
    cuda = "RuntimeError: CUDA error: an illegal memory access was encountered; " * 2
    result = LaunchResult(
        (
            InstanceResult(0, "node01", exit_code=143, state=InstanceState.STOPPED),
            InstanceResult(1, "node01", exit_code=3, ended=1.0),
            InstanceResult(2, "node02", state=InstanceState.LOST, detail="no report", ended=2.0),
            InstanceResult(3, "node02", exit_code=1, ended=3.0),
            InstanceResult(4, "node03", exit_code=0, ended=0.5),
        )
    )
    tail = {0: "stopping", 1: "boom", 3: cuda, 4: "done"}
    return "\n".join(summary_lines(result, tail, WIDTH)) + "\n"


def faults_text() -> str:
    has = ", ".join(f"10.0.{k}.1/16" for k in range(6))
    faults = [
        Fault("node01", "program", "train.py: not found on PATH"),
        Fault("node02", "network", f"no address in 198.18.1.0/24 (has: {has})"),
        Fault("node03", "ssh", "TransportError: node03: connection refused (port 22)"),
    ]
    return "\n".join(fault_lines(faults, WIDTH)) + "\n"


CASES = {
    "plan-pod16.txt": pod16_text,
    "plan-hosts2048.txt": hosts2048_text,
    "summary-failed.txt": summary_text,
    "faults.txt": faults_text,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_piped_output_matches_its_golden_text(name: str) -> None:
    text = CASES[name]()
    path = GOLDEN_DIR / name
    before = path.read_text() if path.exists() else None
    if os.environ.get("UPDATE_GOLDEN") == "1":
        assert os.environ.get("CI", "").lower() not in ("true", "1"), "UPDATE_GOLDEN under CI"
        path.write_text(text)
    assert before is not None, f"{path} missing: run with UPDATE_GOLDEN=1"
    changed = "".join(
        difflib.unified_diff(before.splitlines(True), text.splitlines(True), "golden", "now")
    )
    assert text == before, f"{name} differs: review, then UPDATE_GOLDEN=1\n{changed}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_golden_line_is_wider_than_80_columns(name: str) -> None:
    lines = (GOLDEN_DIR / name).read_text().splitlines()
    assert lines and max(len(line) for line in lines) <= WIDTH


def test_plan_piped_prints_its_golden_text(capsys: pytest.CaptureFixture[str]) -> None:
    from poprun_py.cli import run

    assert run(["plan", "-c", str(ROOT / "clusters/pod16.yaml"), "python3", "t"]) == 0
    assert capsys.readouterr().out == (GOLDEN_DIR / "plan-pod16.txt").read_text()


def test_plan_of_2048_hosts_piped_is_never_wider_than_80(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from poprun_py.cli import run

    assert run(["plan", "-H", "node[0001-2048]", "-r", "8192", "python3", "t"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert "… 1,984 more hosts (--format json)" in lines
