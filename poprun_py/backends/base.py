"""The backend lifecycle and the outcome types every backend returns.

The launcher drives every backend through the same verbs, and never asks for a backend's name:

1. :meth:`Backend.open` -- what the launch needs: nothing (local), one SSH connection and agent
   per host (ssh, remote mpirun), an allocation (slurm). Returns a :class:`Session`.
2. :meth:`Session.preflight` -- check every host (faults: PreflightError, exit 3, nothing
   started) and learn the topologies the plan may re-plan with; :meth:`Session.sync` and
   :meth:`Session.stage` push the program's directory and the job's files.
3. :meth:`Session.start` -- a :class:`Running` handle, started with a
   :class:`~poprun_py.process.signals.Control` that carries stop requests in and every
   instance's end out; :meth:`Running.wait` supervises to the end and returns a
   :class:`LaunchResult` that keeps every instance's outcome, root cause first.
4. :meth:`Session.close` -- nothing the launch started is left on any host.

A :class:`Runner` (``start`` only) is the part that runs a rendered job; backends may use one
directly (tests do, through :func:`run_to_end`).

Example:

    >>> from poprun_py.backends import get_backend
    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="localhost", program=("true",)), environ={})
    >>> backend = get_backend(prep.backend)
    >>> session = backend.open(prep, RunSettings())
    >>> checked = session.preflight(prep)
    >>> from poprun_py.launch.launcher import render, run_options
    >>> import shutil, tempfile
    >>> job_dir = tempfile.mkdtemp(prefix="poprun-py-doctest-")  # this user's, fresh
    >>> job = render(checked.prep, job_dir, checked.topologies, backend)
    >>> run_to_end(session.runner, job, run_options(checked.prep, RunSettings())).exit_code
    0
    >>> session.close(); shutil.rmtree(job_dir)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from poprun_py.core.backends import Capabilities, capabilities
from poprun_py.core.result import LaunchResult, RunOptions, RunSettings

if TYPE_CHECKING:
    from poprun_py.core.topology import Topology
    from poprun_py.prepare.job import Prepared
    from poprun_py.process.signals import Control, DumpRequest
    from poprun_py.render.job import RenderArgs, RenderedJob


@dataclass(frozen=True)
class Checked:
    """What preflight gives the launcher: the job re-planned with the topologies it found, and
    every host's real topology (None where unknown) for rendering the binding."""

    prep: Prepared
    topologies: Mapping[str, Topology | None]


class Running(Protocol):
    """A started job: :meth:`wait` supervises it to the end on the calling thread, honouring
    the stop requests of the :class:`~poprun_py.process.signals.Control` it was started with,
    and returns every instance's outcome. Nothing it started outlives ``wait``."""

    def wait(self) -> LaunchResult:
        """Supervise to the end; every instance's outcome."""
        ...

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every running instance on every host; the job goes on. Called by
        ``wait``'s own loop for each :meth:`~poprun_py.process.signals.Control.forward`
        request (SIGUSR1/SIGUSR2 to poprun-py)."""
        ...

    def dump_stacks(self, request: DumpRequest) -> None:
        """Dump every running instance's stacks into its output (``py-spy dump`` where it is
        installed on the instance's host, else SIGUSR1 to those in ``request.faulthandler``),
        then say :meth:`~poprun_py.process.signals.Control.dumped`. Called by ``wait``'s own
        loop for each :meth:`~poprun_py.process.signals.Control.dump` request (a hung job)."""
        ...


class Runner(Protocol):
    """What runs a rendered job: ``start`` returns once every instance was handed out."""

    name: str

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> Running:
        """Start ``job``; stop requests and every instance's end go through ``control``."""
        ...


class Session(Protocol):
    """One launch's hold on its hosts (see the module docstring for the order of calls)."""

    def preflight(self, prep: Prepared) -> Checked:
        """Check every host; PreflightError (exit 3) names every fault, nothing started."""
        ...

    def sync(self, paths: Sequence[str], timeout: float | None = None) -> None:
        """Push ``paths`` to every host at the same absolute path (a no-op on this machine);
        a host still being pushed to ``timeout`` seconds on fails it (PreflightError)."""
        ...

    def stage(self, job: RenderedJob) -> None:
        """Put the job's files where its instances will read them."""
        ...

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> Running:
        """Start the job (see :meth:`Runner.start`)."""
        ...

    def tidy(self, job_dir: str) -> None:
        """The job succeeded and its directory is not kept: remove the hosts' copies of it
        (this machine's goes with the launcher's own clean-up)."""
        ...

    def close(self) -> None:
        """Release the hosts: nothing of this launch is left running anywhere."""
        ...


class Backend(Protocol):
    """A registered backend (:data:`poprun_py.core.backends.REGISTRY`)."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """What the rest of poprun-py may ask of it instead of its name."""
        ...

    def render_args(self, prep: Prepared) -> RenderArgs:
        """What this backend adds to rendering (launcher options, interface, root)."""
        ...

    def known_topologies(self, prep: Prepared) -> Mapping[str, Topology | None]:
        """The hosts' topologies known without contacting them (for ``render``/``--dry-run``)."""
        ...

    def batch_script(
        self, prep: Prepared, launch_argv: Callable[[bool], Sequence[str]]
    ) -> str | None:
        """A script to submit instead of launching (slurm outside an allocation), or None;
        ``launch_argv(with_hosts)`` is this same launch again (with ``--hosts`` or not)."""
        ...

    def open(self, prep: Prepared, settings: RunSettings) -> Session:
        """Take hold of the hosts for one launch."""
        ...


class Defaults:
    """What most backends answer: the capabilities registered under its name, nothing added
    to rendering, no topology known in advance, no batch script."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """Those of :data:`~poprun_py.core.backends.REGISTRY` for its name."""
        return capabilities(self.name)

    def render_args(self, prep: Prepared) -> RenderArgs:
        """Nothing added."""
        from poprun_py.render.job import RenderArgs

        return RenderArgs()

    def known_topologies(self, prep: Prepared) -> Mapping[str, Topology | None]:
        """Nothing known before preflight."""
        return {}

    def batch_script(
        self, prep: Prepared, launch_argv: Callable[[bool], Sequence[str]]
    ) -> str | None:
        """No batch script."""
        return None


def run_to_end(runner: Runner, job: RenderedJob, options: RunOptions) -> LaunchResult:
    """Start ``job`` and wait for it, fail-fast, with SIGINT/SIGTERM/SIGHUP handled for this
    call: what a direct caller of a runner (tests, benchmarks) wants."""
    from poprun_py.process.signals import Control, handling_signals

    control = Control()
    try:
        with handling_signals(control):
            control.arm()
            return runner.start(job, options, control).wait()
    finally:
        control.close()
