"""The provider interface: create nodes for a cluster spec, list them, wait for SSH, terminate.

A provider is a small object with five methods (see :class:`Provider`); the lifecycle in
:mod:`poprun_py.providers.lifecycle` drives it and owns everything shared (state file, setup
script, inventory). What a provider created is described by a :class:`ProvisionRecord`, which the
state file stores as JSON; terminating must also work without one (resources are found by name
or by tag), so a killed ``up`` never leaves anything behind.

Example:

    >>> from poprun_py.providers import get_provider
    >>> get_provider("static").cost_notice  # doctest: +ELLIPSIS
    <bound method StaticProvider.cost_notice of ...>
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from poprun_py.core.spec import SshOptions

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec
    from poprun_py.providers.records import Node, ProvisionRecord, Resource
    from poprun_py.providers.state import ClusterState


class Reporter(Protocol):
    """Progress of long steps; the CLI draws rich progress bars, tests pass a recorder."""

    def start(self, step: str, total: int) -> None:
        """A step of ``total`` units begins (e.g. "waiting for SSH", 4 nodes)."""

    def advance(self, step: str, amount: int = 1) -> None:
        """``amount`` more units of ``step`` are done."""

    def note(self, message: str) -> None:
        """One line of information (what was created, reused or skipped)."""


class NullReporter:
    """A Reporter that reports nothing."""

    def start(self, step: str, total: int) -> None:
        """Ignore."""

    def advance(self, step: str, amount: int = 1) -> None:
        """Ignore."""

    def note(self, message: str) -> None:
        """Ignore."""


@dataclass(frozen=True)
class ProvisionContext:
    """What a provider gets besides the spec: where state goes, whom to report progress to."""

    state: ClusterState
    reporter: Reporter = field(default_factory=NullReporter)
    wait_timeout: float | None = None  # None: the provider's own default
    accept_new_host_keys: bool = False  # static nodes: trust unknown host keys on first contact
    ssh: SshOptions = field(default_factory=SshOptions)  # up/down's SSH flags, before the record's


class Provider(Protocol):
    """Creates and removes the nodes of a cluster. Every method may raise ProvisionError."""

    name: str

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        """What ``up`` is about to spend, for a confirmation prompt; None when free."""

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        """Create (or find and reuse) every node; save the record after each step."""

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        """The nodes as they are now (states refreshed from the provider)."""

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        """Block until every node answers SSH; False if this provider skips SSH (test-only)."""

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        """Remove everything created for ``spec`` (found by name or tag when ``record`` is
        None or incomplete); return what was removed. Harmless when nothing exists."""
