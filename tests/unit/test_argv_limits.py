"""Argument-list limits at scale: at 4,096 hosts (16,384 instances), no process poprun-py would
start for any backend has an argument longer than Linux's MAX_ARG_STRLEN (128 KiB) or an
argv plus environment larger than ARG_MAX (``os.sysconf("SC_ARG_MAX")``, counting the pointers
as execve(2) does). Host lists and per-instance items go through the job's files.

The backends are taken from the registry: every registered backend is checked (its launcher,
the launcher's environment, every instance's argv and environment), and a backend must name the
other processes it starts in :data:`PROCESSES`, so that a new one without coverage fails.

Real runs: ``mpirun`` (Open MPI) and ``mpiexec.hydra`` (MPICH) run a job on this machine whose
app contexts would not fit on a command line, from the job files.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path

import pytest

from poprun_py.backends.mpiexec import mpiexec_args
from poprun_py.backends.slurm_alloc import (
    SlurmRequest,
    batch_script,
    fold_hosts,
    nodelist,
    salloc_argv,
    unstage_argv,
)
from poprun_py.core.backends import REGISTRY
from poprun_py.core.hosts import expand_names, parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts
from poprun_py.core.topology import uniform
from poprun_py.errors import RenderError
from poprun_py.hostside.bundle import over_stdin
from poprun_py.hostside.rsh_shim import mpirun_args
from poprun_py.render.job import ARGV_LIMIT, RenderedJob, render_job
from poprun_py.ssh.commands import remote_command
from poprun_py.ssh.openssh import ssh_argv
from poprun_py.ssh.settings import SshSettings

ARG_MAX = os.sysconf("SC_ARG_MAX")
MAX_ARG_STRLEN = 128 * 1024
HOSTS = "node[0001-4096].cluster.example.org"
PER_HOST = 4
JOB_DIR = "/tmp/poprun-job"
Process = tuple[str, Sequence[str], Mapping[str, str]]  # what, argv, environment


def exec_bytes(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """What execve(2) counts against ARG_MAX: the strings with their NULs, and a pointer each."""
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(s.encode()) + 1 for s in strings) + 8 * (len(strings) + 2)


def assert_fits(what: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    longest = max(len(s.encode()) + 1 for s in strings)
    assert longest <= MAX_ARG_STRLEN, f"{what}: one string of {longest} bytes"
    total = exec_bytes(argv, env)
    assert total <= ARG_MAX, f"{what}: argv and environment of {total} bytes"


@cache
def big_plan() -> LaunchPlan:
    cluster = cluster_from_hosts(parse_hosts(HOSTS), topology=uniform(2, 8, 2))
    count = 4096 * PER_HOST
    env = (EnvVar("LR", "0.1"), EnvVar("TOKEN", "s3cret", secret=True))
    job = JobSpec(("python", "train.py"), replicas=count, instances=count, env=env)
    return make_plan(cluster, job)


@cache
def rendered(backend: str) -> RenderedJob:
    """The big plan rendered for ``backend``, with the options its launch adds (the daemons'
    start through the agents)."""
    args: tuple[str, ...] = ()
    if backend == "mpirun":
        args = mpirun_args(())
    elif backend == "mpiexec":
        args = mpiexec_args((), local_address="198.18.0.1")
    return render_job(big_plan(), backend, job_dir=JOB_DIR, mpi_args=args)


def common(job: RenderedJob) -> Iterator[Process]:
    """The launcher, and every instance (started by a backend, an agent or a launcher)."""
    if job.launcher:
        yield "the launcher", job.launcher, {**os.environ, **job.launcher_env}
    for cmd in job.instances:
        yield f"instance {cmd.index}", cmd.argv, {**os.environ, **cmd.env}


def ssh_processes(job: RenderedJob) -> Iterator[Process]:
    """One OpenSSH client per host (the agent's), its command line without any list."""
    command = remote_command(over_stdin(), {"X": "1"}, None)
    for host in job.plan.hosts:
        yield f"ssh to {host.name}", ssh_argv(host.spec, SshSettings(), command), os.environ


def slurm_processes(job: RenderedJob) -> Iterator[Process]:
    """salloc (asking for the very nodes), the clean-up step, the batch script's command."""
    names = tuple(h.name for h in job.plan.hosts)
    request = SlurmRequest(len(names), tasks=len(job.instances), nodelist=names)
    yield "salloc", salloc_argv(request), os.environ
    unstage = unstage_argv(job.launcher, [c.host for c in job.instances])
    assert unstage is not None
    yield "the unstage step", unstage, os.environ
    script = batch_script(request, ["poprun-py", "launch", "--backend", "slurm"])
    exec_line = script.rstrip().rsplit("\n", 1)[-1]
    yield "the batch script's command", shlex.split(exec_line)[1:], os.environ


def k8s_processes(job: RenderedJob) -> Iterator[Process]:
    """Every pod's ``poprun-py launch --per-node --hosts EXPRESSION ...`` (one range)."""
    from poprun_py.render import k8s

    count = len(job.plan.hosts)
    argv = k8s.pod_command("poprun-train", "jobset", count, ["--", *job.plan.program])
    env = dict(k8s.pod_env("poprun-train", "jobset", count))
    yield "a pod's command", argv, {**os.environ, **env}


def launcher_only(job: RenderedJob) -> Iterator[Process]:
    """The shim Open MPI and hydra run (``rsh_shim``) gets their daemon's command line: not
    built by poprun-py; its own options are in the launcher's argv, checked already."""
    return iter(())


PROCESSES: dict[str, Callable[[RenderedJob], Iterator[Process]]] = {
    "local": launcher_only,
    "ssh": ssh_processes,
    "mpirun": launcher_only,
    "mpiexec": launcher_only,
    "slurm": slurm_processes,
    "k8s": k8s_processes,
}
"""Backend -> the processes it starts besides its launcher and its instances."""


def test_every_registered_backend_names_its_processes() -> None:
    missing = sorted(set(REGISTRY) - set(PROCESSES))
    assert not missing, f"add the processes of {missing} to PROCESSES (argv limits at scale)"


@pytest.mark.parametrize("backend", list(REGISTRY))
def test_no_process_passes_the_argv_limits_at_4096_hosts(backend: str) -> None:
    job = rendered(backend)
    assert len(job.plan.hosts) == 4096 and len(job.instances) == 4096 * PER_HOST
    extra = PROCESSES.get(backend, launcher_only)
    for what, argv, env in [*common(job), *extra(job)]:
        assert_fits(f"{backend}: {what}", argv, env)
    if job.launcher:  # a launcher's command line does not grow with hosts or instances
        assert exec_bytes(job.launcher, job.launcher_env) < 4096, job.launcher
        assert not any("node4096" in a for a in job.launcher), "a host list in argv"


@pytest.mark.parametrize("backend", ["mpirun", "mpiexec"])
def test_mpi_launchers_read_hosts_and_contexts_from_files_at_scale(backend: str) -> None:
    job = rendered(backend)
    tail = {
        "mpirun": ("--app", f"{JOB_DIR}/appfile"),
        "mpiexec": ("/bin/sh", "-c", f". {JOB_DIR}/rank", "poprun-rank"),  # RANK_WRAPPER's $0
    }[backend]
    assert job.launcher[-len(tail) :] == tail
    assert len(job.files["appfile"].splitlines()) == len(job.instances)
    assert len(job.files["hostfile"].splitlines()) == 4096


def test_mpiexec_small_job_stays_on_the_command_line() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1,h2")), JobSpec(("p",), replicas=2))
    job = render_job(plan, "mpiexec", job_dir=JOB_DIR)
    assert "rank" not in job.launcher[-1] and job.files.keys() == {"hostfile"}
    assert sum(len(a) + 1 for a in job.launcher) < ARGV_LIMIT


def test_slurm_node_lists_fold_when_long_and_expand_back() -> None:
    names = expand_names("nid[000001-004096]")
    assert nodelist(names[:3]) == ",".join(names[:3])  # small: as before
    folded = nodelist([*reversed(names), "login1", "login1"])
    assert folded == "nid[000001-004096],login1"
    assert expand_names(folded) == [*names, "login1"]
    mixed = [f"r{i}n{j:03d}" for i in (1, 2) for j in (1, 2, 3, 7)] + ["gpu1-ib", "gpu2-ib"]
    assert fold_hosts(mixed) == "r1n[001-003,007],r2n[001-003,007],gpu1-ib,gpu2-ib"
    assert sorted(expand_names(fold_hosts(mixed))) == sorted(mixed)


@pytest.mark.requires("srun")  # slurm-client: scontrol too
def test_slurm_itself_expands_the_folded_lists(tmp_path: Path) -> None:
    """Slurm's own parser (``scontrol show hostnames``) reads the folded lists back."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\n")
    names = [f"n{i:02d}" for i in (1, 2, 3, 5, 10)] + ["n9", "login", "gpu1-ib", "nid0007"]
    argv = ["scontrol", "show", "hostnames", fold_hosts(names)]
    env = {**os.environ, "SLURM_CONF": str(conf)}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == names


# ------------------------------------------------------------------ real launchers


def sim_plan(hosts: int, env: tuple[EnvVar, ...], program: Sequence[str]) -> LaunchPlan:
    """``hosts`` simulated hosts (all this machine), four instances each."""
    cluster = cluster_from_hosts(parse_hosts(f"sim[1-{hosts}]"), simulated=True)
    count = 4 * hosts
    return make_plan(cluster, JobSpec(tuple(program), replicas=count, instances=count, env=env))


REPORT = 'env > "$REPORT_DIR/rank-$RANK"; printf "%s\\n" "$@" >> "$REPORT_DIR/rank-$RANK"'


def run_real(job: RenderedJob, job_dir: Path) -> None:
    """Write the job's files, run its launcher to the end."""
    for name, text in job.files.items():
        (job_dir / name).write_text(text)
    out = subprocess.run(
        job.launcher,
        env={**os.environ, **job.launcher_env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]


def check_reports(job: RenderedJob, job_dir: Path, args: Sequence[str]) -> None:
    for cmd in job.instances:
        lines = (job_dir / f"rank-{cmd.index}").read_text().splitlines()
        pairs = [line.split("=", 1) for line in lines[: -len(args)] if "=" in line]
        env = {name: value for name, value in pairs}
        assert {k: env.get(k) for k in cmd.env} == dict(cmd.env), cmd.index
        assert lines[-len(args) :] == list(args)


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpirun", "mpiexec"])
@pytest.mark.requires("mpirun", "mpiexec.hydra")
def test_real_launcher_runs_a_job_too_big_for_a_command_line(backend: str, tmp_path: Path) -> None:
    """40 hosts, 160 ranks whose contexts would make a command line of more than 1 MB (mpiexec:
    more than 2 MiB, past ARG_MAX, the form it always used until now); from the job files
    every rank gets its environment and argv. Open MPI reads at most 8 KiB an appfile line."""
    args = (uuid.uuid4().hex, "two words", "it's", "")
    size = {"mpirun": 6_000, "mpiexec": 14_000}[backend]
    env = (
        EnvVar("BIG", "x" * size),  # in each of the 160 contexts
        EnvVar("REPORT_DIR", str(tmp_path)),
        EnvVar("TOKEN", "s3cret", secret=True),
    )
    plan = sim_plan(40, env, ("/bin/sh", "-c", REPORT, "probe", *args))
    if backend == "mpiexec":
        with pytest.raises(RenderError, match="more than the OS accepts"):
            render_job(plan, backend, job_dir=str(tmp_path), argv_limit=10**9)  # inline
    root = backend == "mpirun" and os.geteuid() == 0
    job = render_job(plan, backend, job_dir=str(tmp_path), as_root=root)
    assert "appfile" in job.files and exec_bytes(job.launcher, job.launcher_env) < 4096
    run_real(job, tmp_path)
    check_reports(job, tmp_path, args)


def test_an_appfile_line_open_mpi_would_cut_is_a_render_error() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("p", "x" * 9_000)))
    with pytest.raises(RenderError, match="too long for Open MPI's appfile"):
        render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=1)
    assert "appfile" in render_job(plan, "mpiexec", job_dir=JOB_DIR, argv_limit=1).files


WAIT_FOR_SIGNAL = (
    "trap 'echo got > \"$REPORT_DIR/sig-$RANK\"; exit 0' USR1; "
    'echo up > "$REPORT_DIR/up-$RANK"; while :; do sleep 0.05; done'
)


@pytest.mark.mpi
@pytest.mark.requires("mpiexec.hydra")
def test_big_mpiexec_form_keeps_its_rank_wrappers_signalled(tmp_path: Path) -> None:
    """The file form's wrappers are found and signalled past hydra as the inline form's are
    (a stack dump's SIGUSR1): each rank gets it, and ends."""
    from poprun_py.hostside.stackdump import signal_ranks

    env = (EnvVar("REPORT_DIR", str(tmp_path)),)
    plan = sim_plan(1, env, ("/bin/sh", "-c", WAIT_FOR_SIGNAL))
    job = render_job(plan, "mpiexec", job_dir=str(tmp_path), argv_limit=1)
    assert "appfile" in job.files
    for name, text in job.files.items():
        (tmp_path / name).write_text(text)
    launcher_env = {**os.environ, **job.launcher_env}
    with subprocess.Popen(job.launcher, env=launcher_env, stdin=subprocess.DEVNULL) as hydra:
        try:
            deadline = time.monotonic() + 60
            while len(list(tmp_path.glob("up-*"))) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(list(tmp_path.glob("up-*"))) == 4, "the ranks did not start"
            signalled = 0
            while signalled < 4 and time.monotonic() < deadline:
                signalled += signal_ranks([hydra.pid], signal.SIGUSR1, wait=0)
                time.sleep(0.05)
            assert hydra.wait(timeout=60) == 0
        finally:
            hydra.kill()
    assert sorted(p.name for p in tmp_path.glob("sig-*")) == [f"sig-{i}" for i in range(4)]
