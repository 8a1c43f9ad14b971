"""The mpirun backend: the rendered ``mpirun ...`` argv runs as one supervised process group.

Open MPI's ``--tag-output`` marks each chunk a rank writes with ``[jobid,rank]<stdout>:`` (or
``<stderr>:``/``<stddiag>:``); chunks are not lines, so a rank's line may arrive in several
tagged pieces interleaved with other ranks'. :class:`TagDemux` undoes that and hands whole
lines to the :class:`~poprun_py.process.supervise.Output` as ``[host:rank]`` lines of that instance
(and its log). Untagged lines are mpirun's own (index ``LAUNCHER_INDEX``, ``mpirun.log``); its
failure report (``Process name: [[x,y],RANK]`` / ``Exit code: N``, or ``process rank R ...
exited on signal S``) names the root cause.

On remote hosts, Open MPI's daemons start through poprun-py's per-host agents (one login session
per host for the whole launch; :mod:`poprun_py.agent.relay`), unless the user chose their
own ``plm_rsh_agent``.

Ctrl-C: SIGTERM goes to mpirun alone (it forwards it to the ranks), SIGKILL to its group after
the grace period, then the sweep catches the ranks (which Open MPI puts in groups of their own).

Example:

    >>> report = FailureReport()
    >>> for line in ["  Process name: [[15968,1],2]", "  Exit code:    3"]:
    ...     report.scan(line)
    >>> report.rank, report.exit_code, report.signal
    (2, 3, None)
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from poprun_py.agent.relay import Lost, relayed
from poprun_py.backends.base import Defaults, Session, run_to_end
from poprun_py.backends.external import (
    LauncherRun,
    how_ended,
    prepare_launcher,
    start_launcher,
)
from poprun_py.backends.mpi import mpirun_render_args
from poprun_py.backends.session import (
    MPI_BEHIND_JUMP,
    LocalSession,
    RemoteSession,
    local_topologies,
)
from poprun_py.core.result import (
    InstanceResult,
    InstanceState,
    LaunchResult,
    RunOptions,
    RunSettings,
)
from poprun_py.process.output import LAUNCHER_INDEX, Output
from poprun_py.process.supervise import Child, Feed, Supervised

if TYPE_CHECKING:
    from poprun_py.agent.client import AgentPool
    from poprun_py.core.topology import Topology
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control
    from poprun_py.render.job import RenderArgs, RenderedJob

MPIRUN_MISSING = "mpirun not found on PATH; install Open MPI (Debian: openmpi-bin)"

_TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
_PARTIAL_TAG = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]*>?)?)?)?\Z")
_PROCESS_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
_ABORTED = re.compile(
    r"MPI_ABORT was invoked on rank (\d+) in communicator \S+ with errorcode (\d+)"
)


RANK_FAILED = re.compile(r"poprun-py: rank exited with code (\d+)\s*\Z")
"""The line each rank's wrapper (``mpirun.j2``'s ``rank`` file, ``mpiexec.j2``) writes on the
rank's stderr when the rank exits non-zero."""


class FailureReport:
    """Reads mpirun's own lines for the rank that failed first, and how; the ranks' own
    reports (their wrapper's :data:`RANK_FAILED` line) name it when mpirun does not (Open MPI
    sometimes ends with "Primary job terminated normally, but 1 process returned a non-zero
    exit code" and nothing naming the process)."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self._pending: int | None = None
        self.first_report: tuple[int, int] | None = None  # (rank, code): the first wrapper line

    def rank_line(self, rank: int, line: str) -> bool:
        """Look at one of a rank's stderr lines; True when it is that rank's failure report
        (poprun-py's, not the program's: it is not shown)."""
        match = RANK_FAILED.search(line)
        if match is None:
            return False
        if self.first_report is None:
            self.first_report = (rank, int(match.group(1)))
        return True

    def settle(self) -> None:
        """The launcher has ended: without a rank named by mpirun, the first rank that
        reported its own failure is the root cause."""
        if self.rank is None and self.first_report is not None:
            self.rank, self.exit_code = self.first_report

    def scan(self, line: str) -> None:
        """Look at one line of mpirun's own output."""
        if self.rank is not None:
            return
        if m := _PROCESS_NAME.search(line):
            self._pending = int(m.group(1))
        elif self._pending is not None and (m := _EXIT_CODE.search(line)):
            self.rank, self.exit_code = self._pending, int(m.group(1))
        elif m := _SIGNALLED.search(line):
            self.rank, self.signal = int(m.group(1)), int(m.group(2))
        elif m := _ABORTED.search(line):
            self.rank, self.exit_code = int(m.group(1)), int(m.group(2))


class TagDemux:
    """Splits one of mpirun's pipes into per-rank lines (and mpirun's own lines).

    A tag owns the text after it up to the next newline or the next tag, whichever comes
    first; text at the start of a line without a tag belongs to mpirun. Subclasses for other
    launchers set ``TAG`` (group 1 the rank; group 2 the stream, else the pipe's) and
    ``PARTIAL_TAG``.
    """

    TAG = _TAG
    PARTIAL_TAG = _PARTIAL_TAG

    def __init__(self, output: Output, stream: str, report: FailureReport):
        self._output, self._stream, self._report = output, stream, report
        self._owner: tuple[int, str] | None = None
        self._lines: dict[tuple[int, str], bytes] = {}
        self._held = b""

    def feed(self, data: bytes) -> None:
        """Take the next chunk; hold back a tag cut in two by the read."""
        data = self._held + data
        cut = data.rfind(b"[")
        self._held = b""
        if cut >= 0 and self.PARTIAL_TAG.match(data, cut):
            data, self._held = data[:cut], data[cut:]
        self._parse(data)

    def close(self) -> None:
        """EOF: flush the held bytes and every unfinished line."""
        self._parse(self._held)
        self._held = b""
        for owner, text in list(self._lines.items()):
            if text:
                self._emit(owner, text)
        self._lines.clear()

    def _parse(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            if self._owner is None:
                tag = self.TAG.match(data, pos)
                if tag:
                    self._owner, pos = (int(tag.group(1)), self._stream_of(tag)), tag.end()
                else:
                    self._owner = (LAUNCHER_INDEX, self._stream)
            pos = self._take(data, pos)

    def _stream_of(self, tag: re.Match[bytes]) -> str:
        if tag.lastindex is None or tag.lastindex < 2:
            return self._stream
        return "stdout" if tag.group(2) == b"stdout" else "stderr"

    def _take(self, data: bytes, pos: int) -> int:
        """Give ``data[pos:]`` up to the next newline or tag to the current owner."""
        assert self._owner is not None
        newline = data.find(b"\n", pos)
        tag = self.TAG.search(data, pos, newline if newline >= 0 else len(data))
        owner = self._owner
        if tag:
            self._lines[owner] = self._lines.get(owner, b"") + data[pos : tag.start()]
            if owner[0] == LAUNCHER_INDEX:
                self._flush(owner, keep_empty=False)
            self._owner = None
            return tag.start()
        end = newline if newline >= 0 else len(data)
        self._lines[owner] = self._lines.get(owner, b"") + data[pos:end]
        if newline < 0:
            return end
        self._flush(owner, keep_empty=True)
        self._owner = None
        return newline + 1

    def _flush(self, owner: tuple[int, str], keep_empty: bool) -> None:
        text = self._lines.pop(owner, b"")
        if keep_empty or text:
            self._emit(owner, text)

    def _emit(self, owner: tuple[int, str], text: bytes) -> None:
        if owner[0] == LAUNCHER_INDEX:
            self._report.scan(text.decode("utf-8", "replace"))
        elif owner[1] == "stderr" and self._report.rank_line(
            owner[0], text.decode("utf-8", "replace")
        ):
            return
        self._output.emit(owner[0], owner[1], text)


class MpirunBackend(Defaults):
    """Runs ``job.launcher`` (an ``mpirun`` argv) and maps its outcome onto every rank.

    With ``agents`` (the hosts' agents of a remote launch) and a launcher that names
    :mod:`poprun_py.hostside.rsh_shim` as Open MPI's remote agent, the daemons start through the
    agents (:mod:`poprun_py.agent.relay`); a host they lose is its ranks' root cause.
    """

    name = "mpirun"

    def __init__(self, agents: AgentPool | None = None):
        self.agents = agents

    def render_args(self, prep: Prepared) -> RenderArgs:
        """The daemons' start through the agents, the interface selection, root."""
        return mpirun_render_args(prep)

    def known_topologies(self, prep: Prepared) -> Mapping[str, Topology | None]:
        """This machine's topology when every host is this machine."""
        return local_topologies(prep) if prep.plan.cluster.all_local else {}

    def open(self, prep: Prepared, settings: RunSettings) -> Session:
        """Here: mpirun must be on PATH. Remote: one agent per host, which runs preflight,
        stages the job's files and starts Open MPI's daemons."""
        if prep.plan.cluster.all_local:
            return LocalSession(self, tools={"mpirun": MPIRUN_MISSING})
        tools = {"mpirun": MPIRUN_MISSING}
        return RemoteSession(
            prep, settings, MpirunBackend, stages=True, tools=tools, direct_only=MPI_BEHIND_JUMP
        )

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Write the job's files, run mpirun under supervision, report every rank."""
        return run_to_end(self, job, options)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> LauncherRun:
        """Write the job's files and start mpirun (its daemons through the agents, if any)."""
        hosts = prepare_launcher(job, job.launcher_env, "mpirun", MPIRUN_MISSING)
        output = Output(options, hosts, launcher="mpirun")
        report = FailureReport()

        def demux(child: Child, stream: str) -> Feed:
            return TagDemux(output, stream, report)

        with contextlib.ExitStack() as stack:
            relay = stack.enter_context(
                relayed(self.agents, job, options.grace_period, options.host_timeout)
            )
            env = {**job.launcher_env, **relay.environ}
            run = start_launcher(job, env, output, options.grace_period, demux, control)
            return LauncherRun(
                run,
                stack.pop_all(),
                lambda done: rank_results(done, hosts, report, relay.lost),
                relay=relay,
                ranks=hosts,
            )
        raise AssertionError("unreachable")  # pragma: no cover - ExitStack re-raises


@dataclass(frozen=True)
class _Outcome:
    state: InstanceState
    exit_code: int | None
    signal: int | None
    detail: str = ""
    ended: float | None = None


def rank_results(
    run: Supervised,
    hosts: dict[int, str],
    report: FailureReport,
    lost: Mapping[str, Lost] | None = None,
) -> LaunchResult:
    """Map mpirun's exit and failure report (and the hosts lost, if any) onto one
    InstanceResult per rank."""
    launcher = run.exits[0]
    code = launcher.returncode if launcher.returncode is not None else 1
    report.settle()
    lost = lost or {}
    outcomes = {
        rank: _lost_outcome(hosts[rank], lost) or _rank_outcome(rank, code, run, report)
        for rank in hosts
    }
    results = tuple(
        InstanceResult(
            index=rank,
            host=hosts[rank],
            exit_code=o.exit_code,
            signal=o.signal,
            state=o.state,
            started=launcher.started,
            ended=launcher.ended if o.ended is None else o.ended,
            detail=o.detail,
        )
        for rank, o in sorted(outcomes.items())
    )
    return LaunchResult(results, interrupted=run.interrupted, duration=run.duration)


def _lost_outcome(host: str, lost: Mapping[str, Lost]) -> _Outcome | None:
    """Lost with its host, or stopped by mpirun when another host was lost; None otherwise."""
    if host in lost:
        return _Outcome(InstanceState.LOST, None, None, lost[host].reason, lost[host].when)
    if lost:
        first = min(lost, key=lambda name: lost[name].when)
        return _Outcome(
            InstanceState.STOPPED, None, None, f"stopped by mpirun after host {first} was lost"
        )
    return None


def _rank_outcome(rank: int, code: int, run: Supervised, report: FailureReport) -> _Outcome:
    if run.interrupted:
        return _Outcome(InstanceState.STOPPED, None, None, "stopped with mpirun (interrupted)")
    if report.rank is not None:
        if rank == report.rank:
            return _Outcome(InstanceState.EXITED, report.exit_code, report.signal)
        return _Outcome(
            InstanceState.STOPPED, None, None, f"stopped by mpirun after rank {report.rank} failed"
        )
    if code == 0:
        return _Outcome(InstanceState.EXITED, 0, None)
    how, exit_code, sig = how_ended(code)
    detail = run.exits[0].detail or f"mpirun ended with {how} without naming a rank"
    return _Outcome(InstanceState.EXITED, exit_code, sig, detail)
