"""Orchestration, once for every backend: open → preflight → (sync) → render → stage → start →
wait → close, with one signal path and one fail-fast policy.

The launcher never asks which backend it drives: the backend's session
(:class:`~poprun_py.backends.base.Session`) takes hold of the hosts (nothing, one SSH agent
per host, an allocation), preflight may re-plan with the topologies it discovers, and the
running handle reports every instance's end to a
:class:`~poprun_py.process.signals.Control` whose policy stops the rest on the first failure.
SIGINT, SIGTERM and SIGHUP reach that same Control (:func:`handling_signals`); before the job
runs they raise KeyboardInterrupt, and the session is closed either way.

Example:

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="localhost", program=("true",)), environ={})
    >>> result = launch(prep, RunSettings())
    >>> result.ok, [r.exit_code for r in result.instances]
    (True, [0])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from poprun_py.backends import get_backend
from poprun_py.backends.base import Backend, Checked
from poprun_py.backends.session import ssh_settings
from poprun_py.core.backends import capabilities
from poprun_py.core.plan import LaunchPlan
from poprun_py.core.result import LaunchResult, RunOptions, RunSettings
from poprun_py.core.topology import Topology
from poprun_py.hostside import private
from poprun_py.prepare.job import Prepared
from poprun_py.process.progress import Progress
from poprun_py.process.signals import Control, Policy, fail_fast, handling_signals
from poprun_py.process.takeover import warn_takeovers
from poprun_py.render.job import RenderedJob

__all__ = [
    "JOBS_ROOT",
    "RunSettings",
    "job_dir_for",
    "launch",
    "render",
    "run_options",
    "ssh_settings",
    "sync_root",
]


JOBS_ROOT = f"{private.job_root()}/jobs"
"""Where job directories go without ``--output-dir``: this user's job root, keyed on the uid
and checked before use (:mod:`poprun_py.hostside.private`), the same path on every host."""


def job_dir_for(plan: LaunchPlan, output_dir: str | None, backend: str = "") -> str:
    """Where a job's files (shard lists, hostfile) go: ``--output-dir`` or a fresh directory
    under the job root (the local backend's, whose files stay here: under
    ``$XDG_RUNTIME_DIR`` where there is one)."""
    if output_dir:
        return str(Path(output_dir).resolve())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    here = capabilities(backend).runs_on_this_machine
    root = private.runtime_root() if here else private.job_root()
    return f"{root}/jobs/{plan.cluster.name}-{stamp}-{os.getpid()}"


def render(
    prep: Prepared,
    job_dir: str,
    available: Mapping[str, Topology | None],
    backend: Backend | None = None,
    restart_count: int = 0,
) -> RenderedJob:
    """Render the prepared plan with what its backend adds (launcher options, interface);
    ``restart_count`` is the attempt every instance is told of."""
    from poprun_py.render.job import render_job

    args = (backend or get_backend(prep.backend)).render_args(prep)
    return render_job(
        prep.plan,
        prep.backend,
        job_dir=job_dir,
        templates_dir=prep.templates,
        available=available,
        mpi_args=args.mpi_args,
        mpi_subnet=args.mpi_subnet,
        as_root=args.as_root,
        mpi_network=args.mpi_network,
        restart_count=restart_count,
        forward_signals=[signal.Signals(s).name for s in prep.long_run.forward_signals],
    )


def render_for_show(prep: Prepared, output_dir: str | None) -> RenderedJob:
    """What ``render`` and ``--dry-run`` print: rendered with the topologies known without
    contacting any host."""
    backend = get_backend(prep.backend)
    job_dir = job_dir_for(prep.plan, output_dir, prep.backend)
    return render(prep, job_dir, backend.known_topologies(prep), backend)


def run_options(prep: Prepared, settings: RunSettings) -> RunOptions:
    """How the running job logs, shows output and stops."""
    return RunOptions(
        output_dir=Path(settings.output_dir) if settings.output_dir else None,
        only_output_from=settings.only_output_from,
        grace_period=prep.grace_period,
        sink=settings.sink,
        connect_timeout=prep.connect_timeout,
        host_timeout=prep.host_timeout,
        last_words=settings.last_words,
    )


def launch(
    prep: Prepared,
    settings: RunSettings,
    backend: Backend | None = None,
    policy: Policy = fail_fast,
    check: Callable[[Prepared], Mapping[str, str]] | None = None,
) -> LaunchResult:
    """Run the prepared job to the end (restarting it as ``prep.long_run`` allows) and return
    every instance's outcome; earlier attempts are in ``result.attempts``.

    ``backend`` defaults to the registered one named by the plan (tests inject a fake);
    ``policy`` decides what an instance's end means (default: the first failure stops all);
    ``check`` (``launch --check``: :func:`~poprun_py.launch.check.failing_hosts`) judges a
    spare before it replaces a lost host: the hosts that fail it, and why.
    """
    from poprun_py.launch.restarts import Attempts

    backend = backend or get_backend(prep.backend)
    control = Control(policy, prep.long_run.forward_signals)
    warn_takeovers(prep.plan.program, prep.long_run.forward_signals)
    used: list[str] = []  # the job directory, once chosen
    try:
        with handling_signals(control), contextlib.ExitStack() as sessions:

            def render_attempt(p: Prepared, job_dir: str, checked: Checked, k: int) -> RenderedJob:
                return render(p, job_dir, checked.topologies, backend, restart_count=k)

            def options(p: Prepared, k: int, progress: Progress) -> RunOptions:
                return replace(run_options(p, settings), attempt=k, progress=progress)

            def job_dir(p: Prepared) -> str:
                used.append(job_dir_for(p.plan, settings.output_dir, p.backend))
                return used[-1]

            def sync_paths(p: Prepared) -> list[str]:
                return [sync_root(p.plan)]

            attempts = Attempts(
                backend,
                settings,
                control,
                sessions,
                render_attempt,
                options,
                job_dir,
                sync_paths if settings.sync else None,
                check=check,
            )
            return _tidied(attempts.run(prep), used, settings)
    finally:
        control.close()


def _tidied(result: LaunchResult, used: list[str], settings: RunSettings) -> LaunchResult:
    """A successful job's directory is removed (unless ``--output-dir`` or ``--keep-job-dir``);
    the result names a directory left behind."""
    from poprun_py.process.output import remove_job_dir

    if not used:
        return result
    if result.ok and not settings.output_dir and not settings.keep_job_dir:
        remove_job_dir(used[-1])
        return result
    return replace(result, job_dir=used[-1])


def sync_root(plan: LaunchPlan) -> str:
    """What ``--sync`` pushes: the directory of the program's script (the first argument that is
    an existing file, e.g. ``train.py`` of ``python train.py --out /tmp``), else the working
    directory. Never a directory named only as an argument, nor its parent."""
    for candidate in plan.program:
        if os.path.isfile(candidate) and candidate != shutil.which(candidate):
            return str(Path(candidate).resolve().parent)
    return plan.workdir or os.getcwd()
