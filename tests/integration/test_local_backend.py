"""The local backend with real processes: start, output, logs, environment, binding, training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from poprun_py.backends.local import LocalBackend
from poprun_py.core.result import RunOptions
from poprun_py.core.shard import InputFile, InputSet
from poprun_py.core.topology import NumaNode, Topology, parse_sysfs_nodes
from poprun_py.errors import PreflightError
from poprun_py.hostside.binding import MPOL_DEFAULT, get_mempolicy
from tests.integration.helpers import (
    BINDING_PROBE,
    CPU1_TOPOLOGY,
    EXAMPLES,
    REPO,
    binding_case,
    example_inputs,
    left_behind,
    machine_nodes,
    make_job,
    plan_for,
    render,
    run_local,
    zombies,
)
from tests.ports import held_port

PY = sys.executable


def test_sixteen_instances_of_true_all_exit_zero(tmp_path: Path) -> None:
    result, lines = run_local(plan_for(["true"], "h[1-4]", instances=16), tmp_path)
    assert result.ok and result.exit_code == 0
    assert [r.index for r in result.instances] == list(range(16))
    assert {(r.state, r.exit_code) for r in result.instances} == {("exited", 0)}
    assert [r.host for r in result.instances[::4]] == ["h1", "h2", "h3", "h4"]
    assert lines == []
    assert zombies() == []


def test_default_sink_prefixes_every_line_with_host_and_index(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = "echo out $RANK; echo err $RANK >&2"
    plan = plan_for(["sh", "-c", script], "h1,h2", instances=4)
    result = LocalBackend().run(make_job(plan, tmp_path / "job"), RunOptions())
    out, err = capfd.readouterr()
    assert result.ok
    assert sorted(out.splitlines()) == [f"[h{i // 2 + 1}:{i}] out {i}" for i in range(4)]
    assert sorted(err.splitlines()) == [f"[h{i // 2 + 1}:{i}] err {i}" for i in range(4)]


def test_per_instance_logs_hold_unprefixed_output(tmp_path: Path) -> None:
    script = "echo first $RANK; echo second >&2; printf 'no newline'"
    plan = plan_for(["sh", "-c", script], "h1", instances=3)
    result, _ = run_local(plan, tmp_path, output_dir=tmp_path / "logs")
    assert result.ok
    for i in range(3):
        log = (tmp_path / "logs" / f"instance-{i}.log").read_bytes()
        assert log == f"first {i}\nsecond\nno newline\n".encode()


def test_only_output_from_shows_one_stdout_but_every_stderr(tmp_path: Path) -> None:
    plan = plan_for(["sh", "-c", "echo out $RANK; echo err $RANK >&2"], "h1", instances=3)
    result, lines = run_local(plan, tmp_path, only_output_from=1, output_dir=tmp_path / "logs")
    assert result.ok
    assert sorted(line for _, s, line in lines if s == "stdout") == ["out 1"]
    assert sorted(line for _, s, line in lines if s == "stderr") == ["err 0", "err 1", "err 2"]
    assert (tmp_path / "logs" / "instance-2.log").read_text().startswith("out 2\n")


def test_instances_see_their_layout_shard_and_workdir(tmp_path: Path) -> None:
    files = [InputFile(str(tmp_path / f"in{i}.npz"), 100 - i) for i in range(6)]
    code = (
        "import json, os; from poprun_py import dist; "
        "print(json.dumps([dist.getInstanceIndex(), dist.getNumInstances(), "
        "dist.getReplicaIndexOffset(), dist.host_index(), dist.shard_files(), os.getcwd(), "
        "oct(os.stat(os.environ['POPRUN_SHARD_FILE']).st_mode & 0o777)]))"
    )
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    plan = plan_for(
        [PY, "-c", code], "h1,h2", instances=4, inputs=InputSet.of(files), workdir=str(workdir)
    )
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO)
    try:
        result, lines = run_local(plan, tmp_path)
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.update(PYTHONPATH=old)
    assert result.ok, lines
    seen = {i: json.loads(line) for i, s, line in lines if s == "stdout"}
    for inst in plan.instances:
        index, count, offset, host, shard, cwd, mode = seen[inst.index]
        assert (index, count, offset, host) == (inst.index, 4, inst.replica_offset, inst.host_index)
        assert shard == list(inst.shard.files) and shard
        assert (cwd, mode) == (str(workdir), "0o600")


def allowed_topology() -> Topology:
    """This machine's NUMA nodes with only the CPUs this process may run on (its affinity:
    ``taskset -c 0`` leaves one), nodes left without any dropped: what poprun-py discovers
    here (core.topology.within), computed apart from it."""
    allowed = os.sched_getaffinity(0)
    nodes = [(i, tuple(c for c in cpus if c in allowed)) for i, cpus in machine_nodes().items()]
    return Topology(tuple(NumaNode(i, cpus) for i, cpus in sorted(nodes) if cpus))


def test_instances_run_on_the_cpus_the_plan_binds_them_to(tmp_path: Path) -> None:
    topology = allowed_topology()
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    plan = plan_for([PY, "-c", code], "localhost", instances=2, topology=topology)
    result, lines = run_local(plan, tmp_path, available={"localhost": topology})
    assert result.ok, lines
    allowed = {i: line for i, s, line in lines if s == "stdout"}
    first, second = plan.instances
    shared = sorted(set(first.cpus) & set(second.cpus))
    # two CPUs or more: each instance has its own, so each binding changes something; one CPU
    # (taskset -c 0): both have it
    assert shared == ([] if len(topology.cpus) > 1 else list(topology.cpus))
    assert first.cpus and second.cpus and set(first.cpus + second.cpus) <= set(topology.cpus)
    for inst in plan.instances:
        assert allowed[inst.index] == str(sorted(inst.cpus))


def test_binding_without_numactl_sets_cpus_and_memory_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = binding_case()  # instance 0: a CPU and a node it has; 1: a CPU and a node it lacks
    monkeypatch.setenv("PATH", f"{Path(PY).parent}:/bin")  # no numactl on PATH (nor needed)
    plan = plan_for([PY, "-c", BINDING_PROBE], "h1", instances=2, topology=case.topology)
    assert {c.argv[0] for c in make_job(plan, tmp_path / "rendered").instances} == {PY}
    before = os.sched_getaffinity(0)
    result, lines = run_local(plan, tmp_path, available={"h1": allowed_topology()})
    assert result.ok, lines
    seen = {i: json.loads(line) for i, s, line in lines if s == "stdout"}
    assert seen[0] == case.probe(0)  # its CPU; MPOL_BIND to its node
    assert seen[1] == case.probe(1)  # its CPU; the node this machine lacks: memory unbound
    assert os.sched_getaffinity(0) == before  # poprun-py's own binding is back
    assert get_mempolicy() == (MPOL_DEFAULT, ())


def test_a_binding_that_cannot_be_made_fails_its_instance_in_one_line(tmp_path: Path) -> None:
    cpu = max(os.cpu_count() or 1, 1) + 64  # no such CPU
    plan = plan_for(
        ["true"], "h1", instances=2, topology=parse_sysfs_nodes({"node0": f"{cpu}-{cpu + 1}"})
    )
    result, _ = run_local(plan, tmp_path)
    first = result.instances[0]
    assert not result.ok and first.exit_code == 126
    assert first.detail == f"cannot start 'true': cannot bind to CPUs {cpu}: Invalid argument"
    assert zombies() == []


def test_missing_numactl_a_template_asks_for_is_a_preflight_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "instance.j2").write_text("{{ (inst.numactl + program) | quoted }}\n")
    plan = plan_for(["true"], "h1", instances=2, topology=CPU1_TOPOLOGY)
    job = render.render_job(plan, "local", job_dir=str(tmp_path / "job"), templates_dir=templates)
    assert [c.argv[0] for c in job.instances] == ["numactl", "numactl"]
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        PreflightError, match=r"^preflight failed on localhost: numactl: numactl not found"
    ) as caught:
        LocalBackend().run(job, RunOptions())
    assert caught.value.exit_code == 3 and "\n" not in str(caught.value)
    assert not (tmp_path / "job").exists()  # nothing started, not even the job files


@pytest.mark.requires("pgrep")
def test_missing_program_fails_its_instance_with_127(tmp_path: Path) -> None:
    marker = f"{30 + uuid.uuid4().int % 1000 / 997:.6f}"
    script = f'if [ "$RANK" = 1 ]; then exec /nonexistent/prog; fi; exec sleep {marker}'
    plan = plan_for(["sh", "-c", script], "h1", instances=2)
    result, _ = run_local(plan, tmp_path, grace_period=2)
    assert result.exit_code == 127 and result.root_cause is not None
    assert result.root_cause.index == 1
    assert left_behind(f"sleep {marker}") == []


def test_unstartable_program_is_reported_not_raised(tmp_path: Path) -> None:
    plan = plan_for([str(tmp_path / "no such program")], "h1", instances=2)
    result, _ = run_local(plan, tmp_path)
    assert result.exit_code == 127
    assert [r.index for r in result.failures] == [0]
    assert "cannot start" in result.instances[0].detail
    assert result.instances[1].state == "not-started"


def test_example_training_loss_falls_and_instances_agree(tmp_path: Path) -> None:
    inputs = example_inputs(tmp_path / "data")
    program = [PY, str(EXAMPLES / "train.py"), "--steps", "20", "--timeout", "20"]
    with held_port() as port:  # until rank 0 binds it (tests/ports.py)
        plan = plan_for(program, "h1,h2", instances=4, inputs=inputs, master_port=port)
        result, lines = run_local(plan, tmp_path)
    assert result.ok, lines
    losses: dict[int, list[float]] = {}
    for index, stream, line in lines:
        if stream == "stdout" and line.startswith("step "):
            losses.setdefault(index, []).append(float(line.split()[-1]))
    assert sorted(losses) == [0, 1, 2, 3]
    assert all(v == losses[0] for v in losses.values()), "every instance has the same loss"
    assert losses[0][-1] < losses[0][0] * 0.8


def test_example_training_fails_cleanly_when_a_peer_never_comes(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
    }
    env.pop("OMPI_COMM_WORLD_SIZE", None)
    program = [PY, str(EXAMPLES / "train.py"), "--timeout", "0.5", "--data", str(tmp_path)]
    with held_port() as port:  # nothing listens on it, and nothing else may meanwhile
        env["MASTER_PORT"] = str(port)
        done = subprocess.run(
            program, env=env, capture_output=True, text=True, timeout=60, check=False
        )
    assert done.returncode == 1
    assert done.stderr.startswith("train.py: error: rank 1: cannot reach rank 0 at 127.0.0.1:")
    assert len(done.stderr.splitlines()) == 1
