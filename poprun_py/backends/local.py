"""The local backend: every instance is a process on this machine (simulated hosts included).

Each rendered :class:`~poprun_py.render.job.InstanceCommand` is started as it is -- its argv
already carries the ``numactl`` binding prefix when the plan binds CPUs -- with
``os.environ`` plus the instance environment, and supervised by :mod:`poprun_py.process.supervise`.

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

import os
import shutil
from typing import TYPE_CHECKING

from poprun_py.backends.base import LaunchResult, RunOptions
from poprun_py.errors import BackendError
from poprun_py.process.supervise import Child, Output, supervise, write_job_files

if TYPE_CHECKING:
    from poprun_py.render.job import InstanceCommand, RenderedJob

NUMACTL_MISSING = "numactl not found on PATH; install numactl (Debian: numactl) or --no-numa-aware"


class LocalBackend:
    """Runs each instance as a local process group; stops all on the first failure."""

    name = "local"

    def run(self, job: RenderedJob, options: RunOptions) -> LaunchResult:
        """Write the job's files, start every instance, supervise them to the end."""
        check_numactl(job.instances)
        write_job_files(job)
        children = [Child(cmd.index, cmd.host, cmd.argv, cmd.env, cmd.cwd) for cmd in job.instances]
        output = Output(options, {cmd.index: cmd.host for cmd in job.instances})
        return supervise(children, output, grace_period=options.grace_period).launch_result()


def check_numactl(commands: tuple[InstanceCommand, ...]) -> None:
    """Raise BackendError when an instance is bound through numactl and numactl is missing."""
    for cmd in commands:
        if cmd.argv and os.path.basename(cmd.argv[0]) == "numactl":
            path = cmd.env.get("PATH") or os.environ.get("PATH")
            if shutil.which(cmd.argv[0], path=path) is None:
                raise BackendError(NUMACTL_MISSING)
            return
