"""What the one-launcher backends (mpirun, srun) share: checks, job files, one supervised child.

Such a backend runs a single launcher process (``job.launcher``) on this machine that starts
every instance itself; its output is demultiplexed by a backend-specific Feed and its exit
mapped onto every instance.

Example::

    >>> how_ended(3), how_ended(-9), how_ended(0)
    (('code 3', 3, None), ('signal 9', None, 9), ('code 0', None, None))
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from poprun_py.errors import BackendError
from poprun_py.hostside.stackdump import dump_in_background, dump_ranks
from poprun_py.process.output import LAUNCHER_INDEX, Output, write_job_files
from poprun_py.process.supervise import Child, FeedFactory, Supervised, Supervision

log = logging.getLogger("poprun_py.backends")

if TYPE_CHECKING:
    from poprun_py.agent.relay import RankDumps, Relay
    from poprun_py.core.result import LaunchResult
    from poprun_py.process.signals import Control, DumpRequest
    from poprun_py.render.job import RenderedJob


def prepare_launcher(
    job: RenderedJob, env: Mapping[str, str], backend: str, missing: str
) -> dict[int, str]:
    """Check the launcher can run (``missing``: the error if it is not on PATH), write the
    job's files; return index -> host of every instance."""
    if not job.launcher:
        raise BackendError(f"the {backend} backend needs a rendered launcher command")
    if shutil.which(job.launcher[0], path=env.get("PATH")) is None:
        raise BackendError(missing)
    write_job_files(job)
    return {cmd.index: cmd.host for cmd in job.instances}


def start_launcher(  # noqa: PLR0917 - the launcher's job, environment and supervision
    job: RenderedJob,
    env: Mapping[str, str],
    output: Output,
    grace_period: float,
    feeds: FeedFactory,
    control: Control,
) -> Supervision:
    """Start ``job.launcher`` under supervision; signals go to it alone, not its group."""
    child = Child(LAUNCHER_INDEX, "localhost", job.launcher, env, None, signal_group=False)
    run = Supervision(output, grace_period, feeds, None, control)
    run.start([child])
    return run


class LauncherRun:
    """A running one-launcher job: waits for the launcher, then closes what surrounded it
    (``stack``: a relay, a step clean-up) and maps its outcome onto every instance. With
    ``relay`` (the MPI launchers' relay, or srun's
    :class:`~poprun_py.backends.slurm_stacks.StepStacks`; ``ranks`` are their instances) a hung
    job's ranks are dumped with py-spy, see :meth:`dump_stacks`."""

    def __init__(  # noqa: PLR0917 - the launcher's run, its surroundings and its hooks
        self,
        run: Supervision,
        stack: contextlib.ExitStack,
        results: Callable[[Supervised], LaunchResult],
        on_signal: Callable[[int], None] | None = None,
        relay: Relay | None = None,
        ranks: Collection[int] = (),
    ):
        self.run, self.stack, self.results = run, stack, results
        self.on_signal, self.relay, self.ranks = on_signal, relay, frozenset(ranks)
        self.dump_thread: threading.Thread | None = None  # py-spy runs here (a local launch)
        run.forward = self.signal  # the supervision loop passes forwarded signals on here
        run.dumper = self.dump_stacks

    def wait(self) -> LaunchResult:
        """Supervise the launcher to the end; every instance's outcome."""
        with self.stack:
            supervised = self.run.wait()
        if self.dump_thread is not None:
            self.dump_thread.join()  # bounded by py-spy's timeout
        return self.results(supervised)

    def signal(self, signum: int) -> None:
        """Pass ``signum`` on to every instance: by default to the launcher alone, which
        forwards it (Open MPI's mpirun forwards SIGUSR1/SIGUSR2 to its ranks, srun to its
        tasks); a backend whose launcher does not gives ``on_signal`` (the hook mpiexec uses)."""
        if self.on_signal is not None:
            self.on_signal(signum)
        else:
            self.run.signal(signum)

    def dump_stacks(self, request: DumpRequest) -> None:
        """A hung job's stacks. With ``relay``: ``py-spy dump`` of every rank, by each relayed
        daemon's agent (``dump-ranks``; srun: by one more step on the nodes,
        :mod:`poprun_py.backends.slurm_stacks`) or, without one, here in the launcher's process
        tree; then :meth:`ranks_dumped`. Otherwise (srun outside an allocation) the tasks are
        out of py-spy's reach: only SIGUSR1 through the launcher, as :meth:`ranks_dumped`
        decides."""
        if self.relay is None:
            self.ranks_dumped(request, {})
            return

        def done(found: RankDumps) -> None:
            self.run.post(lambda: self.ranks_dumped(request, found))  # on the loop: Output

        if not self.relay.dump_ranks(done):
            if self.dump_thread is not None:
                self.dump_thread.join()
            roots = dict(enumerate(self.run.live))
            self.dump_thread = dump_in_background(roots, done, dump_ranks)

    def ranks_dumped(self, request: DumpRequest, found: RankDumps) -> None:
        """Emit each rank's stacks as its stderr lines; SIGUSR1 through the launcher when some
        rank that registered faulthandler was not dumped and every one registered it (a rank
        without a handler would die of it); tell the Control."""
        for rank, lines in sorted(found.items()):
            for line in lines or ():
                self.run.output.emit(rank, "stderr", line)
        dumped = {rank for rank, lines in found.items() if lines}
        signalled = request.every and bool(request.faulthandler - dumped)
        if signalled:
            self.signal(signal.SIGUSR1)
        elif not request.every and (self.relay is None or self.ranks - dumped):
            missing = ",".join(map(str, sorted(self.ranks - dumped)))
            log.warning(
                "no stacks of %s: py-spy could not dump them (not installed, no ptrace rights, "
                "or out of its reach under this launcher) and not every instance imported "
                "poprun_py.dist (which registers faulthandler for SIGUSR1)",
                f"instances {missing}" if missing else "the instances",
            )
        self.run.control.dumped(signalled)


def how_ended(code: int) -> tuple[str, int | None, int | None]:
    """A launcher's return code as (``code N``/``signal N``, exit code if > 0, signal if any)."""
    how = f"signal {-code}" if code < 0 else f"code {code}"
    return how, code if code > 0 else None, -code if code < 0 else None
