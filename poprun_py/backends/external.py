"""What the one-launcher backends (mpirun, srun) share: checks, job files, one supervised child.

Such a backend runs a single launcher process (``job.launcher``) on this machine that starts
every instance itself; its output is demultiplexed by a backend-specific Feed and its exit
mapped onto every instance.

Example::

    >>> how_ended(3), how_ended(-9), how_ended(0)
    (('code 3', 3, None), ('signal 9', None, 9), ('code 0', None, None))
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from poprun_py.errors import BackendError
from poprun_py.process.supervise import (
    LAUNCHER_INDEX,
    Child,
    FeedFactory,
    Output,
    Supervised,
    supervise,
    write_job_files,
)

if TYPE_CHECKING:
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


def supervise_launcher(
    job: RenderedJob,
    env: Mapping[str, str],
    output: Output,
    grace_period: float,
    feeds: FeedFactory,
) -> Supervised:
    """Run ``job.launcher`` to the end under supervision; signals go to it alone, not its group."""
    child = Child(LAUNCHER_INDEX, "localhost", job.launcher, env, None, signal_group=False)
    return supervise([child], output, grace_period=grace_period, feeds=feeds)


def how_ended(code: int) -> tuple[str, int | None, int | None]:
    """A launcher's return code as (``code N``/``signal N``, exit code if > 0, signal if any)."""
    how = f"signal {-code}" if code < 0 else f"code {code}"
    return how, code if code > 0 else None, -code if code < 0 else None
