"""Spare hosts on the slurm backend, on the test Slurm: the allocation holds the spare, the
step runs on the planned nodes only, and when a node fails mid-run (``scontrol update
State=DOWN``) the restart runs on the spare in its place, inside the same allocation (one the
user made with ``--no-kill``). Nothing is left in Slurm's queue afterwards, and the failed node
is resumed."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.test_long_run_hosts import started, stopped_at_the_end
from tests.integration.test_slurm_cli import squeue_empty
from tests.slurmcluster import SlurmCluster, SlurmNode

pytestmark = pytest.mark.hosts

TELL = (
    'echo "try $POPRUN_RESTART_COUNT on $(hostname) job $SLURM_JOB_ID";'
    ' [ "$POPRUN_RESTART_COUNT" = 0 ] && exec sleep 60; exit 0'
)
"""Says where it runs; sleeps on the first attempt (a node fails meanwhile), then ends."""


def node_state(env: Mapping[str, str], node: str) -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


@contextmanager
def failing(env: Mapping[str, str], node: str) -> Iterator[None]:
    """``yield``; then ``node`` back in service (idle) however the test went."""
    try:
        yield
    finally:
        deadline = time.monotonic() + 30
        while node_state(env, node).rstrip("*") != "idle" and time.monotonic() < deadline:
            update = ["scontrol", "update", f"NodeName={node}", "State=RESUME"]
            subprocess.run(update, env=dict(env), capture_output=True, check=False)
            time.sleep(0.2)
        assert node_state(env, node).rstrip("*") == "idle"


def run_losing_a_node(
    cluster: SlurmCluster, env: dict[str, str], tmp_path: Path, *more: str
) -> tuple[int, str, str]:
    a, b, spare = cluster.node_names[:3]
    args = ["launch", "--backend", "slurm", "--hosts", f"{a},{b}", "--spare-hosts", spare, *more]
    args += ["-r", "2", "-n", "2", "--time", "5", "--max-restarts", "1", "--", "sh", "-c", TELL]
    with failing(env, b), stopped_at_the_end(started(args, tmp_path, env=env)) as run:
        run.wait_for(r"\] try 0 on ", 2)
        down = ["scontrol", "update", f"NodeName={b}", "State=DOWN", "Reason=poprun-test"]
        subprocess.run(down, env=env, check=True)
        return run.finish()


def attempts(out: str) -> dict[int, set[tuple[str, str]]]:
    """attempt -> {(node, job id)} its tasks ran on."""
    found: dict[int, set[tuple[str, str]]] = {}
    for k, node, job in re.findall(r"\] try (\d) on (\S+) job (\d+)$", out, re.M):
        found.setdefault(int(k), set()).add((node, job))
    return found


def test_a_failed_node_is_replaced_by_the_spare_inside_the_user_s_allocation(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    a, b, spare = slurm_cluster.node_names[:3]
    salloc = ["salloc", "--no-shell", "-N3", "--no-kill", "--exclusive", "--time=5"]
    granted = subprocess.run(salloc, env=slurm_env, capture_output=True, text=True, check=True)
    job = re.findall(r"\d+", granted.stderr + granted.stdout)[0]
    env = {**slurm_env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": f"{a},{b},{spare}"}
    try:
        code, out, err = run_losing_a_node(slurm_cluster, env, tmp_path)
    finally:
        subprocess.run(["scancel", job], env=slurm_env, check=False)
    assert code == 0, err
    assert attempts(out) == {0: {(a, job), (b, job)}, 1: {(a, job), (spare, job)}}, out
    assert f"spare host {spare} takes the place of lost host {b}" in err
    assert f"attempt 0 failed: {node_failed(b)}; restarting" in err, err  # not a killed task
    assert f"attempt 1: ok ({spare} in place of {b})" in err
    assert squeue_empty(slurm_env)


def test_a_failed_node_is_replaced_by_the_spare_when_poprun_py_allocates(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """poprun-py's own allocation (salloc, released at the end) holds the spare; the restart
    runs on it (in a new allocation: the first is released when the session closes)."""
    a, b, spare = slurm_cluster.node_names[:3]
    code, out, err = run_losing_a_node(slurm_cluster, slurm_env, tmp_path)
    assert code == 0, err
    ran = attempts(out)
    assert {node for node, _ in ran[0]} == {a, b} and {node for node, _ in ran[1]} == {a, spare}
    assert f"spare host {spare} takes the place of lost host {b}" in err
    assert f"attempt 0 failed: {node_failed(b)}; restarting" in err, err
    assert squeue_empty(slurm_env)


def node_failed(node: str) -> str:
    """The root cause the summary gives when ``node`` failed (instance 1 ran there)."""
    return (
        f"instance 1 on {node} lost contact with host {node} (its node failed (srun: Node failure))"
    )


@contextmanager
def unreachable(node: SlurmNode, address: str) -> Iterator[None]:
    """``node`` cannot reach ``address`` (a route refusing it in its namespace) meanwhile."""
    route = ["ip", "netns", "exec", node.netns, "ip", "route"]
    subprocess.run([*route, "add", "prohibit", f"{address}/32"], check=True)
    try:
        yield
    finally:
        subprocess.run([*route, "del", "prohibit", f"{address}/32"], check=True)


def test_a_spare_that_fails_the_check_does_not_replace_a_failed_node(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """With --check the spare passes the check (a step on it, inside the allocation) before it
    takes a failed node's place: a spare that cannot reach MASTER_ADDR is not used, and with no
    spare left the failed node is tried again (it fails: the job ends with one line, and the
    attempt's code)."""
    a, b, spare = slurm_cluster.node_names[:3]
    node_a, node_spare = slurm_cluster.nodes[0], slurm_cluster.nodes[2]
    salloc = ["salloc", "--no-shell", "-N3", "--no-kill", "--exclusive", "--time=5"]
    granted = subprocess.run(salloc, env=slurm_env, capture_output=True, text=True, check=True)
    job = re.findall(r"\d+", granted.stderr + granted.stdout)[0]
    env = {**slurm_env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": f"{a},{b},{spare}"}
    env["COLUMNS"] = "200"  # the summary's table on one line a row
    check = ("--check", "--check-timeout", "3", "-o", str(tmp_path / "logs"))  # kept there
    try:
        with unreachable(node_spare, node_a.address):  # MASTER_ADDR is a's
            code, out, err = run_losing_a_node(slurm_cluster, env, tmp_path, *check)
    finally:
        subprocess.run(["scancel", job], env=slurm_env, check=False)
    assert "check: 2/2 host(s) ok" in err  # before the launch: the spare is not in the plan
    assert f"attempt 0 failed: {node_failed(b)}; restarting" in err, err
    assert re.search(rf"restart: spare host {spare} failed the check \(instance 1", err), err
    assert f"spare host {spare} takes the place" not in err
    if f"{a}: task 0: Killed" in err:  # Slurm killed the task on the node that did not fail
        assert re.search(rf"0 +{a} +stopped +137 +step ended after node {b} failed", err), err
    assert code != 0 and 1 not in attempts(out), out  # no attempt ran on the spare
    assert squeue_empty(slurm_env)
