"""The slurm backend: the rendered ``srun ...`` step runs as one supervised process.

``srun --label`` prefixes every line a task writes with ``N: `` (its ``SLURM_PROCID``, padded
to the width of the largest). :class:`LabelDemux` strips the label and hands the line to the
:class:`~poprun_py.process.supervise.Output` as instance N's (``templates/srun.j2`` places task N
exactly where the plan puts instance N), so it shows as ``[host:N]`` and lands in
``instance-N.log``. Unlabelled lines are srun's own (``srun.log``); :class:`TaskReport` reads how
each task ended from them (``srun: error: HOST: tasks 0-1: Exited with exit code 3`` or a signal's
name).

``--hang-timeout``: a hung step's tasks are dumped with py-spy by one more step on their nodes
(:mod:`poprun_py.backends.slurm_stacks`); ranks it could not dump get SIGUSR1 through srun as
under mpirun (:meth:`~poprun_py.backends.external.LauncherRun.ranks_dumped`).

Failure: ``--kill-on-bad-exit=1`` makes Slurm end the step when one task fails; that task is the
root cause (its own exit code becomes poprun-py's), the others are ``stopped``. When srun reports a
node failure (``Node failure on NODE``), that node's tasks are lost and the root cause; the tasks
Slurm killed on the other nodes are ``stopped``, whichever srun reported first. Ctrl-C: SIGTERM goes
to srun alone, which cancels the step (as after two Ctrl-C within a second): Slurm sends the tasks
SIGTERM, then SIGKILL after its ``KillWait``. If srun has not ended when poprun-py's grace period
runs out, srun gets SIGKILL. Whatever happened, a step of this job's name that Slurm still lists
afterwards gets ``scancel --signal=KILL`` and is waited for, so nothing is left on the nodes.

Staging: the step carries its own task script (``srun --bcast``, see ``templates/srun.j2``), so
the job directory -- by default under /tmp of this machine -- need not be shared with the
nodes; afterwards one more step removes the staged copies (a failure to do so is a warning).

Example:

    >>> report = TaskReport()
    >>> report.scan("srun: error: n2: task 2: Exited with exit code 7")
    >>> report.scan("srun: error: n1: tasks 0-1: Terminated")
    >>> [(rank, end.exit_code, end.signal) for rank, end in sorted(report.ends.items())]
    [(0, None, 15), (1, None, 15), (2, 7, None)]
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from poprun_py.backends.base import Checked, Defaults, run_to_end
from poprun_py.backends.external import (
    LauncherRun,
    how_ended,
    prepare_launcher,
    start_launcher,
)
from poprun_py.backends.slurm_alloc import (
    SlurmRequest,
    allocated,
    batch_script,
    cancel_steps,
    current_allocation,
    step_names,
    unstage_argv,
)
from poprun_py.backends.slurm_stacks import STACKS_SUFFIX, StepStacks
from poprun_py.core.result import (
    InstanceResult,
    InstanceState,
    LaunchResult,
    RunOptions,
    RunSettings,
)
from poprun_py.errors import BackendError, Fault, PreflightError
from poprun_py.process.commands import failure_line, run_captured
from poprun_py.process.output import LAUNCHER_INDEX, Output
from poprun_py.process.supervise import Child, Feed, Supervised

if TYPE_CHECKING:
    from poprun_py.preflight.probes import PreflightReport
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control
    from poprun_py.render.job import RenderArgs, RenderedJob

SRUN_MISSING = "srun not found on PATH; install Slurm's clients (Debian: slurm-client)"
CLEANUP_TIMEOUT = 15.0
BIND_HINT = "NUMA binding needs whole nodes: allocate with --exclusive, or use --no-numa-aware"

_LABEL = re.compile(rb" *(\d+): ?")
SRUN_CHUNK = 1024  # Slurm's MAX_MSG_LEN (src/common/io_hdr.h): the most bytes of one I/O message
_TASK_END = re.compile(r"srun: error: (\S+): tasks? ([0-9,-]+): (.+)")
_EXITED = re.compile(r"Exited with exit code (\d+)")
_ERROR = re.compile(r"srun: error: (.+)")
_NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")
_SIGNALS = {signal.strsignal(s) or "": int(s) for s in signal.valid_signals()}
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP)
TASK_SCRIPT = "slurm-task.sh"
NODE_FAILED = "its node failed (srun: Node failure)"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskEnd:
    """How srun says one task ended; ``order`` is the position of its report."""

    exit_code: int | None
    signal: int | None
    order: int
    at: float
    detail: str = ""

    @property
    def failed(self) -> bool:
        """True for a non-zero exit or a death by signal."""
        return bool(self.exit_code) or self.signal is not None


def parse_ranks(text: str) -> list[int]:
    """``0-2,5`` -> [0, 1, 2, 5].

    >>> parse_ranks("0-2,5")
    [0, 1, 2, 5]
    """
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


class TaskReport:
    """Reads srun's own lines: how each task ended, and srun's last error."""

    def __init__(self) -> None:
        self.ends: dict[int, TaskEnd] = {}
        self.error = ""
        self.failed_nodes: dict[str, float] = {}  # node -> when srun said it failed

    def scan(self, line: str) -> None:
        """Look at one line of srun's own output."""
        if failure := _NODE_FAILURE.fullmatch(line.strip()):
            self.failed_nodes.setdefault(failure.group(1), time.time())
        match = _TASK_END.fullmatch(line.strip())
        if match is None:
            if error := _ERROR.fullmatch(line.strip()):
                self.error = error.group(1)
            return
        how = match.group(3)
        code, sig = None, None
        if exited := _EXITED.fullmatch(how):
            code = int(exited.group(1))
        else:
            sig = _SIGNALS.get(how.removesuffix(" (core dumped)"))
        detail = "" if code is not None or sig is not None else how
        for rank in parse_ranks(match.group(2)):
            if rank not in self.ends:
                self.ends[rank] = TaskEnd(code, sig, len(self.ends), time.time(), detail)

    def failed_before(self, end: TaskEnd) -> bool:
        """True when another task's failure was reported before ``end``."""
        return any(e.failed and e.order < end.order for e in self.ends.values())


class LabelDemux:
    """Splits one of srun's pipes into per-task lines (labelled) and srun's own lines.

    Slurm forwards a task's output in messages of at most :data:`SRUN_CHUNK` bytes, and
    ``--label`` ends each message as a line: a longer line arrives as labelled pieces of exactly
    that size, then its rest (empty when its length was a multiple). A piece of that size is
    therefore joined with the task's next one, so a long line is never cut in two.
    """

    def __init__(self, output: Output, stream: str, report: TaskReport, ntasks: int):
        self._output, self._stream, self._report = output, stream, report
        self._ntasks = ntasks
        self._pending = b""
        self._pieces: dict[int, bytes] = {}

    def feed(self, data: bytes) -> None:
        """Route every complete line; keep the tail."""
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            self._route(line)

    def close(self) -> None:
        """Route a last line that had no newline, and any long line still in pieces."""
        if self._pending:
            self._route(self._pending)
            self._pending = b""
        for task, piece in sorted(self._pieces.items()):
            self._output.emit(task, self._stream, piece)
        self._pieces.clear()

    def _route(self, line: bytes) -> None:
        label = _LABEL.match(line)
        if label and (task := int(label.group(1))) < self._ntasks:
            text = self._pieces.pop(task, b"") + line[label.end() :]
            if len(line) - label.end() == SRUN_CHUNK:
                self._pieces[task] = text
            else:
                self._output.emit(task, self._stream, text)
            return
        self._report.scan(line.decode("utf-8", "replace"))
        self._output.emit(LAUNCHER_INDEX, self._stream, line)


class SlurmBackend(Defaults):
    """Runs ``job.launcher`` (an ``srun`` argv) and maps its outcome onto every task.

    ``environ`` is added to srun's environment, e.g. ``Allocation.environ`` of an allocation
    poprun-py made, so the step runs inside it.
    """

    name = "slurm"

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = dict(environ or {})

    def render_args(self, prep: Prepared) -> RenderArgs:
        """``--mpi-args`` (or the spec's ``defaults.mpi_args``): srun's own extra options,
        which ``templates/srun.j2`` puts before the task script."""
        from poprun_py.render.job import RenderArgs

        return RenderArgs(mpi_args=prep.mpi_args)

    def batch_script(
        self, prep: Prepared, launch_argv: Callable[[bool], Sequence[str]]
    ) -> str | None:
        """Outside an allocation: an sbatch script that runs this same launch inside the
        allocation it asks for (``--hosts`` passed on when it asks for those very nodes).
        Inside one: None (the launch itself is what runs)."""
        request = slurm_request(prep)  # checked inside an allocation too (a bad --slurm-time)
        if current_allocation(os.environ) is not None:
            return None
        argv = launch_argv(bool(request.nodelist))
        return batch_script(request, argv, plan=prep.plan, templates_dir=prep.templates)

    def open(self, prep: Prepared, settings: RunSettings) -> SlurmSession:
        """The current allocation, or one asked for with salloc (released on close)."""
        return SlurmSession(prep)

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Write the job's files, run srun under supervision, report every task."""
        return run_to_end(self, job, options)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> LauncherRun:
        """Write the job's files and start the srun step; no step outlives ``wait``."""
        env = {**job.launcher_env, **self.environ}
        hosts = prepare_launcher(job, env, "slurm", SRUN_MISSING)
        if TASK_SCRIPT in job.files:  # srun --bcast runs it on the nodes: it must be executable
            os.chmod(os.path.join(job.job_dir, TASK_SCRIPT), 0o700)
        output = Output(options, hosts, launcher="srun")
        report = TaskReport()

        def demux(child: Child, stream: str) -> Feed:
            return LabelDemux(output, stream, report, len(hosts))

        with contextlib.ExitStack() as stack:
            stack.callback(unstage, job, env)
            stack.callback(leave_nothing, job, env)
            stacks = step_stacks(job, env)
            if stacks is not None:
                stack.callback(stacks.close)  # a dump under way ends before the clean-up
            run = start_launcher(job, env, output, options.grace_period, demux, control)
            results = functools.partial(task_results, hosts=hosts, report=report)
            return LauncherRun(run, stack.pop_all(), results, relay=stacks, ranks=hosts)
        raise AssertionError("unreachable")  # pragma: no cover - ExitStack re-raises


def slurm_request(prep: Prepared) -> SlurmRequest:
    """The allocation a slurm job needs: its hosts and spares (when named), tasks (the most
    on one node: hosts' slots may differ) and limits. With spares, no task count: a spare
    node runs no task until it takes a lost host's place (Slurm would shrink a job of fewer
    tasks than nodes)."""
    plan, opts = prep.plan, prep.options
    planned = tuple(h.spec for h in plan.hosts)
    names = {h.name for h in planned}
    hosts = (*planned, *(s for s in prep.long_run.spares if s.name not in names))
    named = tuple(h.name for h in hosts if h.name != "localhost")
    spares = bool(prep.long_run.spares)
    return SlurmRequest(
        nodes=len(hosts),
        tasks=None if spares else plan.num_instances,
        time=opts.slurm_time,
        partition=opts.slurm_partition,
        account=opts.slurm_account,
        nodelist=named if len(named) == len(hosts) else (),
        tasks_per_node=max(len(h.instances) for h in plan.hosts),
        no_kill=spares,
    ).check()


def spares_alone(prep: Prepared) -> bool:
    """Whether ``prep`` is the job planned on its spares alone (the restarts' preflight of the
    spares, beside the hosts'). Outside an allocation that preflight asks for nothing: an
    allocation of its own would wait for the job's, which holds the spares (a deadlock), and a
    spare granted in the job's allocation is a node Slurm has up."""
    spares = {s.name for s in prep.long_run.spares}
    return bool(spares) and all(h.name in spares for h in prep.plan.hosts)


class SlurmSession:
    """One launch inside an allocation: srun must be on PATH; steps run in the allocation."""

    def __init__(self, prep: Prepared):
        self.prep = prep
        self.stack = contextlib.ExitStack()
        self.environ: dict[str, str] = {}
        self.report: PreflightReport | None = None

    def preflight(self, prep: Prepared) -> Checked:
        """srun is on PATH; then the allocation (asked for now when there is none); then, in
        one step, every node's checks and hardware (:mod:`poprun_py.backends.slurm_discover`),
        re-planned with what was found."""
        from poprun_py.backends.slurm_discover import discover_nodes, needs_discovery
        from poprun_py.process import phases

        if shutil.which("srun") is None:
            raise PreflightError([Fault("localhost", "srun", SRUN_MISSING)])
        if spares_alone(prep) and current_allocation(os.environ) is None:
            return Checked(prep, {})  # see spares_alone
        with phases.phase("allocation", ()):  # may wait in Slurm's queue
            alloc = self.stack.enter_context(allocated(slurm_request(prep)))
        self.environ = dict(alloc.environ)
        plan = prep.plan
        if all(h.name != "localhost" for h in plan.hosts):
            from poprun_py.backends.session import with_topologies

            discover = needs_discovery(plan)  # else: the program and workdir only
            with phases.phase("preflight", ()):  # one step on every node
                report = discover_nodes(plan, self.environ, alloc.job_id, discover=discover)
            self.report = report
            for warning in report.warnings:
                log.warning("%s", warning)
            if discover:
                prep = with_topologies(prep, report.topologies, report.interfaces(plan.network))
                return Checked(prep, report.topologies)
        return Checked(prep, {})

    def sync(self, paths: Sequence[str], timeout: float | None = None) -> None:
        """Nodes of an allocation share the job directory (see docs/slurm.md)."""

    def tidy(self, job_dir: str) -> None:
        """The nodes share the job directory: the launcher's own clean-up removes it."""

    def stage(self, job: RenderedJob) -> None:
        """srun's tasks read the job's files from the job directory; numactl must be on the
        nodes whose tasks run under it."""
        if self.report is not None:
            from poprun_py.preflight.probes import check_numactl

            check_numactl(job, self.report)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> LauncherRun:
        """Start the step inside the allocation."""
        return SlurmBackend(self.environ).start(job, options, control)

    def close(self) -> None:
        """Release an allocation poprun-py asked for."""
        self.stack.close()


def step_stacks(job: RenderedJob, env: Mapping[str, str]) -> StepStacks | None:
    """The hung step's stack dumps (py-spy on its nodes, one more step) when srun runs in an
    allocation and the step is named; None: SIGUSR1 through srun only."""
    alloc = current_allocation({**os.environ, **env})
    names = step_names(job.launcher)
    if alloc is None or not names:
        return None
    nodes = list(dict.fromkeys(cmd.host for cmd in job.instances))
    return StepStacks(alloc.job_id, nodes, names, env)


def leave_nothing(job: RenderedJob, env: Mapping[str, str]) -> None:
    """Cancel and wait out any step (or job) of this job's name that Slurm still knows (its
    stack dump's step included)."""
    names = step_names(job.launcher)
    if not names:
        return
    names = (*names, *(name + STACKS_SUFFIX for name in names))
    environ = {**os.environ, **env}
    deadline = time.monotonic() + CLEANUP_TIMEOUT
    with contextlib.suppress(BackendError):  # slurmctld gone: nothing we can cancel
        while cancel_steps(names, environ) and time.monotonic() < deadline:
            time.sleep(0.1)


def unstage(job: RenderedJob, env: Mapping[str, str]) -> None:
    """Remove what the step staged on its nodes (one task a node); a failure is a warning."""
    argv = unstage_argv(job.launcher, [cmd.host for cmd in job.instances])
    if argv is None:
        return
    try:
        proc = run_captured(argv, timeout=CLEANUP_TIMEOUT, env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not remove the staged task script from the nodes: %s", exc)
        return
    if proc.returncode != 0:
        why = failure_line(proc)
        log.warning("could not remove the staged task script from the nodes: %s", why)


def _reported(end: TaskEnd, stopping: bool, report: TaskReport) -> _Outcome:
    if end.failed and stopping:  # ended after poprun-py stopped srun, signal or not
        return InstanceState.STOPPED, end.exit_code, end.signal, "step cancelled"
    if end.signal in _STOP_SIGNALS and report.failed_nodes:  # whichever line srun printed first
        failed = ", ".join(report.failed_nodes)
        return InstanceState.STOPPED, None, end.signal, f"step ended after node {failed} failed"
    if end.signal in _STOP_SIGNALS and report.failed_before(end):
        return InstanceState.STOPPED, None, end.signal, "step cancelled after another task failed"
    return InstanceState.EXITED, end.exit_code, end.signal, end.detail


def task_results(run: Supervised, hosts: Mapping[int, str], report: TaskReport) -> LaunchResult:
    """One InstanceResult per task from srun's exit and its per-task reports."""
    srun = run.exits[0]
    stopping = run.interrupted or srun.stopped
    srun_code = srun.returncode if srun.returncode is not None else 1
    if srun.detail and not report.error:
        report.error = srun.detail
    results = []
    for rank in sorted(hosts):
        end = report.ends.get(rank)
        state, code, sig, detail = _outcome(end, srun_code, stopping, report)
        lost = report.failed_nodes.get(hosts[rank])
        if lost is not None:  # its node failed: a restart puts a spare in its place
            state, code, sig, detail = InstanceState.LOST, None, None, NODE_FAILED
        results.append(
            InstanceResult(
                index=rank,
                host=hosts[rank],
                exit_code=code,
                signal=sig,
                state=state,
                started=srun.started,
                ended=lost if lost is not None else end.at if end else srun.ended,
                detail=detail,
            )
        )
    return LaunchResult(tuple(results), interrupted=run.interrupted, duration=run.duration)


_Outcome = tuple[InstanceState, int | None, int | None, str]


def _outcome(end: TaskEnd | None, code: int, stopping: bool, report: TaskReport) -> _Outcome:
    if end is not None:
        return _reported(end, stopping, report)
    if stopping:  # srun may give up waiting for a cancelled step and report nothing
        return InstanceState.STOPPED, None, None, "stopped with srun"
    if code == 0 or any(e.failed for e in report.ends.values()):
        return InstanceState.EXITED, 0, None, ""  # srun reports only tasks that failed
    how, exit_code, sig = how_ended(code)
    detail = f"srun ended with {how}" + (f": {report.error}" if report.error else "")
    if "cpu bind" in report.error.lower():
        detail += f" ({BIND_HINT})"
    return InstanceState.EXITED, exit_code, sig, detail
