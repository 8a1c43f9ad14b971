"""A hung srun step's stacks, for ``--hang-timeout``: srun's tasks run under slurmstepd on the
nodes, out of this machine's process tree, so one more step of the same allocation goes to
every node of the job (``srun --overlap --jobid=JOB``, one task a node) and runs
:mod:`poprun_py.hostside.step_dump` there with ``python3 -S`` (standard library only), shipped
as every host-side program is (:mod:`poprun_py.hostside.bundle`: in the variable
:data:`PROGRAM_VAR`, which srun passes on, started by the one bootstrap). On each node it
``py-spy dump``s, in parallel and bounded, every Python process whose
environment has the job's ``SLURM_JOB_ID`` and the step's ``SLURM_STEP_ID`` (found with
``squeue --steps`` by the step's name), and writes ``s RANK LINE`` / ``w RANK py-spy|none``
records, each under the task's rank (``SLURM_PROCID``). :class:`StepStacks` hands them to the
launcher's run (:class:`~poprun_py.backends.external.LauncherRun`) like a relay's: they become
each rank's stderr lines, and SIGUSR1 goes through srun for the ranks not dumped.

The whole dump is bounded by :data:`STEP_BUDGET` (under the clocks' 1.5 s); an srun still
running then is terminated, and the slurm backend's clean-up cancels any step so named.

Example:

    >>> stacks_argv("42", "7", ["n1", "n2"], "poprun-j", 0.75)[:8]  # doctest: +NORMALIZE_WHITESPACE
    ['srun', '--overlap', '--jobid=42', '--job-name=poprun-j-stacks', '--nodelist=n1,n2',
     '--nodes=2', '--ntasks=2', '--ntasks-per-node=1']
    >>> found([b"s 1 Thread 7 (idle)", b"w 1 py-spy", b"w 0 none", b"srun: warning"])
    {1: [b'Thread 7 (idle)'], 0: None}
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from poprun_py.agent.relay import RankDumps, Relay
from poprun_py.backends.slurm_alloc import CLIENT_TIMEOUT, client, named_ids
from poprun_py.errors import BackendError
from poprun_py.hostside import protocol as P
from poprun_py.hostside.bundle import from_env, payload

log = logging.getLogger(__name__)

STACKS_SUFFIX = "-stacks"
"""The dump step's name is the job step's name with this suffix."""
STEP_BUDGET = 1.3
"""Seconds from the request to the dump step's end (the clocks wait 1.5 s at most)."""
PYSPY_BUDGET = 0.75
"""Seconds for each ``py-spy dump`` on the nodes (they run in parallel)."""
PYTHON = "python3"
"""The interpreter the dump step runs on the nodes (on the PATH srun passes on)."""
PROGRAM = "step_dump"
"""The dump step's program (:mod:`poprun_py.hostside.step_dump`)."""
PROGRAM_VAR = "POPRUN_PY_STEP_DUMP"
"""The variable the dump step's program ships in (never in an argv)."""


def stacks_argv(
    job_id: str, step_id: str, nodes: Sequence[str], name: str, timeout: float
) -> list[str]:
    """The srun argv of the dump step: one task on each of ``nodes`` in job ``job_id``,
    dumping step ``step_id``'s tasks with py-spy (each dump killed after ``timeout`` s)."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--job-name={name}{STACKS_SUFFIX}",
        f"--nodelist={','.join(nodes)}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        "--quiet",
        *from_env(PYTHON, PROGRAM_VAR, job_id, step_id, f"{timeout:g}", flags=("-S",)),
    ]


def step_id(job_id: str, names: Iterable[str], environ: Mapping[str, str]) -> str | None:
    """The id (within job ``job_id``) of the newest running step called one of ``names``."""
    listing = client(
        ["squeue", "-h", "--steps", f"--jobs={job_id}", "-o", "%i %j"], environ, CLIENT_TIMEOUT
    )
    steps = [i.partition(".")[2] for i in named_ids(listing, names) if i.startswith(f"{job_id}.")]
    numbers = [s for s in steps if s.isdigit()]
    return max(numbers, key=int) if numbers else None


def found(lines: Iterable[bytes]) -> RankDumps:
    """The ranks' stacks from the dump step's records (other lines are ignored)."""
    dumps: RankDumps = {}
    for line in lines:
        kind, rank, text = P.parse(line)
        if rank < 0:
            continue
        if kind == P.RANK_STACK:
            dumps[rank] = [*(dumps.get(rank) or []), text]
        elif kind == P.RANK_DUMPED:
            dumps.setdefault(rank, None)
    return dumps


def run_step(argv: Sequence[str], environ: Mapping[str, str], timeout: float) -> list[bytes]:
    """Run the dump step for at most ``timeout`` s (then srun is terminated, which cancels
    the step, and killed if it lingers); its stdout lines."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(environ),
    )
    try:
        out, err = proc.communicate(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        log.warning("the stack dump step did not end within %.1f s: stopped", timeout)
    if proc.returncode != 0 and err.strip():
        log.warning("the stack dump step: %s", err.decode("utf-8", "replace").strip())
    return out.split(b"\n")


class StepStacks(Relay):
    """The dumps of a running srun step's tasks, asked for as a relay's (``dump_ranks``)."""

    def __init__(
        self, job_id: str, nodes: Sequence[str], names: Sequence[str], environ: Mapping[str, str]
    ):
        super().__init__()
        self.job_id, self.nodes, self.names = job_id, list(nodes), tuple(names)
        self.step_environ = {**os.environ, **environ}
        self.thread: threading.Thread | None = None

    def dump_ranks(self, done: Callable[[RankDumps], None]) -> bool:
        """Run the dump step on a thread; ``done`` hears what it found (``{}`` on failure)."""
        self.close()
        self.thread = threading.Thread(target=lambda: done(self.dump()), daemon=True)
        self.thread.start()
        return True

    def dump(self) -> RankDumps:
        """Find the step, run the dump step on every node, return every rank's stacks."""
        deadline = time.monotonic() + STEP_BUDGET
        try:
            step = step_id(self.job_id, self.names, self.step_environ)
        except BackendError as exc:
            log.warning("no stack dump of the step: %s", exc)
            return {}
        if step is None:
            return {}
        name = next(iter(self.names), "poprun")
        argv = stacks_argv(self.job_id, step, self.nodes, name, PYSPY_BUDGET)
        environ = {**self.step_environ, PROGRAM_VAR: payload(PROGRAM).text}
        return found(run_step(argv, environ, deadline - time.monotonic()))

    def close(self) -> None:
        """Wait for a dump under way (bounded by :data:`STEP_BUDGET` and srun's end)."""
        if self.thread is not None:
            self.thread.join()
