"""AWS settings for the EC2 provider: the spec's ``provider:`` section resolved against the
environment (region, endpoint, owner, ssh CIDR), the run-instances request, the boto3 client,
and the tags every resource carries.

Example:

    >>> ipaddress.ip_network(_cidr("203.0.113.7/32")).num_addresses
    1
"""

from __future__ import annotations

import functools
import getpass
import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.errors import ProvisionError, UsageError

TAG_CLUSTER = "poprun-py:cluster"
TAG_OWNER = "poprun-py:owner"
TAG_NODE = "poprun-py:node"
ENDPOINT_ENV = "POPRUN_PY_AWS_ENDPOINT_URL"
SKIP_SSH_ENV = "POPRUN_PY_AWS_SKIP_SSH_WAIT"
LIVE_STATES = ("pending", "running", "stopping", "stopped")
DEFAULT_USER = "ubuntu"
DEFAULT_PREFIX = "node"
WAIT_TIMEOUT = 900.0
_OWNER_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

EC2 = Any  # a boto3 EC2 client (no stubs for the ec2 service are installed)
ClientFactory = Callable[["AwsSettings"], EC2]


@dataclass(frozen=True)
class AwsSettings:
    """A validated aws ``provider:`` block plus the names derived from it."""

    cluster: str
    owner: str
    region: str
    num_nodes: int
    instance_type: str
    image: str
    ssh_cidr: str
    ssh_user: str = DEFAULT_USER
    host_prefix: str = DEFAULT_PREFIX
    disk_gb: int | None = None
    spot: bool = False
    placement_group: bool = False
    endpoint_url: str | None = None

    @property
    def resource_name(self) -> str:
        """The name of the key pair, security group and placement group."""
        return f"poprun-py-{self.owner}-{self.cluster}"

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on-demand"

    def tags(self, **extra: str) -> list[dict[str, str]]:
        """The tag list every resource gets (cluster and owner), plus ``extra``."""
        tags = {TAG_CLUSTER: self.cluster, TAG_OWNER: self.owner, **extra}
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    def tag_filters(self) -> list[dict[str, Any]]:
        """describe_* filters selecting this cluster's resources of this owner."""
        return [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]},
            {"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]},
        ]

    def context(self) -> dict[str, str]:
        """Fields for error messages (see awserrors.explain)."""
        return {
            "region": self.region,
            "instance_type": self.instance_type,
            "image": self.image,
            "market": self.market,
            "key_name": self.resource_name,
        }


def default_owner() -> str:
    """The owner tag: the login name, reduced to characters safe in resource names."""
    return _OWNER_SAFE.sub("-", getpass.getuser()) or "unknown"


def resolve_settings(
    spec: ClusterSpec,
    owner: str,
    environ: Mapping[str, str] | None = None,
    *,
    for_down: bool = False,
) -> AwsSettings:
    """Validate the aws provider block of ``spec`` (pure). ``for_down`` needs only the region."""
    env = os.environ if environ is None else environ
    p = spec.provider or ProviderSpec(kind="aws")
    region = p.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise UsageError("aws: no region: set provider.region in the spec (or AWS_REGION)")
    endpoint = p.endpoint_url or env.get(ENDPOINT_ENV) or None
    if for_down:
        return _down_settings(spec.name, owner, region, p, endpoint)
    num_nodes = _required(p)
    return AwsSettings(
        cluster=spec.name,
        owner=owner,
        region=region,
        num_nodes=num_nodes,
        instance_type=str(p.instance_type),
        image=str(p.image),
        ssh_cidr=_cidr(str(p.ssh_cidr)),
        ssh_user=p.ssh_user or DEFAULT_USER,
        host_prefix=p.host_prefix or DEFAULT_PREFIX,
        disk_gb=p.disk_gb,
        spot=p.spot,
        placement_group=p.placement_group,
        endpoint_url=endpoint,
    )


def _down_settings(
    cluster: str, owner: str, region: str, p: ProviderSpec, endpoint: str | None
) -> AwsSettings:
    """The settings ``down`` works with: only the region is required (the rest as given)."""
    return AwsSettings(
        cluster,
        owner,
        region,
        p.num_nodes or 0,
        p.instance_type or "?",
        p.image or "?",
        p.ssh_cidr or "",
        placement_group=p.placement_group,
        endpoint_url=endpoint,
    )


def _required(p: ProviderSpec) -> int:
    """The number of nodes, once the keys ``up`` needs are all there; else UsageError naming
    the first that the provider block lacks."""
    missing = [k for k in ("instance_type", "image", "ssh_cidr") if not getattr(p, k)]
    if missing:
        raise UsageError(f"aws: provider.{missing[0]} is required (see `poprun-py up --help`)")
    if not p.num_nodes:
        raise UsageError("aws: provider.num_nodes is required")
    return p.num_nodes


def _cidr(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise UsageError(
            f"aws: provider.ssh_cidr {text!r} is not a network (e.g. 203.0.113.7/32)"
        ) from None


def run_request(
    cfg: AwsSettings,
    *,
    index: int,
    image_id: str,
    root_device: str | None,
    group_id: str,
    placement_group: str | None,
) -> dict[str, Any]:
    """The RunInstances arguments for node ``index`` (pure; tags given at creation)."""
    node_tags = cfg.tags(
        **{TAG_NODE: str(index), "Name": f"{cfg.resource_name}-{cfg.host_prefix}{index}"}
    )
    kinds = ["instance", "volume"] + (["spot-instances-request"] if cfg.spot else [])
    request: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": cfg.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "KeyName": cfg.resource_name,
        "SecurityGroupIds": [group_id],
        "TagSpecifications": [{"ResourceType": k, "Tags": node_tags} for k in kinds],
    }
    if cfg.disk_gb and root_device:
        ebs = {"VolumeSize": cfg.disk_gb, "VolumeType": "gp3", "DeleteOnTermination": True}
        request["BlockDeviceMappings"] = [{"DeviceName": root_device, "Ebs": ebs}]
    if placement_group:
        request["Placement"] = {"GroupName": placement_group}
    if cfg.spot:
        spot = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return request


@functools.cache
def _data_loader() -> Any:
    """botocore's model loader, shared by every session of this process (parsing the EC2
    model again for each client costs ~0.2 s of CPU)."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def _session(region: str | None) -> Any:
    """A fresh boto3 session (own credential lookup) on the shared model loader."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    core.register_component("data_loader", _data_loader())
    return boto3.session.Session(region_name=region, botocore_session=core)


@functools.cache
def _known_regions() -> frozenset[str]:
    """Every EC2 region botocore knows of, in every partition (read from its data files)."""
    session = _session(None)
    return frozenset(
        region
        for part in session.get_available_partitions()
        for region in session.get_available_regions("ec2", partition_name=part)
    )


def default_client(cfg: AwsSettings) -> EC2:
    """A boto3 EC2 client for ``cfg`` (credentials and region are checked first)."""
    from botocore.config import Config

    session = _session(cfg.region)
    if cfg.region not in _known_regions():
        raise ProvisionError(f"unknown AWS region {cfg.region!r} (e.g. us-east-1, eu-west-1)")
    if session.get_credentials() is None:
        raise ProvisionError(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE)"
        )
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10)
    return session.client("ec2", endpoint_url=cfg.endpoint_url, config=config)
