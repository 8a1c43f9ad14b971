"""The backend registry: an explicit map from name to factory, imported lazily.

Example:

    >>> sorted(BACKENDS)
    ['local', 'mpirun', 'slurm', 'ssh']
    >>> get_backend("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    poprun_py.errors.UnknownNameError: unknown backend 'nope'; choose one of: local, mpirun, ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poprun_py.errors import UnknownNameError

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend


@dataclass(frozen=True)
class BackendContext:
    """What a backend may need beyond the rendered job: SSH connections (a
    ``transport.ConnectionPool`` already opened by preflight) for the remote backends, and the
    environment of a Slurm allocation for the slurm backend."""

    pool: Any = None
    environ: Mapping[str, str] | None = None


def _local(ctx: BackendContext) -> Backend:
    from poprun_py.backends.local import LocalBackend

    return LocalBackend()


def _mpirun(ctx: BackendContext) -> Backend:
    from poprun_py.backends.mpirun import MpirunBackend

    return MpirunBackend(ctx.pool)


def _ssh(ctx: BackendContext) -> Backend:
    from poprun_py.backends.ssh import SshBackend

    return SshBackend(ctx.pool)  # type: ignore[no-any-return,unused-ignore]


def _slurm(ctx: BackendContext) -> Backend:
    from poprun_py.backends.slurm import SlurmBackend

    return SlurmBackend(ctx.environ)


BACKENDS: dict[str, Callable[[BackendContext], Backend]] = {
    "local": _local,
    "ssh": _ssh,
    "mpirun": _mpirun,
    "slurm": _slurm,
}


def check_backend(name: str) -> str:
    """Return ``name`` if it is a known backend; raise UnknownNameError listing the valid ones."""
    if name not in BACKENDS:
        raise UnknownNameError("backend", name, list(BACKENDS))
    return name


def get_backend(name: str, ctx: BackendContext | None = None) -> Backend:
    """Create the backend called ``name``."""
    return BACKENDS[check_backend(name)](ctx or BackendContext())
