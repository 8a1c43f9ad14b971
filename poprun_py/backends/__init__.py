"""The backend registry: an explicit map from name to factory, imported lazily.

Adding a backend: write one module under ``backends/`` with a class that satisfies
:class:`~poprun_py.backends.base.Backend` (``open`` a session on the hosts -- usually
:class:`~poprun_py.backends.session.LocalSession` or
:class:`~poprun_py.backends.session.RemoteSession` around a runner -- plus ``render_args``,
``known_topologies`` and ``batch_script``, whose defaults come from
:class:`~poprun_py.backends.base.Defaults`), a template ``render/templates/<name>.j2`` when it
has a launcher command, and one line in :data:`BACKENDS`.

Example:

    >>> sorted(BACKENDS)
    ['local', 'mpiexec', 'mpirun', 'slurm', 'ssh']
    >>> get_backend("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    poprun_py.errors.UnknownNameError: unknown backend 'nope'; choose one of: local, mpiexec, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from poprun_py.errors import UnknownNameError

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend


def _local() -> Backend:
    from poprun_py.backends.local import LocalBackend

    return LocalBackend()


def _ssh() -> Backend:
    from poprun_py.backends.ssh import SshBackend

    return SshBackend()


def _mpirun() -> Backend:
    from poprun_py.backends.mpirun import MpirunBackend

    return MpirunBackend()


def _mpiexec() -> Backend:
    from poprun_py.backends.mpiexec import MpiexecBackend

    return MpiexecBackend()


def _slurm() -> Backend:
    from poprun_py.backends.slurm import SlurmBackend

    return SlurmBackend()


BACKENDS: dict[str, Callable[[], Backend]] = {
    "local": _local,
    "ssh": _ssh,
    "mpirun": _mpirun,
    "mpiexec": _mpiexec,
    "slurm": _slurm,
}


def check_backend(name: str) -> str:
    """Return ``name`` if it is a known backend; raise UnknownNameError listing the valid ones."""
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, list(BACKENDS))
    return name


def get_backend(name: str) -> Backend:
    """Create the backend called ``name``."""
    return BACKENDS[check_backend(name)]()
