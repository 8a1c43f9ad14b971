"""The EC2 steps of ``up`` and ``down`` for one cluster, in order, on one boto3 client.

:class:`Ec2Session` is what :class:`poprun_py.providers.aws.AwsProvider` drives. Every call
goes through :meth:`Ec2Session.call`, which turns any boto3/botocore failure into a one-line
ProvisionError (see :mod:`poprun_py.providers.awserrors`); every resource is added to the state
file as soon as it exists. ``down`` finds resources by their cluster and owner tags and adds
what the state file names (tags can lag behind creation in EC2).

Example::

    session = Ec2Session(default_client(cfg), cfg, poll=2.0, reporter=r, state=state)
    record = session.create()                 # key pair, group, placement group, instances
    removed = session.terminate(record.resources)

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> _index({"Tags": [{"Key": "poprun-py:node", "Value": "3"}]}), _index({"Tags": []})
    (3, 0)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from poprun_py.errors import ProvisionError
from poprun_py.providers.awsconfig import (
    EC2,
    LIVE_STATES,
    TAG_CLUSTER,
    TAG_NODE,
    TAG_OWNER,
    WAIT_TIMEOUT,
    AwsSettings,
    run_request,
)
from poprun_py.providers.awserrors import as_provision_error, error_code
from poprun_py.providers.base import NullReporter, Reporter
from poprun_py.providers.records import Node, ProvisionRecord, Resource
from poprun_py.providers.state import ClusterState, write_private

TAGGED = {
    "placement-group": ("placement_group", "PlacementGroups", "GroupName"),
    "security-group": ("security_group", "SecurityGroups", "GroupId"),
    "key-pair": ("key_pair", "KeyPairs", "KeyName"),
}
"""A cluster's tagged resources by kind: the EC2 noun (``describe_<noun>s``,
``delete_<noun>``), the list the description returns, and the key that names one."""


class Ec2Session:
    """One ``up`` or ``down`` against one EC2 client: the steps, in order."""

    def __init__(
        self,
        ec2: EC2,
        cfg: AwsSettings,
        poll: float,
        *,
        reporter: Reporter | None = None,
        state: ClusterState | None = None,
        wait_timeout: float | None = None,
    ):
        self.ec2, self.cfg, self.poll = ec2, cfg, poll
        self.reporter = reporter or NullReporter()
        self.wait_timeout = wait_timeout or WAIT_TIMEOUT
        self._state = state  # None: read-only use (status)
        self.record = ProvisionRecord(cfg.cluster, "aws")

    @property
    def state(self) -> ClusterState:
        if self._state is None:
            raise RuntimeError("this EC2 session was opened without a state file")
        return self._state

    # ------------------------------------------------------------ plumbing

    def call(self, operation: str, **kwargs: Any) -> Any:
        """``ec2.<operation>(**kwargs)`` with every failure turned into one line."""
        method = getattr(self.ec2, operation)
        try:
            return method(**kwargs)
        except Exception as exc:
            if error_code(exc) or _is_botocore(exc):
                raise as_provision_error(
                    exc, {**self.cfg.context(), "operation": operation}
                ) from exc
            raise

    def remember(self, kind: str, rid: str) -> None:
        """Add a resource to the record and save it at once (crash safety)."""
        self.record = self.record.with_resource(kind, rid)
        self.state.save(self.record)

    # ------------------------------------------------------------ up

    def create(self) -> ProvisionRecord:
        image_id, root_device = self.image()
        self.check_instance_type()
        self.ensure_key_pair()
        group_id = self.ensure_security_group()
        placement = self.ensure_placement_group() if self.cfg.placement_group else None
        instances = self.ensure_instances(image_id, root_device, group_id, placement)
        running = self.wait_running([i["InstanceId"] for i in instances])
        nodes = tuple(self.node(i) for i in sorted(running, key=_index))
        self.record = replace(self.record, nodes=nodes, phase="created")
        self.state.save(self.record)
        return self.record

    def image(self) -> tuple[str, str | None]:
        """The image id and its root device name; the image must match exactly one."""
        image = self.cfg.image
        if image.startswith("ami-"):
            found = self.call("describe_images", ImageIds=[image])["Images"]
        else:
            filters = [{"Name": "name", "Values": [image]}]
            found = self.call("describe_images", Filters=filters)["Images"]
        if len(found) != 1:
            what = "no image" if not found else f"{len(found)} images"
            raise ProvisionError(
                f"{what} named {image!r} in {self.cfg.region}: give an ami-... id or an exact name"
            )
        return str(found[0]["ImageId"]), found[0].get("RootDeviceName")

    def check_instance_type(self) -> None:
        self.call("describe_instance_types", InstanceTypes=[self.cfg.instance_type])

    def ensure_key_pair(self) -> None:
        pem = self.state.key_path
        found = self.call("describe_key_pairs", Filters=self.cfg.tag_filters())["KeyPairs"]
        if found:
            self.remember("key-pair", found[0]["KeyName"])
            if not pem.exists():
                raise ProvisionError(
                    f"key pair {found[0]['KeyName']} exists but its private key {pem} is missing: "
                    "run `poprun-py down` on this spec, then `up` again"
                )
            self.reporter.note(f"reusing key pair {found[0]['KeyName']}")
            return
        tags = [{"ResourceType": "key-pair", "Tags": self.cfg.tags()}]
        made = self.call("create_key_pair", KeyName=self.cfg.resource_name, TagSpecifications=tags)
        self.remember("key-pair", made["KeyName"])
        write_private(pem, made["KeyMaterial"])
        self.reporter.note(f"created key pair {made['KeyName']} (private key {pem})")

    def ensure_security_group(self) -> str:
        filters = self.cfg.tag_filters()
        found = self.call("describe_security_groups", Filters=filters)["SecurityGroups"]
        if found:
            group_id = str(found[0]["GroupId"])
            self.reporter.note(f"reusing security group {group_id}")
        else:
            group_id = self.create_security_group()
        self.remember("security-group", group_id)
        self.authorize(group_id)
        return group_id

    def create_security_group(self) -> str:
        vpcs = self.call("describe_vpcs", Filters=[{"Name": "isDefault", "Values": ["true"]}])
        if not vpcs["Vpcs"]:
            raise ProvisionError(f"no default VPC in {self.cfg.region}: poprun-py uses it")
        made = self.call(
            "create_security_group",
            GroupName=self.cfg.resource_name,
            Description=f"poprun-py cluster {self.cfg.cluster} of {self.cfg.owner}",
            VpcId=vpcs["Vpcs"][0]["VpcId"],
            TagSpecifications=[{"ResourceType": "security-group", "Tags": self.cfg.tags()}],
        )
        self.reporter.note(f"created security group {made['GroupId']}")
        return str(made["GroupId"])

    def authorize(self, group_id: str) -> None:
        """SSH from ssh_cidr only; everything between members of the group."""
        source = {"CidrIp": self.cfg.ssh_cidr, "Description": "poprun-py ssh"}
        ssh = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [source]}
        peers = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}
        for rule in (ssh, peers):
            try:
                self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
            except Exception as exc:
                if error_code(exc) != "InvalidPermission.Duplicate":
                    raise as_provision_error(exc, self.cfg.context()) from exc

    def ensure_placement_group(self) -> str:
        name = self.cfg.resource_name
        found = self.call("describe_placement_groups", Filters=self.cfg.tag_filters())
        if not found["PlacementGroups"]:
            tags = [{"ResourceType": "placement-group", "Tags": self.cfg.tags()}]
            self.call(
                "create_placement_group",
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=tags,
            )
            self.reporter.note(f"created placement group {name}")
        self.remember("placement-group", name)
        return name

    def tagged_instances(self, states: Sequence[str] = LIVE_STATES) -> list[dict[str, Any]]:
        filters = [*self.cfg.tag_filters(), {"Name": "instance-state-name", "Values": list(states)}]
        return list(self.describe_instances(Filters=filters))

    def describe_instances(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self.call(
                "describe_instances", **kwargs, **({"NextToken": token} if token else {})
            )
            for reservation in page["Reservations"]:
                yield from reservation["Instances"]
            token = page.get("NextToken")
            if not token:
                return

    def ensure_instances(
        self, image_id: str, root_device: str | None, group_id: str, placement: str | None
    ) -> list[dict[str, Any]]:
        existing = self.check_existing(self.tagged_instances(), image_id)
        for inst in existing.values():
            self.remember("instance", inst["InstanceId"])
        missing = [i for i in range(1, self.cfg.num_nodes + 1) if i not in existing]
        if existing:
            self.reporter.note(f"reusing {len(existing)} instance(s); creating {len(missing)}")
        if missing:
            self.reporter.start("creating instances", len(missing))
        for index in missing:
            request = run_request(
                self.cfg,
                index=index,
                image_id=image_id,
                root_device=root_device,
                group_id=group_id,
                placement_group=placement,
            )
            made = self.call("run_instances", **request)["Instances"][0]
            self.remember("instance", made["InstanceId"])
            existing[index] = made
            self.reporter.advance("creating instances")
        return [existing[i] for i in sorted(existing)]

    def check_existing(
        self, instances: list[dict[str, Any]], image_id: str
    ) -> dict[int, dict[str, Any]]:
        """Index -> instance for nodes that may be reused; a mismatch is a ProvisionError."""
        by_index: dict[int, dict[str, Any]] = {}
        for inst in instances:
            index, iid = _index(inst), inst["InstanceId"]
            label = f"node {self.cfg.host_prefix}{index} ({iid})"
            if not 1 <= index <= self.cfg.num_nodes or index in by_index:
                raise ProvisionError(
                    f"{label} does not fit a cluster of {self.cfg.num_nodes} node(s): "
                    "run `poprun-py down` on this spec first, or raise provider.num_nodes"
                )
            for key, want in (("InstanceType", self.cfg.instance_type), ("ImageId", image_id)):
                if inst.get(key) != want:
                    raise ProvisionError(
                        f"{label} has {key} {inst.get(key)}, the spec asks for {want}: "
                        "run `poprun-py down` on this spec first, or change the spec"
                    )
            by_index[index] = inst
        return by_index

    def wait_running(self, ids: list[str]) -> list[dict[str, Any]]:
        """Poll until every instance runs; start stopped ones; fail on terminated ones."""
        deadline = time.monotonic() + self.wait_timeout
        self.reporter.start("waiting for instances to run", len(ids))
        started: set[str] = set()
        done: dict[str, dict[str, Any]] = {}
        while True:
            for inst in self.describe_instances(InstanceIds=ids):
                self.step_instance(inst, started, done)
            if len(done) == len(ids):
                return list(done.values())
            if time.monotonic() > deadline:
                late = sorted(set(ids) - set(done))
                raise ProvisionError(f"instances not running in time: {', '.join(late)}")
            time.sleep(self.poll)

    def step_instance(
        self, inst: dict[str, Any], started: set[str], done: dict[str, dict[str, Any]]
    ) -> None:
        iid, state = inst["InstanceId"], inst["State"]["Name"]
        if state == "running" and iid not in done:
            done[iid] = inst
            self.reporter.advance("waiting for instances to run")
        elif state == "stopped" and iid not in started:
            self.call("start_instances", InstanceIds=[iid])
            started.add(iid)
            self.reporter.note(f"starting stopped instance {iid}")
        elif state in ("shutting-down", "terminated"):
            reason = inst.get("StateReason", {}).get("Message", "no reason given")
            raise ProvisionError(f"instance {iid} was terminated while starting: {reason}")

    def node(self, inst: dict[str, Any]) -> Node:
        address = inst.get("PublicIpAddress") or inst.get("PrivateIpAddress")
        if not address:
            raise ProvisionError(f"instance {inst['InstanceId']} has no IP address")
        return Node(
            name=f"{self.cfg.host_prefix}{_index(inst)}",
            address=str(address),
            user=self.cfg.ssh_user,
            identity_file=str(self.state.key_path),
            resource_id=str(inst["InstanceId"]),
            state=str(inst["State"]["Name"]),
        )

    # ------------------------------------------------------------ down

    def terminate(self, recorded: Sequence[Resource]) -> tuple[Resource, ...]:
        """Remove instances, then what depended on them; tagged resources plus recorded ones."""
        known = {
            kind: [r.id for r in recorded if r.kind == kind]
            for kind in ("instance", "security-group", "key-pair", "placement-group")
        }
        removed = self.terminate_instances(known["instance"])
        removed += self.delete_leftovers()
        if self.cfg.placement_group or known["placement-group"]:
            removed += self.delete_tagged("placement-group", known["placement-group"])
        removed += self.delete_tagged("security-group", known["security-group"])
        removed += self.delete_tagged("key-pair", known["key-pair"])
        return tuple(removed)

    def terminate_instances(self, recorded: list[str]) -> list[Resource]:
        ids = {i["InstanceId"] for i in self.tagged_instances((*LIVE_STATES, "shutting-down"))}
        ids.update(self.still_there(recorded))
        if not ids:
            return []
        self.call("terminate_instances", InstanceIds=sorted(ids))
        self.wait_terminated(sorted(ids))
        return [Resource("instance", i) for i in sorted(ids)]

    def still_there(self, recorded: list[str]) -> set[str]:
        """Recorded instance ids that exist and are not terminated (tags may lag in EC2)."""
        alive: set[str] = set()
        for iid in recorded:
            try:
                for inst in self.describe_instances(InstanceIds=[iid]):
                    if inst["State"]["Name"] != "terminated" and self.may_remove(inst):
                        alive.add(iid)
            except ProvisionError as exc:
                if not _cause_code(exc).startswith("InvalidInstanceID"):
                    raise
        return alive

    def may_remove(self, inst: Mapping[str, Any]) -> bool:
        """False for an instance tagged for another cluster or owner (never ours to remove)."""
        tags = {t.get("Key"): t.get("Value") for t in inst.get("Tags", ())}
        mine = {TAG_CLUSTER: self.cfg.cluster, TAG_OWNER: self.cfg.owner}
        return all(tags.get(key, want) == want for key, want in mine.items())

    def wait_terminated(self, ids: list[str]) -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT
        self.reporter.start("terminating instances", len(ids))
        gone: set[str] = set()
        while True:
            for inst in self.describe_instances(InstanceIds=ids):
                if inst["State"]["Name"] == "terminated" and inst["InstanceId"] not in gone:
                    gone.add(inst["InstanceId"])
                    self.reporter.advance("terminating instances")
            if len(gone) == len(ids):
                return
            if time.monotonic() > deadline:
                raise ProvisionError(f"instances not terminated in time: {sorted(set(ids) - gone)}")
            time.sleep(self.poll)

    def delete_leftovers(self) -> list[Resource]:
        """Spot requests and detached volumes that carry this cluster's tags."""
        removed: list[Resource] = []
        spot = self.call("describe_spot_instance_requests", Filters=self.cfg.tag_filters())
        ids = [
            r["SpotInstanceRequestId"]
            for r in spot["SpotInstanceRequests"]
            if r.get("State") in ("open", "active", "disabled")
        ]
        if ids:
            self.call("cancel_spot_instance_requests", SpotInstanceRequestIds=ids)
            removed += [Resource("spot-request", i) for i in ids]
        filters = [*self.cfg.tag_filters(), {"Name": "status", "Values": ["available"]}]
        for vol in self.call("describe_volumes", Filters=filters)["Volumes"]:
            self.call("delete_volume", VolumeId=vol["VolumeId"])
            removed.append(Resource("volume", vol["VolumeId"]))
        return removed

    def delete_tagged(self, kind: str, recorded: list[str]) -> list[Resource]:
        """Delete every resource of ``kind`` (see :data:`TAGGED`) tagged for this cluster or
        ``recorded``; the ones that were there."""
        noun, listed, key = TAGGED[kind]
        found = self.call(f"describe_{noun}s", Filters=self.cfg.tag_filters())
        ids = {item[key] for item in found[listed]} | set(recorded)
        return [Resource(kind, i) for i in sorted(ids) if self.delete(f"delete_{noun}", **{key: i})]

    def delete(self, operation: str, **kwargs: Any) -> bool:
        """Delete one resource; False if already gone. Retries while it is still in use."""
        deadline = time.monotonic() + 120.0
        while True:
            try:
                self.call(operation, **kwargs)
                return True
            except ProvisionError as exc:
                code = _cause_code(exc)
                if code.endswith((".NotFound", ".Unknown")):
                    return False
                if code != "DependencyViolation" or time.monotonic() > deadline:
                    raise
            time.sleep(max(self.poll, 1.0))


def _index(inst: Mapping[str, Any]) -> int:
    """The node index from the ``poprun-py:node`` tag (0 when missing or malformed)."""
    for tag in inst.get("Tags", ()):
        if tag.get("Key") == TAG_NODE:
            with contextlib.suppress(ValueError):
                return int(tag.get("Value", ""))
    return 0


def _cause_code(exc: ProvisionError) -> str:
    """The EC2 error code behind a ProvisionError raised by ``_Session.call``."""
    return error_code(exc.__cause__) if exc.__cause__ is not None else ""


def _is_botocore(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("botocore", "boto3"))
