"""The ``k8s`` backend: rendered, never launched. ``poprun-py render --backend k8s`` writes a
Kubernetes manifest (:mod:`poprun_py.render.k8s`) whose pods run ``poprun-py launch
--per-node`` each; ``kubectl apply -f`` starts it, and Kubernetes, not this client, runs it.
Its :class:`~poprun_py.core.backends.Capabilities` say ``renders_manifest``, so ``launch`` and
``check`` refuse it before anything starts, and :meth:`K8sBackend.open` refuses it too.

Example:

    >>> from poprun_py.backends import get_backend
    >>> backend = get_backend("k8s")
    >>> backend.capabilities.renders_manifest
    True
    >>> backend.open(None, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: k8s is rendered, not launched: poprun-py render --backend k8s ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from poprun_py.backends.base import Defaults
from poprun_py.errors import UsageError
from poprun_py.render.k8s import not_launched

if TYPE_CHECKING:
    from poprun_py.core.result import RunSettings
    from poprun_py.prepare.job import Prepared


class K8sBackend(Defaults):
    """A backend that only renders: its job is a manifest that Kubernetes runs."""

    name = "k8s"

    def open(self, prep: Prepared | None, settings: RunSettings | None) -> NoReturn:
        """Refuse: the job runs where ``kubectl apply -f`` puts it, not from here."""
        raise UsageError(not_launched(self.name))
