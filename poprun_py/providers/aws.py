"""AWS EC2 provider (boto3): key pair, security group, placement group and instances, all tagged.

Every resource carries the tags ``poprun-py:cluster=<name>`` and ``poprun-py:owner=<user>`` from
the call that creates it (``TagSpecifications``), so a crash at any point leaves nothing untagged
and ``down`` finds everything by tag even when the state file is incomplete or gone. Instances
also carry ``poprun-py:node=<i>``: ``up`` fills in missing nodes, reuses existing ones (starting
stopped ones) and refuses a node of the wrong instance type or image.

* Key pair ``poprun-py-<owner>-<cluster>``; its private key is saved (0600) as ``<name>.pem`` in
  the state directory.
* Security group of the same name in the default VPC: SSH (tcp/22) from ``provider.ssh_cidr``
  only (no internet lookup of the caller's address), all traffic between its members.
* Optional cluster placement group of the same name (``placement_group: true``).
* Instances: ``instance_type``, ``image`` (``ami-...`` or an exact image name), root disk of
  ``disk_gb`` GB (gp3), on-demand or spot (``spot: true``).

Connection settings: ``provider.region`` (else AWS_REGION / AWS_DEFAULT_REGION),
``provider.endpoint_url`` (else POPRUN_PY_AWS_ENDPOINT_URL; for moto in tests), credentials the
usual boto3 way. ``POPRUN_PY_AWS_SKIP_SSH_WAIT=1`` is for tests only: it skips every SSH step
(the wait and the setup script), because moto's instances cannot be reached.

Example::

    provider:
      kind: aws
      num_nodes: 4
      region: us-east-1
      instance_type: p3.16xlarge
      image: ami-0123456789abcdef0
      disk_gb: 500
      spot: true
      placement_group: true
      ssh_user: ubuntu
      ssh_cidr: 203.0.113.7/32
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, replace

from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.errors import ProvisionError
from poprun_py.providers.awsconfig import (
    EC2,
    SKIP_SSH_ENV,
    WAIT_TIMEOUT,
    AwsSettings,
    ClientFactory,
    default_client,
    default_owner,
    resolve_settings,
)
from poprun_py.providers.awserrors import as_provision_error
from poprun_py.providers.base import ProvisionContext
from poprun_py.providers.records import Node, ProvisionRecord, Resource


class AwsProvider:
    """EC2 instances for a cluster; see the module docstring."""

    name = "aws"

    def __init__(
        self,
        client_factory: ClientFactory | None = None,
        owner: str | None = None,
        poll_interval: float = 2.0,
    ):
        self._client_factory = client_factory or default_client
        self._owner = owner
        self._poll = poll_interval

    @property
    def owner(self) -> str:
        return self._owner or default_owner()

    def cost_notice(self, spec: ClusterSpec) -> str | None:
        """The confirmation text: instance type x count, market, region; no price lookup."""
        cfg = resolve_settings(spec, self.owner)
        disk = f", {cfg.disk_gb} GB disk each" if cfg.disk_gb else ""
        return (
            f"poprun-py up will run {cfg.num_nodes} x {cfg.instance_type} {cfg.market} "
            f"instance(s) in {cfg.region}{disk} for cluster {cfg.cluster!r}; they cost money "
            "until `poprun-py down`. Prices are not looked up (offline): check the EC2 pricing "
            "page."
        )

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        """Create or reuse every resource; save the record after each one."""
        cfg = resolve_settings(spec, self.owner)
        from poprun_py.providers.ec2 import Ec2Session

        run = Ec2Session(
            self._connect(cfg),
            cfg,
            self._poll,
            reporter=ctx.reporter,
            state=ctx.state,
            wait_timeout=ctx.wait_timeout,
        )
        base = ctx.state.load() or ProvisionRecord(spec.name, self.name)
        run.record = replace(
            base,
            provider=self.name,
            phase="creating",
            known_hosts=str(ctx.state.known_hosts_path),
            settings=asdict(spec.provider or ProviderSpec(kind="aws")),
        )
        ctx.state.save(run.record)
        return run.create()

    def list_nodes(self, record: ProvisionRecord) -> tuple[Node, ...]:
        """The nodes with their current EC2 states (``terminated`` when gone)."""
        spec = ClusterSpec(name=record.cluster, hosts=(), provider=record.provider_spec())
        cfg = resolve_settings(spec, self.owner, for_down=True)
        from poprun_py.providers.ec2 import Ec2Session

        run = Ec2Session(self._connect(cfg), cfg, self._poll)
        live = {i["InstanceId"]: i for i in run.tagged_instances()}
        return tuple(
            replace(n, state=live[n.resource_id]["State"]["Name"])
            if n.resource_id in live
            else replace(n, state="terminated")
            for n in record.nodes
        )

    def wait_until_reachable(self, record: ProvisionRecord, ctx: ProvisionContext) -> bool:
        """Wait for SSH on every node, trusting and recording new host keys (fresh machines)."""
        if os.environ.get(SKIP_SSH_ENV) == "1":
            ctx.reporter.note(f"{SKIP_SSH_ENV}=1: skipping the SSH wait and setup (test only)")
            return False
        from poprun_py.providers.reach import wait_for_record

        return wait_for_record(record, ctx, WAIT_TIMEOUT, accept_new_host_keys=True)

    def terminate(
        self, spec: ClusterSpec, record: ProvisionRecord | None, ctx: ProvisionContext
    ) -> tuple[Resource, ...]:
        """Remove everything tagged for this cluster and owner, plus what the record names."""
        cfg = resolve_settings(spec, self.owner, for_down=True)
        from poprun_py.providers.ec2 import Ec2Session

        run = Ec2Session(
            self._connect(cfg), cfg, self._poll, reporter=ctx.reporter, state=ctx.state
        )
        removed = run.terminate(record.resources if record else ())
        with contextlib.suppress(FileNotFoundError):
            ctx.state.key_path.unlink()
        return removed

    def _connect(self, cfg: AwsSettings) -> EC2:
        try:
            return self._client_factory(cfg)
        except ProvisionError:
            raise
        except Exception as exc:
            raise as_provision_error(exc, cfg.context()) from exc
