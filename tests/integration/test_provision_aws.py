"""The aws provider against moto run as a real server (boto3 over HTTP to 127.0.0.1).

SSH steps are skipped (POPRUN_PY_AWS_SKIP_SSH_WAIT=1, set by the ``aws_env`` fixture): moto's
instances have made-up addresses. The SSH wait itself is tested against real test hosts in
test_provision_local.py.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.errors import ProvisionError
from poprun_py.prepare.specfile import load_cluster
from poprun_py.providers.aws import AwsProvider
from poprun_py.providers.awsconfig import default_client, default_owner
from poprun_py.providers.lifecycle import down, status, up
from poprun_py.providers.state import ClusterState
from tests.integration.helpers import poprun_cli
from tests.motofixtures import AwsEnv, Ec2Proxy

pytestmark = pytest.mark.cloud

CIDR = "203.0.113.7/32"
REPO = Path(__file__).resolve().parents[2]


def aws_spec(env: AwsEnv, name: str = "c1", **changes: Any) -> ClusterSpec:
    fields: dict[str, Any] = {
        "kind": "aws",
        "num_nodes": 2,
        "instance_type": "t3.micro",
        "image": env.image_id,
        "ssh_cidr": CIDR,
        "disk_gb": 20,
        **changes,
    }
    return ClusterSpec(name, (), provider=ProviderSpec(**fields))


def provider(owner: str = "alice") -> AwsProvider:
    return AwsProvider(owner=owner, poll_interval=0.05)


def spec_file(env: AwsEnv, tmp_path: Path, name: str = "c1", extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "provider:\n"
        "  kind: aws\n"
        "  num_nodes: 2\n"
        "  instance_type: t3.micro\n"
        f"  image: {env.image_id}\n"
        f"  ssh_cidr: {CIDR}\n"
        f"{extra}"
    )
    return path


def filters(cluster: str) -> list[dict[str, Any]]:
    return [{"Name": "tag:poprun-py:cluster", "Values": [cluster]}]


def tagged(env: AwsEnv, cluster: str = "c1") -> dict[str, list[str]]:
    """Every live resource tagged for ``cluster``, by kind (empty lists when all is gone)."""
    ec2 = env.ec2
    live = [
        *filters(cluster),
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    ]
    instances = [
        i["InstanceId"]
        for r in ec2.describe_instances(Filters=live)["Reservations"]
        for i in r["Instances"]
    ]
    return {
        "instances": instances,
        "security_groups": [
            g["GroupId"]
            for g in ec2.describe_security_groups(Filters=filters(cluster))["SecurityGroups"]
        ],
        "key_pairs": [
            k["KeyName"] for k in ec2.describe_key_pairs(Filters=filters(cluster))["KeyPairs"]
        ],
        "volumes": [
            v["VolumeId"] for v in ec2.describe_volumes(Filters=filters(cluster))["Volumes"]
        ],
    }


def nothing_left(env: AwsEnv, cluster: str = "c1") -> bool:
    return all(not ids for ids in tagged(env, cluster).values())


def tags_of(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


cli = functools.partial(poprun_cli, timeout=60)


# ---------------------------------------------------------------- up


def test_up_creates_every_resource_tagged_with_cluster_and_owner(aws_env: AwsEnv) -> None:
    result = up(aws_spec(aws_env), provider=provider())
    ec2 = aws_env.ec2
    found = tagged(aws_env)
    assert len(found["instances"]) == 2 and len(found["volumes"]) == 2
    assert found["key_pairs"] == ["poprun-py-alice-c1"]
    reservations = ec2.describe_instances(InstanceIds=found["instances"])["Reservations"]
    instances = [i for r in reservations for i in r["Instances"]]
    for inst in instances:
        assert (inst["InstanceType"], inst["ImageId"]) == ("t3.micro", aws_env.image_id)
        assert inst["KeyName"] == "poprun-py-alice-c1"
        assert inst.get("InstanceLifecycle") != "spot"
        tags = tags_of(inst)
        assert tags["poprun-py:cluster"] == "c1" and tags["poprun-py:owner"] == "alice"
    assert sorted(tags_of(i)["poprun-py:node"] for i in instances) == ["1", "2"]
    for kind in ("SecurityGroups", "KeyPairs", "Volumes"):
        method = {
            "SecurityGroups": ec2.describe_security_groups,
            "KeyPairs": ec2.describe_key_pairs,
            "Volumes": ec2.describe_volumes,
        }[kind]
        for res in method(Filters=filters("c1"))[kind]:
            assert tags_of(res)["poprun-py:owner"] == "alice", kind
    assert {v["Size"] for v in ec2.describe_volumes(Filters=filters("c1"))["Volumes"]} == {20}
    (group,) = ec2.describe_security_groups(GroupIds=found["security_groups"])["SecurityGroups"]
    rules = group["IpPermissions"]
    ssh = [r for r in rules if r.get("FromPort") == 22]
    assert [ip["CidrIp"] for ip in ssh[0]["IpRanges"]] == [CIDR]
    peers = [r for r in rules if r["IpProtocol"] == "-1"]
    assert [p["GroupId"] for p in peers[0]["UserIdGroupPairs"]] == [group["GroupId"]]
    assert len(rules) == 2  # nothing else is open

    state = ClusterState.of("c1")
    pem = state.key_path
    assert pem.read_text().startswith("-----BEGIN") and stat.S_IMODE(pem.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.record_path.stat().st_mode) == 0o600
    inventory = load_cluster(result.inventory)
    assert [(h.name, h.user, h.identity_file) for h in inventory.hosts] == [
        ("node1", "ubuntu", str(pem)),
        ("node2", "ubuntu", str(pem)),
    ]
    addresses = {i["PublicIpAddress"] for i in instances}
    assert {h.address for h in inventory.hosts} == addresses
    assert inventory.known_hosts == str(state.known_hosts_path)
    assert not result.reachable


def test_up_twice_creates_nothing_new(aws_env: AwsEnv) -> None:
    first = up(aws_spec(aws_env), provider=provider())
    before = tagged(aws_env)
    second = up(aws_spec(aws_env), provider=provider())
    assert tagged(aws_env) == before
    assert [n.resource_id for n in second.record.nodes] == [
        n.resource_id for n in first.record.nodes
    ]


def test_up_replaces_a_lost_node_and_starts_a_stopped_one(aws_env: AwsEnv) -> None:
    first = up(aws_spec(aws_env, num_nodes=3), provider=provider())
    lost, stopped, kept = (n.resource_id for n in first.record.nodes)
    aws_env.ec2.terminate_instances(InstanceIds=[lost])
    aws_env.ec2.stop_instances(InstanceIds=[stopped])
    second = up(aws_spec(aws_env, num_nodes=3), provider=provider())
    ids = [n.resource_id for n in second.record.nodes]
    assert ids[0] != lost and ids[1:] == [stopped, kept]
    assert [n.name for n in second.record.nodes] == ["node1", "node2", "node3"]
    assert {n.state for n in second.record.nodes} == {"running"}
    assert len(tagged(aws_env)["instances"]) == 3


def test_a_node_of_the_wrong_instance_type_is_an_error(aws_env: AwsEnv) -> None:
    up(aws_spec(aws_env), provider=provider())
    before = tagged(aws_env)
    with pytest.raises(ProvisionError) as err:
        up(aws_spec(aws_env, instance_type="t3.small"), provider=provider())
    assert "node node1 (i-" in str(err.value)
    assert "InstanceType t3.micro, the spec asks for t3.small" in str(err.value)
    assert tagged(aws_env) == before


def test_more_nodes_than_the_spec_asks_for_is_an_error(aws_env: AwsEnv) -> None:
    up(aws_spec(aws_env, num_nodes=2), provider=provider())
    with pytest.raises(ProvisionError, match="does not fit a cluster of 1 node"):
        up(aws_spec(aws_env, num_nodes=1), provider=provider())


def test_spot_instances_and_image_by_name(aws_env: AwsEnv) -> None:
    result = up(aws_spec(aws_env, spot=True, image=aws_env.image_name), provider=provider())
    ids = [n.resource_id for n in result.record.nodes]
    reservations = aws_env.ec2.describe_instances(InstanceIds=ids)["Reservations"]
    instances = [i for r in reservations for i in r["Instances"]]
    assert {i["InstanceLifecycle"] for i in instances} == {"spot"}
    assert {i["ImageId"] for i in instances} == {aws_env.image_id}


class PlacementGroups:
    """moto has no placement groups: this client passes every call to moto except those."""

    def __init__(self, real: Any):
        self.real = real
        self.groups: dict[str, dict[str, Any]] = {}
        self.placements: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def create_placement_group(self, **kwargs: Any) -> dict[str, Any]:
        (spec,) = kwargs["TagSpecifications"]
        assert spec["ResourceType"] == "placement-group"
        self.groups[kwargs["GroupName"]] = {**kwargs, "Tags": spec["Tags"]}
        return {}

    def describe_placement_groups(self, Filters: list[dict[str, Any]]) -> dict[str, Any]:
        def matches(group: dict[str, Any]) -> bool:
            tags = tags_of(group)
            return all(tags.get(f["Name"][4:]) in f["Values"] for f in Filters)

        found = [{"GroupName": n, **g} for n, g in self.groups.items() if matches(g)]
        return {"PlacementGroups": found}

    def delete_placement_group(self, GroupName: str) -> dict[str, Any]:
        del self.groups[GroupName]
        return {}

    def run_instances(self, **kwargs: Any) -> Any:
        self.placements.append(kwargs.pop("Placement"))
        return self.real.run_instances(**kwargs)


def test_placement_group_is_tagged_used_and_removed(aws_env: AwsEnv) -> None:
    shims: list[PlacementGroups] = []

    def factory(cfg: Any) -> PlacementGroups:
        shims.append(PlacementGroups(default_client(cfg)))
        if len(shims) > 1:
            shims[-1].groups = shims[0].groups
        return shims[-1]

    aws = AwsProvider(client_factory=factory, owner="alice", poll_interval=0.05)
    spec = aws_spec(aws_env, placement_group=True)
    up(spec, provider=aws)
    (group,) = shims[0].groups.values()
    assert group["Strategy"] == "cluster" and group["GroupName"] == "poprun-py-alice-c1"
    assert tags_of(group) == {"poprun-py:cluster": "c1", "poprun-py:owner": "alice"}
    assert shims[0].placements == [{"GroupName": "poprun-py-alice-c1"}] * 2
    removed = down(spec, provider=aws).removed
    assert ("placement-group", "poprun-py-alice-c1") in [(r.kind, r.id) for r in removed]
    assert shims[0].groups == {} and nothing_left(aws_env)


# ---------------------------------------------------------------- down


def test_down_removes_everything_and_twice_is_harmless(aws_env: AwsEnv) -> None:
    up(aws_spec(aws_env), provider=provider())
    state = ClusterState.of("c1")
    result = down(aws_spec(aws_env), provider=provider())
    assert sorted({r.kind for r in result.removed}) == ["instance", "key-pair", "security-group"]
    assert nothing_left(aws_env)
    assert not any(aws_env.clusters_dir.iterdir()) and not state.key_path.exists()
    assert down(aws_spec(aws_env), provider=provider()).removed == ()


def test_down_finds_everything_by_tag_without_a_state_file(aws_env: AwsEnv) -> None:
    up(aws_spec(aws_env), provider=provider())
    for path in aws_env.clusters_dir.iterdir():
        path.unlink()
    down(aws_spec(aws_env), provider=provider())
    assert nothing_left(aws_env)


def test_down_leaves_other_owners_and_clusters_alone(aws_env: AwsEnv, tmp_path: Path) -> None:
    up(aws_spec(aws_env), provider=provider("bob"), root=tmp_path / "bob")
    up(aws_spec(aws_env), provider=provider("alice"))
    up(aws_spec(aws_env, name="c2", num_nodes=1), provider=provider("alice"))
    down(aws_spec(aws_env), provider=provider("alice"))
    left = tagged(aws_env, "c1")
    assert len(left["instances"]) == 2 and left["key_pairs"] == ["poprun-py-bob-c1"]
    assert len(tagged(aws_env, "c2")["instances"]) == 1


def test_down_never_removes_a_recorded_instance_of_another_owner(
    aws_env: AwsEnv, tmp_path: Path
) -> None:
    """A state file naming someone else's instance (copied, or shared by mistake) is not obeyed."""
    up(aws_spec(aws_env), provider=provider("bob"))
    for path in aws_env.clusters_dir.iterdir():
        if path.suffix == ".pem":
            path.unlink()
    down(aws_spec(aws_env), provider=provider("alice"))
    assert len(tagged(aws_env)["instances"]) == 2


def test_status_shows_node_states_from_ec2(aws_env: AwsEnv) -> None:
    result = up(aws_spec(aws_env), provider=provider(default_owner()))  # as status() asks
    aws_env.ec2.terminate_instances(InstanceIds=[result.record.nodes[0].resource_id])
    (row,) = status()
    assert row.error is None
    assert [n.state for n in row.nodes] == ["terminated", "running"]


# ---------------------------------------------------------------- bad input


def assert_nothing_created(env: AwsEnv) -> None:
    assert nothing_left(env)
    assert env.ec2.describe_key_pairs()["KeyPairs"] == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": "ami-00000000"}, r"image ami-00000000 does not exist in us-east-1 \(InvalidAMI"),
        ({"image": "no-such-image-name"}, "no image named 'no-such-image-name' in us-east-1"),
        ({"instance_type": "zz.huge"}, r"instance type zz.huge does not exist in us-east-1 \("),
        ({"region": "xx-nowhere-1"}, "unknown AWS region 'xx-nowhere-1'"),
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(
    aws_env: AwsEnv, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProvisionError, match=message) as err:
        up(aws_spec(aws_env, **changes), provider=provider())
    assert "\n" not in str(err.value)
    assert_nothing_created(aws_env)


def test_missing_credentials_is_one_line(aws_env: AwsEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as without:  # the check below looks with the credentials
        without.delenv("AWS_ACCESS_KEY_ID")
        without.delenv("AWS_SECRET_ACCESS_KEY")
        with pytest.raises(ProvisionError, match=r"^no AWS credentials found: set AWS_ACCESS_"):
            up(aws_spec(aws_env), provider=provider())
    assert_nothing_created(aws_env)


# ---------------------------------------------------------------- the CLI


def test_cli_up_status_and_down_by_name(aws_env: AwsEnv, tmp_path: Path) -> None:
    path = spec_file(aws_env, tmp_path)
    started = time.monotonic()
    proc = cli("up", str(path), "--yes")
    up_seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    inventory = Path(proc.stdout.strip())
    assert inventory == aws_env.clusters_dir / "c1.inventory.yaml" and inventory.exists()
    assert "cluster c1 is up: 2 node(s) (aws)" in proc.stderr
    listing = cli("status", "--format", "json")  # a table would wrap with the terminal's width
    assert listing.returncode == 0, listing.stderr
    clusters = json.loads(listing.stdout)
    assert [(c["cluster"], c["provider"], c["phase"], c["error"]) for c in clusters] == [
        ("c1", "aws", "ready", None)
    ]
    assert [n["state"] for n in clusters[0]["nodes"]] == ["running", "running"]
    started = time.monotonic()
    gone = cli("down", "c1")  # by name: the spec comes from the state file
    down_seconds = time.monotonic() - started
    assert gone.returncode == 0, gone.stderr
    assert nothing_left(aws_env)
    print(f"\ncli up {up_seconds:.2f}s, down {down_seconds:.2f}s (2 nodes, moto)")


def test_cli_up_without_terminal_or_yes_refuses(aws_env: AwsEnv, tmp_path: Path) -> None:
    proc = cli("up", str(spec_file(aws_env, tmp_path)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "poprun-py: error: up would create machines that cost money and there is no "
        "terminal to ask: pass --yes to confirm"
    ]
    assert_nothing_created(aws_env)


def test_cli_unknown_provider_lists_the_valid_ones(aws_env: AwsEnv, tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: x\nprovider:\n  kind: gcp\n")
    proc = cli("up", str(path), "--yes")
    assert proc.returncode == 2
    assert "provider.kind: expected one of local, static, aws, got 'gcp'" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


# ---------------------------------------------------------------- crash safety


@pytest.mark.parametrize("keep_state", [True, False], ids=["state-kept", "state-lost"])
def test_up_killed_halfway_then_down_removes_everything(
    aws_env: AwsEnv,
    ec2_proxy: Ec2Proxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keep_state: bool,
) -> None:
    """SIGKILL ``up`` after moto created the first instance but before ``up`` heard of it."""
    path = spec_file(aws_env, tmp_path)
    ec2_proxy.hold = {"RunInstances"}
    monkeypatch.setenv("POPRUN_PY_AWS_ENDPOINT_URL", ec2_proxy.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "up", str(path), "--yes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        assert ec2_proxy.held.wait(60), ec2_proxy.actions
        found = tagged(aws_env)
        assert found["key_pairs"] and found["security_groups"] and len(found["instances"]) == 1
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ec2_proxy.release.set()
    record = ClusterState.of("c1").load()
    assert record is not None and record.phase == "creating"
    assert "instance" not in {r.kind for r in record.resources}  # up never heard of it
    if not keep_state:
        for state_file in aws_env.clusters_dir.iterdir():
            state_file.unlink()
    monkeypatch.setenv("POPRUN_PY_AWS_ENDPOINT_URL", aws_env.url)
    gone = cli("down", str(path))
    assert gone.returncode == 0, gone.stderr
    assert nothing_left(aws_env)
    assert not any(aws_env.clusters_dir.iterdir())
    assert cli("down", str(path)).returncode == 0


def test_a_quota_error_halfway_is_one_line_and_down_cleans_up(
    aws_env: AwsEnv, ec2_proxy: Ec2Proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second RunInstances hits the instance quota (a real EC2 error response)."""
    path = spec_file(aws_env, tmp_path)
    message = "You have requested more instances (2) than your current instance limit of 1"
    ec2_proxy.fail = {"RunInstances": (1, "InstanceLimitExceeded", message)}
    monkeypatch.setenv("POPRUN_PY_AWS_ENDPOINT_URL", ec2_proxy.url)
    proc = cli("up", str(path), "--yes")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "poprun-py: error: instance quota reached: us-east-1 allows this account no more "
        "t3.micro instances (InstanceLimitExceeded); ask AWS to raise the limit or use fewer nodes"
    )
    assert len(tagged(aws_env)["instances"]) == 1  # half-created
    gone = cli("down", str(path))
    assert gone.returncode == 0, gone.stderr
    assert nothing_left(aws_env)
