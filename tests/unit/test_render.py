"""Tests for poprun_py.render.job: argv lists, per-instance environments, bindings, launchers.

Launcher argv lists are parsed back the way each launcher reads them (Open MPI's command line,
its appfile, hydra's command line) and compared with what every instance must get. The tests
marked ``mpi`` run the rendered mpirun for real; ``hosts`` ones across real test hosts.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from poprun_py.core import env as instance_env
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import ClusterSpec, EnvVar, HostSpec, JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology, uniform
from poprun_py.errors import RenderError, UnknownNameError
from poprun_py.providers.netns import TestCluster
from poprun_py.render.binding import Binding
from poprun_py.render.display import format_job, job_dict
from poprun_py.render.environment import LAUNCHER_TEMPLATES, list_templates, render_template
from poprun_py.render.job import (
    ARGV_LIMIT,
    EXEC_ARGV,
    EXEC_VAR,
    InstanceCommand,
    RenderedJob,
    render_job,
)

JOB_DIR = "/tmp/poprun-job"
SECRET = "hunter2-very-secret"
ECHO = (sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))")

NASTY = [
    "plain",
    "two words",
    "  leading and trailing  ",
    "it's",
    'say "hi"',
    "$(touch /tmp/poprun-pwned)",
    "`id`",
    "a;b && c || d",
    "line1\nline2",
    "tab\there",
    "cr\rhere",
    "naïve ünïcødé ✓ 日本",
    "#not-a-comment",
    "x#y",
    ":",
    "",
    "back\\slash\\",
    "*?[glob]",
    "~root",
    "-x",
    "--",
    "=",
    "a=b c",
    "{{ not_jinja }} {% raw %}",
    "$HOME ${IFS} $@",
    "'\"'\"'",
]


def plan_of(
    hosts: str = "h1,h2",
    program: Sequence[str] = ("python", "train.py"),
    *,
    instances: int = 4,
    topology: Topology | None = None,
    env: Sequence[EnvVar] = (),
    workdir: str | None = None,
    numa_aware: bool = True,
    simulated: bool = False,
) -> LaunchPlan:
    cluster = cluster_from_hosts(parse_hosts(hosts), topology=topology, simulated=simulated)
    job = JobSpec(
        tuple(program),
        replicas=instances,
        instances=instances,
        env=tuple(env),
        workdir=workdir,
        numa_aware=numa_aware,
    )
    return make_plan(cluster, job)


def secret_env() -> tuple[EnvVar, ...]:
    return (EnvVar("TOKEN", SECRET, secret=True), EnvVar("MSG", "hello world"))


# ------------------------------------------------------------------ parsing launcher argv


def split_contexts(argv: Sequence[str], first: str) -> tuple[list[str], list[list[str]]]:
    """Global options, then the app contexts (split on ':'), each starting with ``first``."""
    start = list(argv).index(first)
    contexts: list[list[str]] = [[]]
    for arg in argv[start:]:
        if arg == ":":
            contexts.append([])
        else:
            contexts[-1].append(arg)
    return list(argv[:start]), contexts


@dataclass
class Rank:
    """What Open MPI gives one rank: its host, working directory, environment and argv."""

    host: str
    wdir: str | None
    env: dict[str, str]
    argv: list[str]


def parse_ompi_context(tokens: Sequence[str], launcher_env: Mapping[str, str]) -> Rank:
    """One app context as Open MPI reads it; ``-x NAME`` takes mpirun's own value."""
    assert tokens[:2] == ["-np", "1"], tokens
    i, options, env = 2, {}, {}
    while tokens[i] in ("-host", "-wdir", "-x"):
        flag, value = tokens[i], tokens[i + 1]
        if flag == "-x":
            name, sep, val = value.partition("=")
            env[name] = val if sep else launcher_env[name]
        else:
            options[flag] = value
        i += 2
    argv = list(tokens[i:])
    assert argv[0] == "/bin/sh" and argv[1].endswith("/rank"), argv  # the rank's wrapper
    return Rank(options["-host"], options.get("-wdir"), env, argv[2:])


def ompi_appfile_lines(text: str) -> list[list[str]]:
    """Open MPI's appfile reading (checked on 4.1.4): '#' starts a comment anywhere, words are
    split on whitespace, quotes are kept literally."""
    return [line.split("#", 1)[0].split() for line in text.splitlines() if line.strip()]


def ompi_ranks(job: RenderedJob) -> list[Rank]:
    if "appfile" in job.files:
        contexts = ompi_appfile_lines(job.files["appfile"])
    else:
        contexts = split_contexts(job.launcher, "-np")[1]
    return [parse_ompi_context(c, job.launcher_env) for c in contexts]


def numactl_of(cmd: InstanceCommand, job: RenderedJob | None = None) -> list[str]:
    """The numactl prefix mpirun.j2 puts before a bound rank's command (none when Open MPI
    binds the ranks itself, from a rankfile)."""
    bind = cmd.binding
    if bind is None or (job is not None and "rankfile" in job.files):
        return []
    return [
        "numactl",
        f"--physcpubind={bind.cpus}",
        *([f"--membind={bind.nodes}"] * bool(bind.nodes)),
    ]


def run_argv(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """Run an instance's argv (EXEC_ARGV evaluated by a real /bin/sh) and return its argv."""
    env = {**os.environ, **env}
    out = subprocess.run(
        list(argv), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0, out.stderr
    result: list[str] = json.loads(out.stdout)
    return result


# ------------------------------------------------------------------ instance commands


def test_instance_commands_carry_the_instance_environment_shard_and_cwd() -> None:
    plan = plan_of(env=secret_env(), workdir="/work dir")
    job = render_job(plan, "local", job_dir=JOB_DIR + "/")
    assert job.job_dir == JOB_DIR and job.launcher == () and job.files == {}
    assert job.secrets == frozenset({"TOKEN"})
    for cmd, inst in zip(job.instances, plan.instances, strict=True):
        shard_file = f"{JOB_DIR}/shard-{inst.index}.txt"
        assert cmd.index == inst.index and cmd.host == inst.host
        assert cmd.shard_file == shard_file
        assert cmd.env == instance_env.instance_env(plan, inst, shard_file)
        assert cmd.shard_text == instance_env.shard_text(inst)
        assert cmd.cwd == "/work dir"
        assert cmd.argv == ("python", "train.py")


def test_numa_binding_is_data_beside_the_plain_program() -> None:
    plan = plan_of(topology=uniform(2, 4))
    job = render_job(plan, "local", job_dir=JOB_DIR)
    assert {c.argv for c in job.instances} == {("python", "train.py")}  # no numactl prefix
    assert job.instances[0].binding == Binding("0-3", "0", (0, 1, 2, 3), (0,))
    assert job.instances[1].binding == Binding("4-7", "1", (4, 5, 6, 7), (1,))
    assert "; bound to CPUs 4-7, memory on NUMA nodes 1" in format_job(job)
    assert job_dict(job)["instances"][1]["binding"] == {"cpus": [4, 5, 6, 7], "numa_nodes": [1]}


def test_a_template_can_still_bind_with_numactl(tmp_path: Path) -> None:
    (tmp_path / "instance.j2").write_text("{{ (inst.numactl + program) | quoted }}\n")
    plan = plan_of(topology=uniform(2, 4))
    job = render_job(plan, "local", job_dir=JOB_DIR, templates_dir=tmp_path)
    first = job.instances[0]
    assert first.argv == ("numactl", "--physcpubind=0-3", "--membind=0", "python", "train.py")
    assert first.binding is None  # numactl binds it; the backend does not bind it again
    mpirun = render_job(plan, "mpirun", job_dir=JOB_DIR, templates_dir=tmp_path)
    assert ompi_ranks(mpirun)[0].argv == list(first.argv)  # not prefixed twice


def test_a_binding_that_changes_nothing_is_not_made_and_the_plan_says_so() -> None:
    plan = plan_of(topology=uniform(1, 4))  # one NUMA node: each host's instances share it
    job = render_job(plan, "local", job_dir=JOB_DIR)
    assert [c.binding for c in job.instances][:2] == [
        Binding("0-1", "0", (0, 1), (0,)),
        Binding("2-3", "0", (2, 3), (0,)),
    ]
    whole = plan_of(topology=uniform(1, 4), instances=2)  # one instance a host: every CPU
    assert all(c.binding is None for c in render_job(whole, "local", job_dir=JOB_DIR).instances)
    assert any("binding would change nothing on h1, h2" in n for n in whole.notes)
    assert not any("change nothing" in n for n in plan.notes)


def test_no_binding_without_numa_awareness_or_topology() -> None:
    off = plan_of(topology=uniform(2, 4), numa_aware=False)
    unknown = plan_of(topology=None)
    for plan in (off, unknown):
        job = render_job(plan, "local", job_dir=JOB_DIR)
        assert {c.argv for c in job.instances} == {("python", "train.py")}


def test_available_topology_keeps_only_cpus_and_nodes_that_exist() -> None:
    plan = plan_of(topology=uniform(2, 4))  # instance 0: node 0, cpus 0-3; 1: node 1, cpus 4-7
    small = Topology((NumaNode(0, (0, 1)),))  # this machine: one node, two CPUs
    job = render_job(plan, "local", job_dir=JOB_DIR, available={"h1": small, "h2": None})
    h1_first, h1_second, h2_first = (job.instances[i].binding for i in (0, 1, 2))
    assert h1_first is None  # every CPU and node of that machine: binding changes nothing
    assert h1_second is None  # no CPU of node 1 exists: no binding at all
    assert h2_first == Binding("0-3", "0", (0, 1, 2, 3), (0,))  # None: as planned
    part = Topology((NumaNode(0, (0, 1, 4, 5)),))
    job = render_job(plan, "local", job_dir=JOB_DIR, available={"h1": part})
    assert job.instances[0].binding == Binding("0-1", "0", (0, 1), (0,))
    assert job.instances[1].binding == Binding("4-5", "", (4, 5), ())


def test_available_topology_without_the_node_drops_only_membind() -> None:
    plan = plan_of(topology=uniform(2, 4))
    other = Topology((NumaNode(5, (0, 1, 2, 3, 4, 5, 6, 7)),))
    job = render_job(plan, "local", job_dir=JOB_DIR, available={"h1": other})
    assert job.instances[1].binding == Binding("4-7", "", (4, 5, 6, 7), ())
    mpirun = render_job(plan, "mpirun", job_dir=JOB_DIR, available={"h1": other})
    assert "rank 1=h1 slot=4-7" in mpirun.files["rankfile"]
    assert "hwloc_base_mem_alloc_policy" not in mpirun.launcher  # node 1 does not exist there


# ------------------------------------------------------------------ mpirun


def test_mpirun_global_options_hostfile_and_one_context_per_instance() -> None:
    plan = plan_of(topology=uniform(2, 4), env=secret_env(), workdir="/w")
    job = render_job(
        plan,
        "mpirun",
        job_dir=JOB_DIR,
        as_root=True,
        mpi_subnet="198.18.0.0/24",
        mpi_args=("--mca", "pml", "ob1"),
    )
    globals_, contexts = split_contexts(job.launcher, "-np")
    assert globals_ == [
        "mpirun", "--tag-output", "--use-hwthread-cpus", "--mca", "rmaps_rank_file_physical", "1",
        "--rankfile", f"{JOB_DIR}/rankfile", "--mca", "hwloc_base_mem_alloc_policy", "local_only",
        "--allow-run-as-root",
        "--mca", "btl_tcp_if_include", "198.18.0.0/24",
        "--mca", "oob_tcp_if_include", "198.18.0.0/24",
        "--hostfile", f"{JOB_DIR}/hostfile", "--mca", "pml", "ob1",
    ]  # fmt: skip
    assert job.files["hostfile"] == "h1 slots=2\nh2 slots=2\n"
    unbound = render_job(plan_of(), "mpirun", job_dir=JOB_DIR)  # no topology: nothing bound
    assert split_contexts(unbound.launcher, "-np")[0] == [
        "mpirun", "--tag-output", "--bind-to", "none",
        "--hostfile", f"{JOB_DIR}/hostfile", "--map-by", "slot",
    ]  # fmt: skip
    assert unbound.files.keys() == {"hostfile", "rank"}  # rank: each rank's wrapper
    assert "poprun-py: rank exited with code $c" in unbound.files["rank"]
    assert len(contexts) == plan.num_instances


def test_mpirun_rank_k_runs_on_plan_host_k_over_instances_per_host() -> None:
    cluster = ClusterSpec(
        "c", tuple(HostSpec(f"h{i}", address=f"198.18.0.{10 + i}") for i in (1, 2, 3))
    )
    plan = make_plan(cluster, JobSpec(("p",), replicas=6, instances=6))
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    hostfile = "198.18.0.11 slots=2\n198.18.0.12 slots=2\n198.18.0.13 slots=2\n"
    assert job.files["hostfile"] == hostfile
    ranks = ompi_ranks(job)
    for k, rank in enumerate(ranks):
        host = plan.hosts[k // 2].spec
        assert rank.host == f"{host.address}:2"
        assert rank.env["POPDIST_INSTANCE_INDEX"] == str(k)


def test_mpirun_each_rank_gets_exactly_its_instance_environment_and_argv() -> None:
    plan = plan_of(topology=uniform(2, 4), env=secret_env(), workdir="/w")
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    for rank, cmd in zip(ompi_ranks(job), job.instances, strict=True):
        assert rank.env == dict(cmd.env)
        assert rank.argv == list(cmd.argv)  # Open MPI binds them (rankfile): no numactl
        assert rank.wdir == "/w"
    assert "--bind-to" not in job.launcher and "--map-by" not in job.launcher
    assert job.launcher[job.launcher.index("--rankfile") + 1] == f"{JOB_DIR}/rankfile"
    assert job.files["rankfile"].splitlines() == [
        f"rank {c.index}={plan.hosts[c.index // 2].spec.target} slot={c.binding.cpus}"
        for c in job.instances
        if c.binding is not None
    ]
    assert "hwloc_base_mem_alloc_policy" in job.launcher  # memory on the CPUs' own nodes


def test_mpirun_ranks_bind_through_numactl_when_some_are_unbound() -> None:
    hosts = (HostSpec("a", topology=uniform(2, 2)), HostSpec("b"))  # b: topology unknown
    plan = make_plan(ClusterSpec("mixed", hosts), JobSpec(("prog",), replicas=4, instances=4))
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    assert "rankfile" not in job.files and job.launcher[1:4] == (
        "--tag-output",
        "--bind-to",
        "none",
    )
    argvs = [r.argv for r in ompi_ranks(job)]
    assert argvs[0] == ["numactl", "--physcpubind=0-1", "--membind=0", "prog"]
    assert argvs[2:] == [["prog"], ["prog"]]


def test_mpirun_secret_passes_by_name_and_never_appears_in_argv_or_files() -> None:
    plan = plan_of(env=secret_env())
    for limit in (ARGV_LIMIT, 1):
        job = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=limit)
        assert job.launcher_env["TOKEN"] == SECRET
        assert "-x TOKEN " in shlex.join(job.launcher) + "".join(job.files.values())
        assert SECRET not in repr(job.launcher) + repr(job.files)
        assert ompi_ranks(job)[0].env["TOKEN"] == SECRET  # from mpirun's own environment
        assert SECRET not in format_job(job)
    assert SECRET in format_job(job, masked=False)


def test_mpirun_simulated_hosts_all_run_on_localhost() -> None:
    plan = plan_of("sim1,sim2", simulated=True)
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    assert job.files["hostfile"] == "localhost slots=4\n"
    assert {r.host for r in ompi_ranks(job)} == {"localhost:4"}


def test_mpirun_large_job_moves_contexts_into_an_appfile() -> None:
    plan = plan_of("node[1-64]", instances=512, topology=uniform(8, 16))
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    assert job.launcher[-2:] == ("--app", f"{JOB_DIR}/appfile")
    assert sum(len(a) + 1 for a in job.launcher) < 1024
    ranks = ompi_ranks(job)
    assert len(ranks) == 512
    for k, (rank, cmd) in enumerate(zip(ranks, job.instances, strict=True)):
        assert rank.host == f"node{k // 8 + 1}:8"
        assert rank.env == dict(cmd.env) and rank.argv == list(cmd.argv)
    assert len(job.files["rankfile"].splitlines()) == 512


def test_mpirun_small_job_stays_inline_near_the_limit() -> None:
    plan = plan_of("node[1-8]", instances=64)
    job = render_job(plan, "mpirun", job_dir=JOB_DIR)
    size = sum(len(a.encode()) + 1 for a in job.launcher)
    assert "appfile" not in job.files and size <= ARGV_LIMIT
    squeezed = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=size - 1)
    assert "appfile" in squeezed.files  # the estimate said inline; the real size said no


def test_a_large_secret_does_not_push_the_job_into_an_appfile() -> None:
    """A secret goes by name (``-x NAME``, its value in mpirun's environment): its size does
    not count towards the command line, as the check program's source (~18 KB) must not."""
    big = EnvVar("BIG", "x" * (ARGV_LIMIT // 4), secret=True)
    job = render_job(plan_of(env=(big,), instances=8), "mpirun", job_dir=JOB_DIR)
    assert "appfile" not in job.files
    assert job.launcher_env["BIG"] == big.value and big.value not in " ".join(job.launcher)


def test_appfile_passes_values_with_whitespace_by_name() -> None:
    plan = plan_of(env=(EnvVar("MSG", "hello world # not a comment"), EnvVar("LR", "0.1")))
    job = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=1)
    assert job.launcher_env == {"MSG": "hello world # not a comment"}
    assert "-x MSG -x LR=0.1 " in job.files["appfile"]
    assert all(r.env["MSG"] == "hello world # not a comment" for r in ompi_ranks(job))


def test_appfile_rejects_a_job_dir_it_cannot_carry() -> None:
    plan = plan_of()
    with pytest.raises(RenderError, match="POPRUN_SHARD_FILE differs between instances"):
        render_job(plan, "mpirun", job_dir="/tmp/my job", argv_limit=1)


def test_program_words_the_launcher_cannot_carry_run_through_poprun_exec() -> None:
    program = (*ECHO, "two words", ":", "x#y", "")
    plan = plan_of(program=program, topology=uniform(2, 4))
    for limit in (ARGV_LIMIT, 1):
        job = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=limit)
        exec_text = job.launcher_env[EXEC_VAR]
        for rank, cmd in zip(ompi_ranks(job), job.instances, strict=True):
            prefix = numactl_of(cmd, job) + list(cmd.argv[: -len(program)])
            assert rank.argv == prefix + list(EXEC_ARGV)
            assert rank.env[EXEC_VAR] == exec_text
            shell_argv = rank.argv[len(prefix) :]
            assert run_argv(shell_argv, {EXEC_VAR: exec_text}) == list(program[3:])


def test_mpirun_context_separator_in_program_args_is_never_inline() -> None:
    job = render_job(plan_of(program=("prog", ":", "b")), "mpirun", job_dir=JOB_DIR)
    assert job.launcher.count(":") == 3  # the separators between the 4 contexts only


# ------------------------------------------------------------------ mpiexec


def test_mpiexec_hostfile_and_per_context_environment() -> None:
    plan = plan_of(env=secret_env(), workdir="/w")
    job = render_job(plan, "mpiexec", job_dir=JOB_DIR)
    assert job.files == {"hostfile": "h1:2\nh2:2\n"}
    globals_, contexts = split_contexts(job.launcher, "-n")
    hydra = ["mpiexec.hydra", "-f", f"{JOB_DIR}/hostfile", "-prepend-pattern", "[%r]<poprun>:"]
    assert globals_ == hydra
    for tokens, cmd in zip(contexts, job.instances, strict=True):
        env, i = {}, 4
        assert tokens[:4] == ["-n", "1", "-wdir", "/w"]
        while tokens[i] == "-env":
            env[tokens[i + 1]], i = tokens[i + 2], i + 3
        assert tokens[i : i + 2] == ["-envlist", "TOKEN"]
        assert {**env, "TOKEN": job.launcher_env["TOKEN"]} == dict(cmd.env)
        assert tokens[i + 2 : i + 4] == ["/bin/sh", "-c"]  # reports a failing rank's code
        assert tokens[i + 5 :] == ["poprun-rank", *cmd.argv]


# ------------------------------------------------------------------ nasty strings


@pytest.mark.parametrize("nasty", NASTY, ids=range(len(NASTY)))
def test_nasty_strings_survive_render_to_argv_byte_for_byte(nasty: str) -> None:
    program = ("prog", nasty, f"--opt={nasty}")
    env = (EnvVar("NASTY", nasty),)
    job_dir = f"/tmp/job {nasty}".rstrip("/")
    plan = plan_of(program=program, env=env, workdir=f"/w/{nasty}", topology=uniform(1, 2))
    local = render_job(plan, "local", job_dir=job_dir)
    for cmd in local.instances:
        assert cmd.argv[-3:] == program
        assert cmd.env["NASTY"] == nasty and cmd.cwd == f"/w/{nasty}"
        assert cmd.shard_file == f"{job_dir}/shard-{cmd.index}.txt"
        assert cmd.env["POPRUN_SHARD_FILE"] == cmd.shard_file
    mpirun = render_job(plan, "mpirun", job_dir=job_dir)
    assert mpirun.launcher[mpirun.launcher.index("--hostfile") + 1] == f"{job_dir}/hostfile"
    for rank, cmd in zip(ompi_ranks(mpirun), local.instances, strict=True):
        if rank.argv != numactl_of(cmd, mpirun) + list(cmd.argv):  # ':' went via POPRUN_EXEC
            assert shlex.split(rank.env.pop(EXEC_VAR)) == ["exec", *program]
        assert rank.env == dict(cmd.env) and rank.wdir == cmd.cwd
    mpiexec = render_job(plan, "mpiexec", job_dir=job_dir)
    assert mpiexec.launcher[2] == f"{job_dir}/hostfile"


@pytest.mark.parametrize("nasty", NASTY, ids=range(len(NASTY)))
def test_nasty_strings_survive_the_appfile_and_the_exec_fallback(nasty: str) -> None:
    program = (*ECHO, nasty, f"--opt={nasty}")
    plan = plan_of(program=program, env=(EnvVar("NASTY", nasty),), topology=uniform(1, 2))
    job = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=1)
    for rank, cmd in zip(ompi_ranks(job), job.instances, strict=True):
        env, argv = rank.env, rank.argv
        assert env["NASTY"] == nasty
        assert {k: v for k, v in env.items() if k != EXEC_VAR} == dict(cmd.env)
        prefix = len(numactl_of(cmd, job))
        assert argv[:prefix] == numactl_of(cmd, job) and "rankfile" in job.files
        if cmd.index == 0:  # the other instances differ only in their binding
            assert run_argv(argv[prefix:], env) == [nasty, f"--opt={nasty}"]


@pytest.mark.parametrize("nasty", NASTY, ids=range(len(NASTY)))
def test_format_job_lines_split_back_to_the_same_env_and_argv(nasty: str) -> None:
    program = ("prog", nasty)
    plan = plan_of(program=program, env=(EnvVar("NASTY", nasty),), workdir=f"/w/{nasty}")
    job = render_job(plan, "local", job_dir=JOB_DIR)
    text = format_job(job)
    lines = [line for line in text.split("\n# instance")[1:]]
    assert len(lines) == plan.num_instances
    for chunk, cmd in zip(lines, job.instances, strict=True):
        words = shlex.split(chunk.split("\n", 1)[1])
        assert words[:2] == ["env", f"--chdir={cmd.cwd}"]
        assert words[2 : 2 + len(cmd.env)] == [f"{k}={v}" for k, v in cmd.env.items()]
        assert words[2 + len(cmd.env) :] == list(cmd.argv)


def test_nul_byte_in_a_value_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="NUL"):
        render_job(plan_of(program=("prog", "a\0b")), "local", job_dir=JOB_DIR)


# ------------------------------------------------------------------ format_job


def test_format_job_masks_secrets_everywhere() -> None:
    program = ("prog", "--token", SECRET)  # even where the user put it on purpose
    plan = plan_of(program=program, env=secret_env())
    for backend in LAUNCHER_TEMPLATES:
        if backend == "slurm":
            continue
        text = format_job(render_job(plan, backend, job_dir=JOB_DIR, argv_limit=1))
        assert SECRET not in text
        assert f"TOKEN={instance_env.MASK}" in text


def test_format_job_puts_one_launcher_context_on_a_line() -> None:
    job = render_job(plan_of(), "mpirun", job_dir=JOB_DIR)
    text = format_job(job)
    launcher = text.split("# launcher\n", 1)[1].split("\n# ", 1)[0]
    assert launcher.count(" \\\n  : -np 1 ") == 3
    assert tuple(shlex.split(launcher.replace("\\\n", ""))) == job.launcher


def test_job_dict_is_json_ready_and_masks_secrets() -> None:
    plan = plan_of(program=("prog", SECRET), env=secret_env())
    job = render_job(plan, "mpirun", job_dir=JOB_DIR, argv_limit=1)
    data = job_dict(job)
    text = json.dumps(data)
    assert SECRET not in text
    assert data["launcher"] == list(job.launcher) and data["secrets"] == ["TOKEN"]
    assert data["launcher_env"]["TOKEN"] == instance_env.MASK
    assert data["files"].keys() == {"hostfile", "appfile", "rank"}
    first = data["instances"][0]
    assert first["env"]["TOKEN"] == instance_env.MASK and first["env"]["MSG"] == "hello world"
    assert first["shard_file"] == f"{JOB_DIR}/shard-0.txt" and first["shard"] == []
    assert SECRET in json.dumps(job_dict(job, masked=False))


def test_render_template_renders_any_template_with_the_filters(tmp_path: Path) -> None:
    (tmp_path / "batch.j2").write_text("#!/bin/sh\nexec {{ argv | quoted }}\n")
    text = render_template("batch.j2", {"argv": ["a b", "c"]}, tmp_path)
    assert text == "#!/bin/sh\nexec 'a b' c\n"
    with pytest.raises(RenderError, match=r"batch\.j2:2: 'argv' is undefined"):
        render_template("batch.j2", {}, tmp_path)


# ------------------------------------------------------------------ templates and errors


def test_unknown_backend_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="local, mpiexec, mpirun, slurm, ssh"):
        render_job(plan_of(), "pbs", job_dir=JOB_DIR)


def test_list_templates_merges_user_templates(tmp_path: Path) -> None:
    packaged = list_templates()
    assert {"instance.j2", "mpiexec.j2", "mpirun.j2"} <= set(packaged)
    (tmp_path / "mine.j2").write_text("mine {{ program | quoted }}\n")
    (tmp_path / "mpirun.j2").write_text("mpirun {{ program | quoted }}\n")
    assert list_templates(tmp_path) == tuple(sorted({*packaged, "mine.j2"}))


def test_user_templates_override_packaged_ones_by_name(tmp_path: Path) -> None:
    (tmp_path / "instance.j2").write_text("nice -n 5 {{ program | quoted }} {{ inst.index }}\n")
    (tmp_path / "mpiexec.j2").write_text(
        "{% call file('nodes') %}{% for h in hosts %}{{ h.name }}\n{% endfor %}{% endcall %}"
        "srun --nodelist={{ files.nodes | quote }} --ntasks={{ instances | length }} "
        "{{ instances[0].argv | quoted }}\n"
    )
    job = render_job(plan_of(), "mpiexec", job_dir=JOB_DIR, templates_dir=tmp_path)
    assert job.instances[3].argv == ("nice", "-n", "5", "python", "train.py", "3")
    assert job.files == {"nodes": "h1\nh2\n"}
    assert job.launcher[:3] == ("srun", f"--nodelist={JOB_DIR}/nodes", "--ntasks=4")
    mpirun = render_job(plan_of(), "mpirun", job_dir=JOB_DIR, templates_dir=tmp_path)
    assert mpirun.launcher[0] == "mpirun"  # not overridden: the packaged one


def test_missing_template_names_it(tmp_path: Path) -> None:
    (tmp_path / "mpirun.j2").write_text("{% include 'helpers.j2' %}mpirun x\n")
    with pytest.raises(RenderError, match=r"template 'helpers.j2' not found \(looked in .*"):
        render_job(plan_of(), "mpirun", job_dir=JOB_DIR, templates_dir=tmp_path)


def test_missing_templates_dir_is_a_render_error(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="does not exist"):
        render_job(plan_of(), "local", job_dir=JOB_DIR, templates_dir=tmp_path / "nope")


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        (
            "{{ program | quoted }} {{ no_such_thing }}\n",
            r"instance.j2:1: 'no_such_thing' is undefined",
        ),
        ("\n{{ inst.nope }}\n", r"instance.j2:2: .*has no attribute 'nope'"),
        ("{% for x in program %}\n{{ x }}\n", r"instance.j2:2: syntax error: Unexpected end"),
        ("{{ program | nofilter }}\n", r"instance.j2:1: syntax error: No filter named 'nofilter'"),
        ("echo 'unbalanced\n", "instance.j2: output is not valid shell words"),
        ("{{ '' }}\n", "instance.j2: rendered an empty command"),
        ("{{ 1 // 0 }}\n", r"instance.j2:1: ZeroDivisionError"),
        ("{{ 'a b' | word }}\n", r"instance.j2:1: 'a b' cannot be one word"),
    ],
)
def test_template_faults_are_one_line_render_errors_naming_the_template(
    tmp_path: Path, text: str, fault: str
) -> None:
    (tmp_path / "instance.j2").write_text(text)
    with pytest.raises(RenderError, match=fault) as info:
        render_job(plan_of(), "local", job_dir=JOB_DIR, templates_dir=tmp_path)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_file_written_twice_or_with_a_path_is_a_render_error(tmp_path: Path) -> None:
    for body, fault in (
        ("{% call file('a') %}x{% endcall %}{% call file('a') %}y{% endcall %}", "twice"),
        ("{% call file('../a') %}x{% endcall %}", "bad job file name"),
    ):
        (tmp_path / "mpirun.j2").write_text(body + "mpirun x\n")
        with pytest.raises(RenderError, match=fault):
            render_job(plan_of(), "mpirun", job_dir=JOB_DIR, templates_dir=tmp_path)


def test_importing_render_does_not_import_jinja2() -> None:
    code = "import sys, poprun_py.render.job; sys.exit('jinja2' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60, check=False).returncode == 0


# ------------------------------------------------------------------ real mpirun


PROBE = (
    "import json, os, socket, sys; e = os.environ; "
    "open(os.path.join(e['REPORT_DIR'], 'rank-' + e['OMPI_COMM_WORLD_RANK']), 'w').write("
    "json.dumps({'rank': e['OMPI_COMM_WORLD_RANK'], 'host': socket.gethostname(), "
    "'cpus': sorted(os.sched_getaffinity(0)), 'argv': sys.argv[1:], 'env': dict(e)}))"
)
PROBE_ARGV = (sys.executable, "-c", PROBE)


def run_mpirun(job: RenderedJob, job_dir: Path, marker: str) -> list[dict[str, Any]]:
    """Write the job's files, run its launcher, return each rank's report (rank order)."""
    for name, text in job.files.items():
        (job_dir / name).write_text(text)
    out = subprocess.run(
        job.launcher,
        env={**os.environ, **job.launcher_env},
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    pgrep = ["pgrep", "-f", marker]
    left = subprocess.run(pgrep, capture_output=True, text=True, check=False).stdout
    assert left == "", f"processes left behind: {left}"
    reports = [json.loads(p.read_text()) for p in job_dir.glob("rank-*")]
    return sorted(reports, key=lambda r: int(r["rank"]))


def check_ranks(job: RenderedJob, reports: list[dict[str, Any]], hosts: list[str]) -> None:
    assert len(reports) == len(job.instances)
    for k, (report, cmd) in enumerate(zip(reports, job.instances, strict=True)):
        env: dict[str, str] = report["env"]
        assert int(report["rank"]) == k
        assert report["host"] == hosts[k]
        assert {name: env.get(name) for name in cmd.env} == dict(cmd.env)
        assert report["argv"] == list(job.plan.program[3:])
        if cmd.binding is not None:
            assert report["cpus"] == list(cmd.binding.cpu_ids)


@pytest.mark.mpi
@pytest.mark.parametrize("limit", [ARGV_LIMIT, 1], ids=["inline", "appfile"])
@pytest.mark.requires("mpirun", "pgrep")
def test_real_mpirun_gives_every_rank_its_environment_binding_and_argv(
    tmp_path: Path, limit: int
) -> None:
    marker = f"poprun-render-{uuid.uuid4().hex}"
    program = (*PROBE_ARGV, marker, "two words", ":", "it's", "$(x)", "é#x", "")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    real = Topology((NumaNode(0, tuple(cpus)),))
    env = (*secret_env(), EnvVar("REPORT_DIR", str(tmp_path)))
    plan = plan_of("sim1,sim2", program, env=env, topology=uniform(1, 2), simulated=True)
    job = render_job(
        plan,
        "mpirun",
        job_dir=str(tmp_path),
        available={"sim1": real, "sim2": real},
        as_root=os.geteuid() == 0,
        argv_limit=limit,
    )
    assert ("appfile" in job.files) == (limit == 1)
    reports = run_mpirun(job, tmp_path, marker)
    check_ranks(job, reports, [os.uname().nodename] * 4)


@pytest.mark.mpi
@pytest.mark.hosts
@pytest.mark.parametrize("limit", [ARGV_LIMIT, 1], ids=["inline", "appfile"])
@pytest.mark.requires("mpirun", "pgrep")
def test_real_mpirun_across_hosts_keeps_rank_to_host_order(
    test_cluster_4: TestCluster, tmp_path: Path, limit: int
) -> None:
    cluster = test_cluster_4
    h = cluster.hosts
    marker = f"poprun-render-{uuid.uuid4().hex}"
    # The machine running mpirun sits second: Open MPI maps it first unless contexts pin hosts.
    specs = (
        HostSpec(h[1].name, address=h[1].address),
        HostSpec("localhost"),
        HostSpec(h[0].name, address=h[0].address),
    )
    program = (*PROBE_ARGV, marker, "two words", ":")
    env = (*secret_env(), EnvVar("REPORT_DIR", str(tmp_path)))
    plan = make_plan(ClusterSpec("t", specs), JobSpec(program, replicas=6, instances=6, env=env))
    job = render_job(
        plan,
        "mpirun",
        job_dir=str(tmp_path),
        as_root=os.geteuid() == 0,
        mpi_subnet=cluster.subnet,
        mpi_args=("--mca", "plm_rsh_args", f"-F {cluster.ssh_config}"),
        argv_limit=limit,
    )
    reports = run_mpirun(job, tmp_path, marker)
    names = [h[1].name, os.uname().nodename, h[0].name]
    check_ranks(job, reports, [names[k // 2] for k in range(6)])
