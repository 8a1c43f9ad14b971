"""The local backend: every instance is a process on this machine (simulated hosts included).

Each rendered :class:`~poprun_py.render.job.InstanceCommand` is started as it is, with
``os.environ`` plus the instance environment, bound to its CPUs and NUMA nodes when the plan
binds it (:attr:`InstanceCommand.binding`: the spawner sets the CPU affinity and memory policy
itself, :mod:`poprun_py.hostside.binding`; numactl is not needed), and supervised by
:mod:`poprun_py.process.supervise`. A command a user's template starts with ``numactl`` needs
numactl: if it is missing, that is a preflight fault (exit 3) and nothing starts.

Hosts are simulated: ``--backend local --hosts h1,h2`` runs "h1" and "h2" as local processes,
never on the machines of those names. Unless a cluster spec declares its hosts ``simulated:``
(``clusters/local-2.yaml``) or they are this machine's names, the plan's notes say so
(:func:`poprun_py.prepare.program.simulated_note`) and so does one warning on stderr when the
launch starts. Preflight checks the working directory and the program here before anything
starts (:func:`poprun_py.preflight.probes.check_here`).

Example:

    >>> from poprun_py.backends.base import RunOptions
    >>> from poprun_py.render.job import InstanceCommand, RenderedJob
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> import tempfile
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("true",)))
    >>> cmd = InstanceCommand(0, "h1", ("true",), {}, None, "", "")
    >>> job = RenderedJob("local", plan, tempfile.mkdtemp(), (cmd,))
    >>> LocalBackend().run(job, RunOptions()).exit_code
    0
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from poprun_py.backends.base import Defaults, run_to_end
from poprun_py.backends.session import LocalSession, check_numactl, local_topologies
from poprun_py.core.result import LaunchResult, RunOptions, RunSettings
from poprun_py.prepare.program import SIMULATED
from poprun_py.process.output import Output, write_job_files
from poprun_py.process.supervise import Child, Supervision

if TYPE_CHECKING:
    from collections.abc import Mapping

    from poprun_py.core.topology import Topology
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control, DumpRequest
    from poprun_py.render.job import InstanceCommand, RenderedJob

log = logging.getLogger(__name__)


class LocalBackend(Defaults):
    """Runs each instance as a local process group; stops all on the first failure."""

    name = "local"

    def known_topologies(self, prep: Prepared) -> Mapping[str, Topology | None]:
        """Every host's topology is this machine's."""
        return local_topologies(prep)

    def open(self, prep: Prepared, settings: RunSettings) -> LocalSession:
        """Nothing to take hold of: the instances run here (a warning when they simulate
        hosts named after other machines: the plan's note)."""
        for note in prep.plan.notes:
            if note.startswith(SIMULATED):
                log.warning("%s", note)
        return LocalSession(self)

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Write the job's files, start every instance, supervise them to the end."""
        return run_to_end(self, job, options)

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> LocalRun:
        """Write the job's files and start every instance."""
        check_numactl(job)
        write_job_files(job)
        children = [child(cmd) for cmd in job.instances]
        output = Output(options, {cmd.index: cmd.host for cmd in job.instances})
        run = Supervision(output, options.grace_period, None, None, control)
        run.start(children)
        return LocalRun(run)


class LocalRun:
    """The running local job: one supervision, one InstanceResult per child."""

    def __init__(self, run: Supervision):
        self.run = run

    def wait(self) -> LaunchResult:
        """Supervise every instance to the end."""
        return self.run.wait().launch_result()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every running instance's process group."""
        self.run.signal(signum)

    def dump_stacks(self, request: DumpRequest) -> None:
        """py-spy dumps of every running instance, else SIGUSR1 (see the Supervision)."""
        self.run.dump_stacks(request)


def child(cmd: InstanceCommand) -> Child:
    """The process to start for ``cmd``, with its binding."""
    bind = cmd.binding
    cpus, mems = (bind.cpu_ids, bind.node_ids) if bind is not None else ((), ())
    return Child(cmd.index, cmd.host, cmd.argv, cmd.env, cmd.cwd, cpus=cpus, mems=mems)
