"""Golden files: the rendered commands (``format_job`` text) of three example plans for every
backend, pinned in ``tests/golden/<cluster>-<backend>.txt``.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.shard import InputSet
from poprun_py.core.spec import ClusterSpec, EnvVar, HostSpec, JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.render.display import format_job
from poprun_py.render.job import RenderedJob, render_job

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
JOB_DIR = "/tmp/poprun-job"
SECRET = "golden-secret-value"
BACKENDS = ("local", "ssh", "mpirun", "mpiexec", "slurm")


def sim2() -> LaunchPlan:
    """Two simulated hosts of one NUMA node with two CPUs; two instances each."""
    cluster = cluster_from_hosts(
        parse_hosts("sim1,sim2"), name="sim2", simulated=True, topology=uniform(1, 2)
    )
    job = JobSpec(("python", "train.py", "--epochs", "1"), replicas=4, instances=4)
    return make_plan(cluster, job)


def h4() -> LaunchPlan:
    """Four static hosts by address, topology unknown; user variables and a secret."""
    hosts = tuple(HostSpec(f"h{i}", address=f"198.18.0.{10 + i}") for i in range(1, 5))
    env = (
        EnvVar("LR", "0.1"),
        EnvVar("MSG", "hello world; $(not run) 'quoted'"),
        EnvVar("TOKEN", SECRET, secret=True),
    )
    job = JobSpec(
        ("python3", "train.py", "--config", "my config.yaml"),
        replicas=8,
        instances=8,
        env=env,
        workdir="/srv/train",
    )
    return make_plan(ClusterSpec("h4", hosts), job)


def node16() -> LaunchPlan:
    """16 two-socket hosts: 8 NUMA nodes x 16 CPUs, 16 devices (2 a node); 64 replicas of 4
    devices, 4 instances a host (2 NUMA nodes each), 128 input files."""
    cluster = cluster_from_hosts(
        parse_hosts("node[01-16]"), name="node16", topology=uniform(8, 16, 2)
    )
    inputs = InputSet(
        tuple(f"/data/imagenet/train-{i:05d}-of-00128" for i in range(128)),
        tuple(100_000_000 + 37 * i for i in range(128)),
    )
    job = JobSpec(
        ("python", "resnet.py", "--batch-size", "256"),
        replicas=64,
        instances=64,
        devices_per_replica=4,
        env=(EnvVar("OMP_NUM_THREADS", "16"),),
    )
    return make_plan(cluster, job, inputs)


def slots2() -> LaunchPlan:
    """Two hosts by address with slots 3 and 1 (a hostfile's), two NUMA nodes of 4 CPUs each:
    3 instances on the first host, 1 on the second, 2 replicas each."""
    hosts = (
        HostSpec("s1", address="198.18.0.21", slots=3),
        HostSpec("s2", address="198.18.0.22", slots=1),
    )
    cluster = ClusterSpec("slots2", tuple(replace(h, topology=uniform(2, 4)) for h in hosts))
    return make_plan(cluster, JobSpec(("python", "train.py"), replicas=8))


PLANS: dict[str, Callable[[], LaunchPlan]] = {
    "sim2": sim2,
    "h4": h4,
    "node16": node16,
    "slots2": slots2,
}
OPTIONS: dict[str, dict[str, object]] = {
    "slots2": {"mpi_subnet": "198.18.0.16/28"},
    "sim2": {},
    "h4": {"as_root": True, "mpi_subnet": "198.18.0.0/24"},
    "node16": {"mpi_args": ("--mca", "pml", "ob1")},
}


CASES = [(c, b) for c in PLANS for b in BACKENDS]
CASES += [("sim2", "mpirun-appfile"), ("h4", "mpirun-appfile")]  # argv_limit=1: --app FILE


@pytest.mark.parametrize(("cluster", "case"), CASES)
def test_rendered_commands_match_the_golden_file(cluster: str, case: str) -> None:
    backend, _, appfile = case.partition("-")
    options = {**OPTIONS[cluster], **({"argv_limit": 1} if appfile else {})}
    job = render_job(PLANS[cluster](), backend, job_dir=JOB_DIR, **options)  # type: ignore[arg-type]
    assert ("appfile" in job.files) == bool(appfile)
    text = format_job(job)
    path = GOLDEN_DIR / f"{cluster}-{case}.txt"
    before = path.read_text() if path.exists() else None
    if os.environ.get("UPDATE_GOLDEN") == "1":
        # never under CI: a rewritten golden file would bless whatever the code renders now
        assert os.environ.get("CI", "").lower() not in ("true", "1"), "UPDATE_GOLDEN under CI"
        path.write_text(text)
        assert text == before, f"{path.name} rewritten, it was:\n" + diff(before, text)
    assert before is not None, f"{path} missing: run with UPDATE_GOLDEN=1"
    changed = diff(before, text)
    assert text == before, f"{path.name} differs: review, then UPDATE_GOLDEN=1\n{changed}"
    assert SECRET not in text
    assert_secret_only_by_name(job)


def diff(before: str | None, after: str) -> str:
    """What changed from the golden file (``before``) to the rendering, as a unified diff."""
    old = (before or "").splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, after.splitlines(keepends=True), "golden", "now"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argv_limit", [None, 1], ids=["argv", "appfile"])
def test_the_secret_reaches_an_environment_and_no_argv_nor_file(
    backend: str, argv_limit: int | None
) -> None:
    """Every backend, with and without an appfile: the secret's value is in no argv and no file,
    yet it still reaches the program through an environment (the instances' own, or the
    launcher's, passed on by name); the unmasked rendering shows it, the masked one does not."""
    options = {**OPTIONS["h4"], **({"argv_limit": argv_limit} if argv_limit else {})}
    job = render_job(h4(), backend, job_dir=JOB_DIR, **options)  # type: ignore[arg-type]
    assert_secret_only_by_name(job)
    assert "TOKEN" in job.secrets
    if job.launcher:  # mpirun, mpiexec, srun pass it on by name from their own environment
        assert job.launcher_env.get("TOKEN") == SECRET, "the launcher cannot pass the secret on"
    else:  # local, ssh: each instance's environment (ssh: over the agent's stdin)
        assert all(c.env.get("TOKEN") == SECRET for c in job.instances)
    assert SECRET in format_job(job, masked=False) and SECRET not in format_job(job)


def assert_secret_only_by_name(job: RenderedJob) -> None:
    """The secret's value is in no argv (the launcher's, an instance's) and no file, looked at
    unmasked: it goes through environments only, where ``ps`` and the logs do not show it."""
    assert all(SECRET not in a for cmd in job.instances for a in cmd.argv)
    assert all(SECRET not in a for a in job.launcher)
    assert all(SECRET not in text for text in job.files.values())


def test_the_secret_check_catches_a_secret_in_an_argv() -> None:
    job = render_job(sim2(), "ssh", job_dir=JOB_DIR)
    leaked = replace(job.instances[0], argv=(*job.instances[0].argv, SECRET))
    with pytest.raises(AssertionError):
        assert_secret_only_by_name(replace(job, instances=(leaked, *job.instances[1:])))


def test_every_golden_file_belongs_to_a_case() -> None:
    expected = {f"{cluster}-{case}.txt" for cluster, case in CASES}
    assert {p.name for p in GOLDEN_DIR.glob("*.txt")} == expected
