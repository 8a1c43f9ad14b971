"""The program of a Slurm step's stack dump, for ``--hang-timeout``: srun runs it on every node
of the job (:mod:`poprun_py.backends.slurm_stacks`, bundled with :mod:`.stackdump`, started
by the one bootstrap from a named variable), ``STEP_DUMP JOB STEP TIMEOUT``. It dumps every
Python process whose environment has the job's ``SLURM_JOB_ID`` and the step's
``SLURM_STEP_ID`` (:func:`dump_step`), each under its rank, and writes what it found
(:func:`report_step`).

Example:

    >>> import io
    >>> dump_step("no-such-job", "0", None)
    {}
    >>> out = io.BytesIO(); report_step(["no-such-job", "0", "0.5"], out); out.getvalue()
    b''
"""

from __future__ import annotations

import os
import sys

from poprun_py.hostside.stackdump import (  # bundled with it
    PYSPY_TIMEOUT,
    by_rank,
    environ_of,
    find_pyspy,
    is_python,
    rank_of,
)

TYPE_CHECKING = False  # not typing's: nothing but the standard library's start
if TYPE_CHECKING:
    from typing import BinaryIO

SLURM_RANK_VARS = ("SLURM_PROCID", "RANK")
"""Where a Slurm task's rank is: Slurm's, then poprun-py's."""


def dump_step(
    job_id: str, step_id: str, pyspy: str | None, timeout: float = PYSPY_TIMEOUT
) -> dict[int, list[bytes] | None]:
    """The Python stacks of a Slurm step's tasks on this node: every Python process whose
    environment has ``SLURM_JOB_ID`` ``job_id`` and ``SLURM_STEP_ID`` ``step_id``, filed under
    its rank (:data:`SLURM_RANK_VARS`): ``rank -> lines`` (None: found, not dumped)."""
    jobs = []
    for pid in (int(name) for name in os.listdir("/proc") if name.isdigit()):
        env = environ_of(pid) if is_python(pid) else {}
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_STEP_ID") == step_id:
            rank = rank_of(pid, env, SLURM_RANK_VARS)
            if rank is not None:
                jobs.append((rank, pid))
    return by_rank(jobs, pyspy, timeout)


def report_step(argv: list[str], out: BinaryIO) -> None:
    """What the dump writes (``argv``: JOB STEP TIMEOUT): for each rank of step JOB.STEP on
    this node, ``s RANK LINE`` for every line of its stacks and ``w RANK py-spy`` (dumped) or
    ``w RANK none`` -- the agent's ``dump-ranks`` records (:mod:`poprun_py.hostside.protocol`)."""
    found = dump_step(argv[0], argv[1], find_pyspy(), float(argv[2]))
    for rank, lines in sorted(found.items()):
        for line in lines or ():
            out.write(b"s %d %s\n" % (rank, line))
        out.write(b"w %d %s\n" % (rank, b"none" if lines is None else b"py-spy"))
    out.flush()


if __name__ == "__main__":
    report_step(sys.argv[1:], sys.stdout.buffer)
