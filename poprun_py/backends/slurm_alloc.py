"""Slurm allocations, step clean-up and batch scripts for the slurm backend.

The step itself is rendered by ``templates/srun.j2`` (see its header: task placement with
``--distribution=arbitrary``, per-task scripts, CPU binding) and run by
:class:`poprun_py.backends.slurm.SlurmBackend`. This module holds what surrounds it:

- :func:`current_allocation` -- the allocation poprun-py runs inside (``SLURM_JOB_ID`` and
  ``SLURM_JOB_NODELIST``), hosts in Slurm's order;
- :func:`allocate` / :func:`release` / :func:`allocated` -- outside an allocation, ask for one
  with ``salloc --no-shell`` (nodes, tasks, time, partition from :class:`SlurmRequest`; whole
  nodes by default, since Slurm binds only to CPUs the allocation holds), run steps in it by
  passing :attr:`Allocation.environ` to srun, and ``scancel`` it afterwards;
- :func:`cancel_steps` -- cancel steps or jobs by name (what a killed srun leaves running);
- :func:`unstage_argv` -- the step that removes what the task step staged on its nodes
  (``srun --bcast``'s copy of the task script, and shard files the tasks wrote beside it);
- :func:`nodelist` -- a ``--nodelist`` value: the names, folded into Slurm's hostlist syntax
  when they would be long (one argument is at most 128 KiB on Linux);
- :func:`batch_script` -- ``templates/sbatch.j2``: ``#SBATCH`` directives for the request, and a
  body that runs ``poprun-py launch --backend slurm ...`` inside the allocation, where hosts
  come from Slurm at run time.

Example:

    >>> current_allocation({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"})
    Allocation(job_id='42', nodelist='n[1-2]', hosts=('n1', 'n2'), owned=False)
    >>> salloc_argv(SlurmRequest(nodes=2, tasks=4, time="10"))
    ['salloc', '--no-shell', '--nodes=2', '--ntasks=4', '--ntasks-per-node=2', '--time=10', \
'--job-name=poprun', '--exclusive']
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from poprun_py.core.hosts import expand_names
from poprun_py.errors import BackendError, ProvisionError, UsageError
from poprun_py.process.commands import failure_line, run_captured

if TYPE_CHECKING:
    from poprun_py.core.plan import LaunchPlan

SBATCH_TEMPLATE = "sbatch.j2"
CLIENT_TIMEOUT = 30.0

_GRANTED = re.compile(r"Granted job allocation (\d+)")
_TIME = re.compile(r"(?:\d+-)?\d+(?::\d+){0,2}|UNLIMITED|INFINITE")
_WORD = re.compile(r"[A-Za-z0-9_.,:@+=/%-]+")


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class SlurmRequest:
    """What to ask Slurm for.

    ``time`` is in Slurm's format (``30`` minutes, ``1:00:00``, ``2-0``); ``tasks`` must be a
    multiple of ``nodes``, unless ``tasks_per_node`` gives the most tasks a node runs (hosts
    with different slots); ``exclusive`` asks for whole nodes (needed for NUMA binding);
    ``nodelist`` names the nodes (as many as ``nodes``); ``output`` is sbatch's ``--output``;
    ``no_kill`` keeps the allocation when one of its nodes fails (``--no-kill``: with spare
    hosts, a restart runs on a spare inside it).
    """

    nodes: int
    tasks: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str = "poprun"
    exclusive: bool = True
    nodelist: tuple[str, ...] = ()
    output: str | None = None
    tasks_per_node: int | None = None
    no_kill: bool = False

    def check(self) -> SlurmRequest:
        """Return self if valid; raise UsageError naming the bad field otherwise."""
        if self.nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {self.nodes}")
        self._check_tasks()
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise UsageError(f"bad --time {self.time!r}: use minutes, [D-]HH:MM[:SS] or MM:SS")
        if self.nodelist and len(self.nodelist) != self.nodes:
            raise UsageError(f"{len(self.nodelist)} host(s) named for {self.nodes} Slurm node(s)")
        fields = [("partition", self.partition), ("account", self.account)]
        fields += [("job name", self.job_name), ("output", self.output)]
        fields += [("node", n) for n in self.nodelist]
        for what, value in fields:
            if value is not None and not _WORD.fullmatch(value):
                raise UsageError(f"bad Slurm {what} {value!r}: no spaces or shell characters")
        return self

    def _check_tasks(self) -> None:
        tasks, per_node, nodes = self.tasks, self.tasks_per_node, self.nodes
        if per_node is not None and per_node < 1:
            raise UsageError(f"--ntasks-per-node must be at least 1, got {per_node}")
        if tasks is None:
            return
        if per_node is None and (tasks < 1 or tasks % nodes):
            raise UsageError(f"{tasks} tasks cannot be spread evenly over {nodes} Slurm node(s)")
        if per_node is not None and not nodes <= tasks <= per_node * nodes:
            raise UsageError(
                f"{tasks} tasks cannot run on {nodes} Slurm node(s) of at most {per_node} each"
            )


def request_options(req: SlurmRequest) -> list[str]:
    """The options salloc and sbatch share for ``req`` (validated first).

    >>> request_options(SlurmRequest(2, partition="debug", exclusive=False))
    ['--nodes=2', '--partition=debug', '--job-name=poprun']
    """
    req.check()
    opts = [f"--nodes={req.nodes}"]
    if req.tasks is not None:
        opts.append(f"--ntasks={req.tasks}")
    per_node = req.tasks_per_node
    if per_node is None and req.tasks is not None:
        per_node = req.tasks // req.nodes
    if per_node is not None:
        opts.append(f"--ntasks-per-node={per_node}")  # with --ntasks: the most on any node
    if req.time is not None:
        opts.append(f"--time={req.time}")
    if req.partition is not None:
        opts.append(f"--partition={req.partition}")
    if req.account is not None:
        opts.append(f"--account={req.account}")
    opts.append(f"--job-name={req.job_name}")
    if req.exclusive:
        opts.append("--exclusive")
    if req.nodelist:
        opts.append(f"--nodelist={nodelist(req.nodelist)}")
    if req.no_kill:
        opts.append("--no-kill")
    return opts


def salloc_argv(req: SlurmRequest) -> list[str]:
    """``salloc --no-shell ...``: allocate, print the job id, return; the job keeps the nodes."""
    return ["salloc", "--no-shell", *request_options(req)]


# ---------------------------------------------------------------- allocations


@dataclass(frozen=True)
class Allocation:
    """A Slurm job allocation: its id, its nodes in Slurm's order, and whether we made it."""

    job_id: str
    nodelist: str
    hosts: tuple[str, ...]
    owned: bool = False

    @property
    def environ(self) -> dict[str, str]:
        """What srun needs in its environment to run a step inside this allocation."""
        return {
            "SLURM_JOB_ID": self.job_id,
            "SLURM_JOBID": self.job_id,
            "SLURM_JOB_NODELIST": self.nodelist,
            "SLURM_NODELIST": self.nodelist,
            "SLURM_JOB_NUM_NODES": str(len(self.hosts)),
            "SLURM_NNODES": str(len(self.hosts)),
        }


def current_allocation(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation poprun-py runs inside (``SLURM_JOB_ID`` and a nodelist set), or None."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    return Allocation(job_id, nodelist, tuple(expand_names(nodelist, "Slurm node")))


def client(argv: Sequence[str], environ: Mapping[str, str], timeout: float | None) -> str:
    """Run a Slurm client; return its stdout and stderr, or raise BackendError with its last
    line (ProvisionError when the client is not installed)."""
    try:
        proc = run_captured(argv, timeout=timeout, env=environ)
    except FileNotFoundError as exc:
        raise BackendError(f"{argv[0]} not found on PATH; install slurm-client") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"{shlex.join(argv)}: {exc}") from exc
    if proc.returncode != 0:
        raise BackendError(f"{argv[0]} failed: {failure_line(proc)}")
    return proc.stdout + proc.stderr


def allocate(
    req: SlurmRequest, environ: Mapping[str, str] | None = None, timeout: float | None = None
) -> Allocation:
    """Ask Slurm for ``req`` with ``salloc --no-shell``; wait until it is granted.

    Give it back with :func:`release`. ProvisionError when Slurm grants nothing.
    """
    env = dict(os.environ if environ is None else environ)
    try:
        out = client(salloc_argv(req), env, timeout)
    except BackendError as exc:
        raise ProvisionError(f"no Slurm allocation: {exc}") from exc
    match = _GRANTED.search(out)
    if match is None:
        raise ProvisionError(f"salloc granted nothing: {out.strip()[-200:]!r}")
    job_id = match.group(1)
    try:
        nodelist = client(["squeue", "-h", "-j", job_id, "-o", "%N"], env, CLIENT_TIMEOUT)
        nodelist = nodelist.strip()
        return Allocation(job_id, nodelist, tuple(expand_names(nodelist, "Slurm node")), True)
    except BaseException:
        client(["scancel", job_id], env, CLIENT_TIMEOUT)
        raise


def release(alloc: Allocation, environ: Mapping[str, str] | None = None) -> None:
    """Cancel an allocation poprun-py made (``scancel``); one it runs inside is left alone."""
    if alloc.owned:
        client(["scancel", alloc.job_id], dict(os.environ if environ is None else environ), 30)


@contextlib.contextmanager
def allocated(req: SlurmRequest, environ: Mapping[str, str] | None = None) -> Iterator[Allocation]:
    """The current allocation if inside one; else a new one, released on the way out."""
    env = dict(os.environ if environ is None else environ)
    current = current_allocation(env)
    if current is not None:
        yield current
        return
    alloc = allocate(req, env)
    try:
        yield alloc
    finally:
        release(alloc, env)


# ---------------------------------------------------------------- steps


def step_names(launcher: Sequence[str]) -> tuple[str, ...]:
    """The ``--job-name``/``-J`` values of an srun argv (before its program).

    >>> step_names(["srun", "--job-name=poprun-x", "-N2", "/bin/sh", "t.sh", "-J", "y"])
    ('poprun-x',)
    """
    names: list[str] = []
    args = list(launcher[1:])
    for pos, arg in enumerate(args):
        if not arg.startswith("-"):
            break
        if arg.startswith("--job-name="):
            names.append(arg.split("=", 1)[1])
        elif arg in ("-J", "--job-name") and pos + 1 < len(args):
            names.append(args[pos + 1])
    return tuple(names)


def staged_path(launcher: Sequence[str]) -> str | None:
    """Where an srun argv has ``--bcast=PATH`` copy its program on every node (or None).

    >>> staged_path(["srun", "-N2", "--bcast=/tmp/p.sh", "/job/slurm-task.sh", "--bcast=x"])
    '/tmp/p.sh'
    """
    for arg in launcher[1:]:
        if not arg.startswith("-"):
            return None
        if arg.startswith("--bcast="):
            return arg.split("=", 1)[1] or None
    return None


def unstage_argv(launcher: Sequence[str], hosts: Sequence[str]) -> list[str] | None:
    """One task on each of ``hosts`` removing what ``launcher`` (an srun argv with
    ``--bcast=STAGE``) left there: STAGE and the ``STAGE-without-.sh.shard-N.txt`` files its
    tasks wrote; None when it staged nothing.

    >>> unstage_argv(["srun", "--job-name=poprun-j", "--bcast=/tmp/p.sh", "t.sh"], ["n1", "n2"])
    ... # doctest: +NORMALIZE_WHITESPACE
    ['srun', '--job-name=poprun-j-unstage', '--nodes=2', '--ntasks=2', '--ntasks-per-node=1',
     '--nodelist=n1,n2', '/bin/sh', '-c', 'rm -f -- "$1" "${1%.sh}".shard-*.txt', 'sh',
     '/tmp/p.sh']
    """
    stage = staged_path(launcher)
    if stage is None or not hosts:
        return None
    nodes = list(dict.fromkeys(hosts))
    name = next(iter(step_names(launcher)), "poprun")
    return [
        "srun",
        f"--job-name={name}-unstage",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={nodelist(nodes)}",
        "/bin/sh",
        "-c",
        'rm -f -- "$1" "${1%.sh}".shard-*.txt',
        "sh",
        stage,
    ]


NODELIST_FOLD = 16 * 1024
"""A node list longer than this (bytes, joined by commas) goes to Slurm folded
(``node[0001-4096]``): Linux takes at most 128 KiB in one argument (MAX_ARG_STRLEN)."""
_NUMBERED = re.compile(r"\A(.*?)(\d+)\Z")


def nodelist(nodes: Sequence[str]) -> str:
    """``--nodelist``'s value for ``nodes`` (an unordered set to Slurm): the names joined by
    commas, or folded (:func:`fold_hosts`) when that is longer than :data:`NODELIST_FOLD`.

    >>> nodelist(["n1", "n2"])
    'n1,n2'
    >>> nodelist([f"nid{i:06d}" for i in range(1, 20_001)])
    'nid[000001-020000]'
    """
    names = list(dict.fromkeys(nodes))
    joined = ",".join(names)
    return fold_hosts(names) if len(joined.encode()) > NODELIST_FOLD else joined


def fold_hosts(names: Iterable[str]) -> str:
    """Slurm's hostlist expression for ``names`` (duplicates dropped): names that end in a
    number and differ only there, written with as many digits, become one ``prefix[ranges]``;
    the others stay as they are (Slurm takes no suffix after the brackets).

    >>> fold_hosts(["n01", "n02", "n03", "n05", "n10", "n9", "login", "r1-ib", "r2-ib"])
    'n[01-03,05,10],n9,login,r1-ib,r2-ib'
    """
    groups: dict[tuple[str, int], list[int]] = {}
    for name in dict.fromkeys(names):
        match = _NUMBERED.match(name)
        if match is None:
            groups[(name, 0)] = []
            continue
        prefix, digits = match.groups()
        groups.setdefault((prefix, len(digits)), []).append(int(digits))
    return ",".join(_folded(*key, numbers) for key, numbers in groups.items())


def _folded(prefix: str, width: int, numbers: list[int]) -> str:
    if not numbers:
        return prefix
    if len(numbers) == 1:
        return f"{prefix}{numbers[0]:0{width}d}"
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    parts = [f"{lo:0{width}d}" + (f"-{hi:0{width}d}" if hi > lo else "") for lo, hi in runs]
    return f"{prefix}[{','.join(parts)}]"


def named_ids(listing: str, names: Iterable[str]) -> list[str]:
    """Ids from ``squeue -o '%i %j'`` lines whose name (the rest of the line) is in ``names``."""
    wanted = set(names)
    ids = []
    for line in listing.splitlines():
        parts = line.strip().split(" ", 1)
        if len(parts) == 2 and parts[1] in wanted:
            ids.append(parts[0])
    return ids


def cancel_steps(names: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """SIGKILL every step called one of ``names`` and cancel every job so called (an
    allocation srun made itself); return the ids Slurm still listed.

    Call until it returns [] to wait until Slurm has nothing of those names left.
    """
    env = dict(os.environ if environ is None else environ)
    names = tuple(names)
    listing = ["squeue", "--me", "-h", "-o", "%i %j"]
    steps = named_ids(client([*listing, "--steps"], env, CLIENT_TIMEOUT), names)
    jobs = named_ids(client(listing, env, CLIENT_TIMEOUT), names)
    with contextlib.suppress(BackendError):  # gone between squeue and scancel
        if steps:
            client(["scancel", "--signal=KILL", *steps], env, CLIENT_TIMEOUT)
        if jobs:
            client(["scancel", *jobs], env, CLIENT_TIMEOUT)
    return steps + jobs


# ---------------------------------------------------------------- batch scripts


def batch_script(
    req: SlurmRequest,
    launch_argv: Sequence[str],
    *,
    plan: LaunchPlan | None = None,
    templates_dir: Path | None = None,
) -> str:
    """An sbatch script for ``req`` whose body runs ``launch_argv`` inside the allocation.

    ``launch_argv`` is normally ``poprun-py launch --backend slurm ... PROGRAM ARGS``: inside the
    job, poprun-py takes its hosts from the allocation and runs the step with srun. ``plan``, if
    given, is summarised in comments. ``templates_dir`` overrides the packaged ``sbatch.j2``.
    """
    from poprun_py.render.environment import render_template

    if not launch_argv:
        raise UsageError("a batch script needs the command to run inside the allocation")
    directives = request_options(req) + ([f"--output={req.output}"] if req.output else [])
    context = {"request": req, "directives": directives, "launch_argv": tuple(launch_argv)}
    context["plan"] = plan
    return render_template(SBATCH_TEMPLATE, context, templates_dir)
