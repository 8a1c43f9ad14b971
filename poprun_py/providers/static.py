"""The static provider: machines that already exist, listed under ``hosts:`` in the spec.

``up`` creates nothing: it checks that every host answers SSH and runs the setup script.
``down`` removes nothing but what poprun-py put on the hosts (the setup directory
``~/.poprun-py/clusters/<cluster>``). Host keys are checked against ``ssh.known_hosts`` (or the
user's own); ``up --accept-new-host-keys`` trusts and records unknown ones.

Example::

    name: lab
    provider: {kind: static}
    hosts:
      - name: gpu[1-4]
        user: train
    setup: |
      pip install -r requirements.txt

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.core.spec import HostSpec
    >>> _node(HostSpec("h1", address="10.0.0.1", user="ubuntu"))  # nothing is created
    Node(name='h1', address='10.0.0.1', ...)
"""

from __future__ import annotations

from dataclasses import asdict, replace

from poprun_py.core.spec import ClusterSpec, HostSpec, ProviderSpec
from poprun_py.errors import UsageError
from poprun_py.providers.base import ProvisionContext
from poprun_py.providers.records import SSH_PORT, Node, ProvisionRecord, Resource

WAIT_TIMEOUT = 30.0


def _node(host: HostSpec) -> Node:
    return Node(
        name=host.name,
        address=host.target,
        user=host.user,
        port=host.port or SSH_PORT,
        identity_file=host.identity_file,
        resource_id=host.name,
        state="static",
    )


class StaticProvider:
    """Existing machines: check, set up, clean up; never create or destroy."""

    name = "static"

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        """Existing machines cost nothing new."""
        return None

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        """Record the spec's hosts as the nodes."""
        if not spec.hosts:
            raise UsageError(f"static provider: cluster {spec.name!r} lists no hosts")
        record = ProvisionRecord(
            cluster=spec.name,
            provider=self.name,
            nodes=tuple(_node(h) for h in spec.hosts),
            known_hosts=spec.known_hosts,
            ssh_config=spec.ssh_config,
            phase="created",
            settings=asdict(spec.provider or ProviderSpec()),
        )
        old = ctx.state.load()
        if old is not None:
            record = replace(record, setup_sha256=old.setup_sha256)
        ctx.state.save(record)
        return record

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        """The recorded hosts (their state is not probed)."""
        return record.nodes

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        """Check that every host answers SSH within the timeout (default 30 s)."""
        from poprun_py.providers.reach import wait_for_record

        accept = ctx.accept_new_host_keys
        return wait_for_record(
            record, ctx, WAIT_TIMEOUT, accept_new_host_keys=accept, ssh_config=record.ssh_config
        )

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        """Remove the setup directories of this cluster from every host."""
        from poprun_py.providers.reach import ssh_settings
        from poprun_py.providers.setup import MARKER_ROOT, clean_setup

        hosts = record.host_specs() if record else tuple(_node(h).host_spec() for h in spec.hosts)
        settings = ssh_settings(
            known_hosts=record.known_hosts if record else spec.known_hosts,
            ssh_config=record.ssh_config if record else spec.ssh_config,
            accept_new_host_keys=ctx.accept_new_host_keys,
            flags=ctx.ssh,
        )
        ctx.reporter.start("cleaning setup directories", len(hosts))
        cleaned = clean_setup(hosts, spec.name, settings)
        ctx.reporter.advance("cleaning setup directories", len(cleaned))
        return tuple(Resource("setup-dir", f"{h}:~/{MARKER_ROOT}/{spec.name}") for h in cleaned)
