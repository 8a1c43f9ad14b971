"""The one list of backends: each one's name, its class, and its :class:`Capabilities`, what
the rest of poprun-py may ask of a backend instead of its name.

Part of the core (it imports nothing of poprun-py but its errors), so that prepare, render,
jobs and cli read it without importing a backend, and without a circle.
:mod:`poprun_py.backends` creates backends from it; ``tests/unit/test_backend_capabilities.py``
fails when a module outside ``backends/`` compares a backend's name.

Example:

    >>> list(REGISTRY)
    ['local', 'ssh', 'mpirun', 'mpiexec', 'slurm', 'k8s']
    >>> capabilities("slurm").outlives_client, capabilities("nope") == Capabilities()
    (True, True)
    >>> capabilities("k8s").renders_manifest
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from poprun_py.errors import UnknownNameError


@dataclass(frozen=True)
class Capabilities:
    """What code outside ``backends/`` may ask of a backend, each named for its question."""

    runs_on_this_machine: bool = False
    """Does every instance run on this machine, whatever hosts the plan names (they are
    simulated)? Then the topology, interfaces, program and a free MASTER_PORT are this
    machine's, the job's files stay here, and a detached job's supervisor runs here."""
    outlives_client: bool = False
    """Does its job outlive the client by itself (a batch job in an allocation)? Then
    ``--detach`` does not apply."""
    launcher_template: str | None = None
    """The template of its whole-job launcher (None: it runs the instances' commands itself)."""
    resolves_host_names: bool = False
    """Does its launcher resolve every host name itself, here (mpirun, mpiexec)? Then preflight
    warns of a name that does not resolve on this machine, or slowly."""
    unforwardable: tuple[tuple[str, str], ...] = ()
    """The signals (``SIGHUP``) that ``--forward-signals`` may name but its launcher cannot pass
    on to the instances, each with why: refused before anything starts."""
    renders_manifest: bool = False
    """Is it rendered, never launched (Kubernetes: ``render`` writes a manifest that runs
    ``launch --per-node`` in every pod)? Then ``launch`` and ``check`` refuse it."""


@dataclass(frozen=True)
class Registered:
    """A registered backend: ``where`` its class is (``module:Class``), what it can do."""

    where: str
    capabilities: Capabilities


REGISTRY: dict[str, Registered] = {
    "local": Registered(
        "poprun_py.backends.local:LocalBackend", Capabilities(runs_on_this_machine=True)
    ),
    "ssh": Registered("poprun_py.backends.ssh:SshBackend", Capabilities()),
    "mpirun": Registered(
        "poprun_py.backends.mpirun:MpirunBackend",
        Capabilities(
            launcher_template="mpirun.j2",
            resolves_host_names=True,
            unforwardable=(("SIGHUP", "Open MPI's mpirun ends the job on SIGHUP"),),
        ),
    ),
    "mpiexec": Registered(
        "poprun_py.backends.mpiexec:MpiexecBackend",
        Capabilities(launcher_template="mpiexec.j2", resolves_host_names=True),
    ),
    "slurm": Registered(
        "poprun_py.backends.slurm:SlurmBackend",
        Capabilities(
            outlives_client=True,
            launcher_template="srun.j2",
            unforwardable=(("SIGHUP", "srun ends the job step on SIGHUP"),),
        ),
    ),
    "k8s": Registered("poprun_py.backends.k8s:K8sBackend", Capabilities(renders_manifest=True)),
}
"""Backend name -> its class and capabilities: the one list (tests may register a fake)."""


def capabilities(name: str | None) -> Capabilities:
    """What the backend called ``name`` can do; none of them for a name not registered (yet
    unchecked, or a fake's)."""
    entry = REGISTRY.get(name or "")
    return entry.capabilities if entry is not None else Capabilities()


def check_backend(name: str) -> str:
    """Return ``name`` if it is a known backend; raise UnknownNameError listing the valid ones."""
    if name not in REGISTRY:
        raise UnknownNameError("backend", name, list(REGISTRY))
    return name
