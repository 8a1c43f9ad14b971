"""The backend registry: :data:`~poprun_py.core.backends.REGISTRY` names every backend, its
class and its capabilities once; :data:`BACKENDS` creates them, importing each lazily.

Adding a backend: write one module under ``backends/`` with a class that satisfies
:class:`~poprun_py.backends.base.Backend` (``open`` a session on the hosts -- usually
:class:`~poprun_py.backends.session.LocalSession` or
:class:`~poprun_py.backends.session.RemoteSession` around a runner -- plus ``render_args``,
``known_topologies`` and ``batch_script``, whose defaults come from
:class:`~poprun_py.backends.base.Defaults`), a template ``render/templates/<name>.j2`` when it
has a launcher command, and one entry in :data:`~poprun_py.core.backends.REGISTRY` with its
:class:`~poprun_py.core.backends.Capabilities` (what prepare, render, jobs and cli ask of it:
never its name).

Example:

    >>> sorted(BACKENDS)
    ['k8s', 'local', 'mpiexec', 'mpirun', 'slurm', 'ssh']
    >>> get_backend("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    poprun_py.errors.UnknownNameError: unknown backend 'nope'; choose one of: k8s, local, ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from poprun_py.core.backends import REGISTRY, check_backend

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend


def _create(name: str) -> Backend:
    module, _, cls = REGISTRY[name].where.partition(":")
    # __import__, not importlib.import_module: ``python -X importtime`` sees only the former
    return cast("Backend", getattr(__import__(module, fromlist=[cls]), cls)())


BACKENDS: dict[str, Callable[[], Backend]] = {
    name: functools.partial(_create, name) for name in REGISTRY
}
"""Backend name -> a factory (tests may put a fake's in the place of one)."""


def get_backend(name: str) -> Backend:
    """Create the backend called ``name``."""
    return BACKENDS[check_backend(name)]()
