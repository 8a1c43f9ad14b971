"""The mpiexec backend: MPICH's hydra (``mpiexec.hydra``) runs the rendered command.

``mpiexec.j2`` tags every output line ``[RANK]<poprun>:`` (``-prepend-pattern``; hydra tags
each chunk a rank writes, so :class:`HydraDemux` rejoins pieces of a line as the mpirun backend's
:class:`~poprun_py.backends.mpirun.TagDemux` does) and runs each rank under a one-line
``/bin/sh`` that writes ``poprun-py: rank exited with code N`` on its stderr when it fails.
Hydra 4.0 neither names the rank that failed (its "EXIT CODE" is often a rank it killed) nor,
across hosts, stops the other hosts' ranks (it waits for them); so the first such line is the
root cause, and poprun-py stops every host's proxy and ranks through their agents.

On remote hosts hydra starts its proxies (``hydra_pmi_proxy``) through poprun-py's per-host
agents, as Open MPI's daemons do (:mod:`poprun_py.agent.relay`): ``-launcher ssh
-launcher-exec PATH`` (:func:`poprun_py.hostside.rsh_shim.launcher_exec`: hydra takes one
executable path), and ``-localhost ADDRESS``, this machine's address towards the hosts, where
the proxies connect back (hydra's default, this machine's host name, may not resolve there).
The user's own ``-launcher``/``-bootstrap``/``-localhost``/``-iface`` (or ``HYDRA_*``) win.

Signals: hydra passes SIGUSR1 on to its ranks but dies of SIGUSR2, so poprun-py
passes every forwarded signal (``--forward-signals``) past it (:func:`to_ranks`): each rank's
wrapper leads a session of its own and traps them all, and its process group is signalled --
from the launcher's process tree here, and by each host's agent (``sigr N``) for the proxies
relayed there. When hydra starts its proxies itself (the user's own launcher), SIGUSR1 goes
through hydra and any other signal is dropped with a warning.

Example:

    >>> args = mpiexec_args(("-verbose",), local_address="198.18.0.1", environ={})
    >>> args[:4], args[4] == exec_script_path(), args[5:]
    (('-verbose', '-launcher', 'ssh', '-launcher-exec'), True, ('-localhost', '198.18.0.1'))
    >>> mpiexec_args(("-launcher", "fork"), local_address=None, environ={})
    ('-launcher', 'fork')
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from poprun_py.agent.relay import Relay, relayed
from poprun_py.backends.base import Defaults, Session, run_to_end
from poprun_py.backends.external import LauncherRun, prepare_launcher, start_launcher
from poprun_py.backends.mpi import source_address
from poprun_py.backends.mpirun import FailureReport, TagDemux, rank_results
from poprun_py.backends.session import (
    MPI_BEHIND_JUMP,
    LocalSession,
    RemoteSession,
    local_topologies,
)
from poprun_py.core.result import LaunchResult, RunOptions, RunSettings
from poprun_py.errors import Fault, PreflightError
from poprun_py.hostside.rsh_shim import exec_script_path, launcher_exec
from poprun_py.hostside.stackdump import signal_ranks
from poprun_py.process.output import LAUNCHER_INDEX, Output
from poprun_py.process.supervise import Child, Feed, Supervision

if TYPE_CHECKING:
    from poprun_py.agent.client import AgentPool
    from poprun_py.core.topology import Topology
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control
    from poprun_py.render.job import RenderArgs, RenderedJob

log = logging.getLogger(__name__)

HYDRA = "mpiexec.hydra"
MPIEXEC_MISSING = "mpiexec.hydra not found on PATH; install MPICH (Debian: mpich)"
LAUNCHER_OPTIONS = ("-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec", "-rsh", "-ssh")
ADDRESS_OPTIONS = ("-localhost", "-iface")


def mpiexec_args(
    user_args: Sequence[str],
    *,
    local_address: str | None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """The user's mpiexec options plus, for a remote launch, the proxies' start through the
    agents and the address they connect back to; the user's own choices win."""
    env = os.environ if environ is None else environ
    extra: list[str] = []
    if not own_launcher(user_args, env):
        extra += ["-launcher", "ssh", "-launcher-exec", exec_script_path()]
    if local_address and not any(a in ADDRESS_OPTIONS for a in user_args):
        extra += ["-localhost", local_address]
    return (*user_args, *extra)


def own_launcher(args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the user chose how hydra starts its proxies (an option or ``HYDRA_*``)."""
    if any(a in LAUNCHER_OPTIONS for a in args):
        return True
    return any(k.startswith(("HYDRA_LAUNCHER", "HYDRA_BOOTSTRAP")) for k in environ)


class HydraReport(FailureReport):
    """The first rank that reported its own non-zero exit (the wrapper's stderr line)."""

    def rank_line(self, rank: int, line: str) -> bool:
        """Look at one of a rank's stderr lines; True when it is that rank's failure report."""
        if not super().rank_line(rank, line):
            return False
        self.settle()  # the first report is the root cause at once (hydra names none)
        return True

    def scan(self, line: str) -> None:
        """Hydra's own lines name no rank reliably: nothing to learn from them."""


class HydraDemux(TagDemux):
    """Per-rank lines from hydra's ``[RANK]<poprun>:`` tags; a rank's failure report stops the
    launch: every host's proxy and ranks through the relay, and hydra itself through the
    supervision (SIGTERM, SIGKILL after the grace period): hydra waits forever for a proxy that
    was stopped before it connected back."""

    TAG = re.compile(rb"\[(\d+)\]<poprun>:")
    PARTIAL_TAG = re.compile(rb"\[\d*(?:\](?:<[a-z]*>?)?)?\Z")

    def __init__(
        self, output: Output, stream: str, report: HydraReport, relay: Relay, control: Control
    ):
        super().__init__(output, stream, report)
        self._hydra_report, self._relay, self._control = report, relay, control

    def _emit(self, owner: tuple[int, str], text: bytes) -> None:
        rank, stream = owner
        if rank != LAUNCHER_INDEX and stream == "stderr":
            first = self._hydra_report.rank is None
            if self._hydra_report.rank_line(rank, text.decode("utf-8", "replace")):
                if first:
                    self._relay.stop_daemons()
                    self._control.stop(f"instance {rank} failed")
                return  # poprun-py reports it as the root cause
        super()._emit(owner, text)


def mpiexec_render_args(prep: Prepared) -> RenderArgs:
    """Hydra's render arguments: the user's options, plus for a remote launch the proxies'
    start through the agents and ``-localhost`` (this machine's address towards the first
    host, as :func:`~poprun_py.backends.mpi.mpi_subnet` finds it). MPICH needs no flag as root."""
    from poprun_py.render.job import RenderArgs

    if prep.plan.cluster.all_local:
        return RenderArgs(mpi_args=(*prep.mpi_args, *iface_args(prep)))
    here = source_address(prep.plan.hosts[0].spec.target)
    address = str(here) if here is not None else None
    args = mpiexec_args(prep.mpi_args, local_address=address)
    return RenderArgs(mpi_args=(*args, *iface_args(prep)))


def iface_args(prep: Prepared) -> tuple[str, ...]:
    """``-iface NAME`` for ``--network`` when every host's interface in it has the same name
    (hydra takes one name for all hosts; the ranks' UCX_NET_DEVICES name each host's own)."""
    names = {name for name, _ in prep.plan.interfaces.values()}
    if len(names) != 1 or any(a in ADDRESS_OPTIONS for a in prep.mpi_args):
        return ()
    return ("-iface", names.pop())


class MpiexecBackend(Defaults):
    """Runs ``job.launcher`` (an ``mpiexec.hydra`` argv) and maps its outcome onto every rank;
    with ``agents`` and a launcher naming the shim, hydra's proxies start through them."""

    name = "mpiexec"

    def __init__(self, agents: AgentPool | None = None):
        self.agents = agents

    def render_args(self, prep: Prepared) -> RenderArgs:
        """The proxies' start through the agents and the address they connect back to."""
        return mpiexec_render_args(prep)

    def known_topologies(self, prep: Prepared) -> Mapping[str, Topology | None]:
        """This machine's topology when every host is this machine."""
        return local_topologies(prep) if prep.plan.cluster.all_local else {}

    def open(self, prep: Prepared, settings: RunSettings) -> Session:
        """Hydra must be on PATH here (a preflight fault, exit 3, before any host is asked).
        Remote: one agent per host, which runs preflight, stages the job's files and starts
        hydra's proxy."""
        tools = {HYDRA: MPIEXEC_MISSING}
        if prep.plan.cluster.all_local:
            return LocalSession(self, tools=tools)
        return RemoteSession(
            prep, settings, MpiexecBackend, stages=True, tools=tools, direct_only=MPI_BEHIND_JUMP
        )

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Write the job's files, run hydra under supervision, report every rank."""
        return run_to_end(self, job, options)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> LauncherRun:
        """Write the job's files and start hydra (its proxies through the agents, if any)."""
        env = job.launcher_env
        if job.launcher:
            check_hydra(job.launcher[0], env.get("PATH"))
        hosts = prepare_launcher(job, env, "mpiexec", MPIEXEC_MISSING)
        if "-launcher-exec" in job.launcher and exec_script_path() in job.launcher:
            launcher_exec()
        output = Output(options, hosts, launcher="mpiexec")
        report = HydraReport()
        with contextlib.ExitStack() as stack:
            relay = stack.enter_context(
                relayed(self.agents, job, options.grace_period, options.host_timeout)
            )

            def demux(child: Child, stream: str) -> Feed:
                return HydraDemux(output, stream, report, relay, control)

            run = start_launcher(
                job, {**env, **relay.environ}, output, options.grace_period, demux, control
            )
            return LauncherRun(
                run,
                stack.pop_all(),
                lambda done: rank_results(done, hosts, report, relay.lost),
                functools.partial(to_ranks, run, relay, in_reach(job, relay, env)),
                relay=relay,
                ranks=hosts,
            )
        raise AssertionError("unreachable")  # pragma: no cover - ExitStack re-raises


def in_reach(job: RenderedJob, relay: Relay, environ: Mapping[str, str]) -> bool:
    """Whether poprun-py reaches every rank's wrapper itself: the remote proxies start through
    the agents, or every host is this machine and hydra forks its proxy (no launcher of the
    user's: ``-launcher ssh`` to localhost would put it out of the launcher's tree)."""
    if relay.relays:
        return True
    return job.plan.cluster.all_local and not own_launcher(job.launcher, {**os.environ, **environ})


def to_ranks(run: Supervision, relay: Relay, in_reach: bool, signum: int) -> None:
    """A forwarded signal (SIGUSR1, SIGUSR2, SIGHUP) to every rank, past hydra (which dies of
    SIGUSR2): the ranks under this machine's proxies from here, the others by their hosts'
    agents; each rank's wrapper survives it (``mpiexec.j2``). Out of reach (:func:`in_reach`:
    hydra starts the proxies itself, with the user's own ``-launcher``/``-bootstrap``), SIGUSR1
    goes through hydra, which passes it on, and any other is dropped with a warning."""
    if in_reach:
        signal_ranks(list(run.live), signum)
        relay.signal_ranks(signum)
    elif signum == signal.SIGUSR1:
        run.signal(signum)
    else:
        log.warning(
            "mpiexec with its own launcher cannot pass signal %d on to the ranks (hydra"
            " would die of it): not forwarded",
            signum,
        )


def check_hydra(name: str, path: str | None = None) -> None:
    """PreflightError (exit 3, one line, nothing started) when ``name`` is not on PATH."""
    if shutil.which(name, path=path) is None:
        raise PreflightError([Fault("localhost", name, MPIEXEC_MISSING)])
