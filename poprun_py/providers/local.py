"""The local provider: real hosts on this machine (network namespaces with sshd), via testhosts.

``up`` creates ``num_nodes`` hosts named ``<host_prefix>1..N`` (each its own address in
198.18.0.0/15, hostname and sshd) with :func:`poprun_py.providers.netns.create_cluster`, copies
their host keys into the cluster's ``known_hosts`` in the state directory (so later SSH checks keys
strictly, no ``--accept-new-host-keys``), and reuses a healthy cluster of the same shape on the
next ``up``; a half-created one (killed ``up``) is destroyed and made again. ``down`` destroys the
hosts by name, which also works without a state file. Needs root.

Example::

    name: pa
    provider: {kind: local, num_nodes: 2, host_prefix: pa}
    setup: |
      python3 --version

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.core.spec import ClusterSpec, ProviderSpec
    >>> local = ProviderSpec(kind="local", num_nodes=2, host_prefix="pa")
    >>> _shape(ClusterSpec(name="pa", hosts=(), provider=local))  # hosts pa1, pa2
    (2, 'pa')
"""

from __future__ import annotations

import contextlib
import pwd
import re
import shutil
from dataclasses import asdict, replace
from pathlib import Path

from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.errors import ProvisionError, UsageError
from poprun_py.providers.base import ProvisionContext
from poprun_py.providers.netns import DEFAULT_STATE_ROOT, TestCluster
from poprun_py.providers.records import Node, ProvisionRecord, Resource
from poprun_py.providers.state import write_private

WAIT_TIMEOUT = 30.0
DEFAULT_PREFIX = "h"
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
KIND = "testhosts-cluster"
HOST_USER = "root"
"""Who the test hosts let in (their sshd_config and ssh_config: ``User root``)."""


def _shape(spec: ClusterSpec) -> tuple[int, str]:
    """(number of hosts, host prefix) the spec asks for."""
    p = spec.provider or ProviderSpec(kind="local")
    count = p.num_nodes or len(spec.hosts)
    if count < 1:
        raise UsageError("local provider: set provider.num_nodes (or list hosts)")
    return count, p.host_prefix or DEFAULT_PREFIX


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or len(name) > 40:
        raise UsageError(
            f"local provider: cluster name {name!r} must be lowercase [a-z0-9-], at most 40 chars"
        )
    return name


class LocalProvider:
    """Test hosts on this machine; see the module docstring."""

    name = "local"

    def __init__(self, testhosts_root: Path = DEFAULT_STATE_ROOT):
        self._root = testhosts_root

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        """Local hosts cost nothing."""
        return None

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        """Create the hosts, or reuse a healthy cluster of the same shape."""
        from poprun_py.providers.netns import can_create_hosts

        name = _check_name(spec.name)
        count, prefix = _shape(spec)
        reason = can_create_hosts()
        if reason is not None:
            raise ProvisionError(f"local provider: {reason}")
        record = ProvisionRecord(
            cluster=spec.name,
            provider=self.name,
            resources=(Resource(KIND, name),),
            known_hosts=str(ctx.state.known_hosts_path),
            settings=asdict(spec.provider or ProviderSpec(kind="local")),
        )
        old = ctx.state.load()
        record = replace(record, setup_sha256=old.setup_sha256 if old else None)
        ctx.state.save(record)  # before anything exists: down finds it even if we die now
        cluster = self._reuse(name, count, prefix, ctx) or self._make(name, count, prefix, ctx)
        write_private(ctx.state.known_hosts_path, cluster.known_hosts.read_text())
        nodes = tuple(
            Node(
                h.name, h.address, HOST_USER, h.port, str(cluster.identity_file), h.netns, "running"
            )
            for h in cluster.hosts
        )
        record = replace(record, nodes=nodes, phase="created")
        ctx.state.save(record)
        return record

    def _reuse(
        self, name: str, count: int, prefix: str, ctx: ProvisionContext
    ) -> TestCluster | None:
        from poprun_py.providers.netns import (
            destroy_cluster,
            host_pids,
            list_clusters,
            load_cluster,
        )

        if name not in list_clusters(self._root):
            return None
        try:
            cluster = load_cluster(name, state_root=self._root)
        except ProvisionError:
            cluster = None
        if cluster is None or not all(host_pids(h.netns) for h in cluster.hosts):
            ctx.reporter.note(f"local cluster {name} is incomplete: destroying and recreating it")
            destroy_cluster(name, state_root=self._root)
            return None
        wanted = tuple(f"{prefix}{i}" for i in range(1, count + 1))
        if cluster.host_names != wanted:
            raise ProvisionError(
                f"local cluster {name} exists with hosts {', '.join(cluster.host_names)}; the spec "
                f"asks for {', '.join(wanted)}: run `poprun-py down` on it first"
            )
        ctx.reporter.note(f"reusing local cluster {name} ({count} hosts)")
        return cluster

    def _make(self, name: str, count: int, prefix: str, ctx: ProvisionContext) -> TestCluster:
        from poprun_py.providers.netns import create_cluster

        ctx.reporter.start("creating local hosts", count)
        cluster = create_cluster(name, count, state_root=self._root, host_prefix=prefix)
        ctx.reporter.advance("creating local hosts", count)
        ctx.reporter.note(f"created local cluster {name}: {', '.join(cluster.host_names)}")
        return cluster

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        """The recorded hosts; ``running`` while their namespace has processes, else ``gone``."""
        from poprun_py.providers.netns import host_pids

        return tuple(
            replace(n, state="running" if host_pids(n.resource_id) else "gone")
            for n in record.nodes
        )

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        """Check every host answers SSH, with host keys checked strictly."""
        from poprun_py.providers.reach import wait_for_record

        return wait_for_record(record, ctx, WAIT_TIMEOUT)

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        """Destroy the hosts (by name) and the setup directories they left in their login
        user's home (root's: the hosts share this machine's filesystem, and the caller's $HOME
        may be another's)."""
        from poprun_py.providers.netns import destroy_cluster, list_clusters
        from poprun_py.providers.setup import MARKER_ROOT

        name = _check_name(spec.name)
        removed: list[Resource] = []
        if name in list_clusters(self._root):
            ctx.reporter.start("destroying local hosts", 1)
            destroy_cluster(name, state_root=self._root)
            ctx.reporter.advance("destroying local hosts")
            removed.append(Resource(KIND, name))
        marker_root = Path(pwd.getpwnam(HOST_USER).pw_dir) / MARKER_ROOT
        setup_dir = marker_root / spec.name
        if setup_dir.exists():
            shutil.rmtree(setup_dir)
            removed.append(Resource("setup-dir", str(setup_dir)))
        for empty in (marker_root, marker_root.parent):  # as the remote clean-up does
            with contextlib.suppress(OSError):
                empty.rmdir()
        return tuple(removed)
