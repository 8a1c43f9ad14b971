"""The aws provider's pure parts: settings, the RunInstances request, the error table."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.errors import ProvisionError, UsageError
from poprun_py.providers.aws import AwsProvider
from poprun_py.providers.awsconfig import AwsSettings, resolve_settings, run_request
from poprun_py.providers.awserrors import CLIENT_ERRORS, explain, explain_botocore

FULL = ProviderSpec(
    kind="aws",
    num_nodes=2,
    region="eu-west-1",
    instance_type="p3.16xlarge",
    image="ami-0abc",
    ssh_cidr="203.0.113.7",
)


def spec(**changes: object) -> ClusterSpec:
    fields = {**FULL.__dict__, **changes}
    return ClusterSpec("c1", (), provider=ProviderSpec(**fields))  # type: ignore[arg-type]


def cfg(**changes: object) -> AwsSettings:
    return resolve_settings(spec(**changes), "alice", {})


def client_error(code: str, operation: str = "RunInstances") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"raw {code}\nsecond line"}}, operation)


# ---------------------------------------------------------------- settings


def test_settings_resolve_defaults_and_normalise_the_cidr() -> None:
    s = cfg()
    assert (s.region, s.ssh_user, s.host_prefix, s.ssh_cidr) == (
        "eu-west-1",
        "ubuntu",
        "node",
        "203.0.113.7/32",
    )
    assert s.resource_name == "poprun-py-alice-c1"


def test_region_and_endpoint_come_from_the_environment() -> None:
    env = {"AWS_DEFAULT_REGION": "us-west-2", "POPRUN_PY_AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    s = resolve_settings(spec(region=None), "bob", env)
    assert (s.region, s.endpoint_url) == ("us-west-2", "http://127.0.0.1:1")
    with pytest.raises(UsageError, match="no region"):
        resolve_settings(spec(region=None), "bob", {})


@pytest.mark.parametrize("missing", ["instance_type", "image", "ssh_cidr", "num_nodes"])
def test_required_fields_are_named(missing: str) -> None:
    with pytest.raises(UsageError, match=f"provider.{missing} is required"):
        cfg(**{missing: None})


def test_a_bad_cidr_is_refused() -> None:
    with pytest.raises(UsageError, match="ssh_cidr 'my laptop' is not a network"):
        cfg(ssh_cidr="my laptop")


def test_down_needs_only_the_region() -> None:
    s = resolve_settings(
        ClusterSpec("c1", (), provider=ProviderSpec(kind="aws", region="us-east-1")),
        "alice",
        {},
        for_down=True,
    )
    assert (s.region, s.cluster, s.owner) == ("us-east-1", "c1", "alice")


def test_tags_and_filters_name_cluster_and_owner() -> None:
    s = cfg()
    assert s.tags(extra="1") == [
        {"Key": "poprun-py:cluster", "Value": "c1"},
        {"Key": "poprun-py:owner", "Value": "alice"},
        {"Key": "extra", "Value": "1"},
    ]
    assert s.tag_filters() == [
        {"Name": "tag:poprun-py:cluster", "Values": ["c1"]},
        {"Name": "tag:poprun-py:owner", "Values": ["alice"]},
    ]


def test_cost_notice_names_type_count_market_and_no_price_lookup() -> None:
    notice = AwsProvider(owner="alice").cost_notice(spec(spot=True, disk_gb=500))
    assert notice is not None
    for words in ("2 x p3.16xlarge spot", "eu-west-1", "500 GB", "not looked up"):
        assert words in notice


# ---------------------------------------------------------------- RunInstances request


def test_on_demand_request_tags_instance_and_volume_at_creation() -> None:
    request = run_request(
        cfg(),
        index=2,
        image_id="ami-0abc",
        root_device="/dev/sda1",
        group_id="sg-1",
        placement_group=None,
    )
    assert request["MinCount"] == request["MaxCount"] == 1
    assert request["KeyName"] == "poprun-py-alice-c1" and request["SecurityGroupIds"] == ["sg-1"]
    kinds = [t["ResourceType"] for t in request["TagSpecifications"]]
    assert kinds == ["instance", "volume"]
    tags = {t["Key"]: t["Value"] for t in request["TagSpecifications"][0]["Tags"]}
    assert tags == {
        "poprun-py:cluster": "c1",
        "poprun-py:owner": "alice",
        "poprun-py:node": "2",
        "Name": "poprun-py-alice-c1-node2",
    }
    assert "InstanceMarketOptions" not in request and "Placement" not in request
    assert "BlockDeviceMappings" not in request  # no disk_gb: the image's own size


def test_spot_placement_and_disk_options_reach_the_request() -> None:
    request = run_request(
        cfg(spot=True, disk_gb=500, placement_group=True),
        index=1,
        image_id="ami-0abc",
        root_device="/dev/xvda",
        group_id="sg-1",
        placement_group="poprun-py-alice-c1",
    )
    assert request["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    assert request["Placement"] == {"GroupName": "poprun-py-alice-c1"}
    assert request["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/xvda",
            "Ebs": {"VolumeSize": 500, "VolumeType": "gp3", "DeleteOnTermination": True},
        }
    ]
    kinds = [t["ResourceType"] for t in request["TagSpecifications"]]
    assert kinds == ["instance", "volume", "spot-instances-request"]


# ---------------------------------------------------------------- error table

CONTEXT = {
    "region": "eu-west-1",
    "instance_type": "p3.16xlarge",
    "image": "ami-0abc",
    "market": "spot",
    "key_name": "kp",
}


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("InstanceLimitExceeded", ["quota", "p3.16xlarge", "eu-west-1"]),
        ("VcpuLimitExceeded", ["vCPU quota", "spot p3.16xlarge", "Service Quotas"]),
        ("MaxSpotInstanceCountExceeded", ["spot instance quota"]),
        ("InsufficientInstanceCapacity", ["no spot capacity", "p3.16xlarge"]),
        ("InvalidAMIID.NotFound", ["image ami-0abc does not exist in eu-west-1"]),
        ("InvalidAMIID.Malformed", ["malformed"]),
        ("InvalidInstanceType", ["instance type p3.16xlarge does not exist"]),
        ("AuthFailure", ["rejected the credentials", "AWS_ACCESS_KEY_ID"]),
        ("UnauthorizedOperation", ["not permitted to call RunInstances", "ec2:RunInstances"]),
        ("OptInRequired", ["region eu-west-1 is not enabled"]),
    ],
)
def test_client_errors_become_one_clear_line(code: str, words: list[str]) -> None:
    err = explain(client_error(code), CONTEXT)
    assert isinstance(err, ProvisionError)
    text = str(err)
    assert "\n" not in text and f"({code})" in text
    for word in words:
        assert word in text
    assert "raw" not in text or code == "Unsupported"  # our words, not AWS's


def test_every_table_entry_formats_without_missing_fields() -> None:
    for code in CLIENT_ERRORS:
        text = str(explain(client_error(code), CONTEXT))
        assert "?" not in text.replace("?)", ""), (code, text)


def test_unknown_codes_keep_the_aws_message_on_one_line() -> None:
    text = str(explain(client_error("SomethingNew", "CreateKeyPair"), CONTEXT))
    assert text == "AWS CreateKeyPair failed (SomethingNew): raw SomethingNew second line"


def test_botocore_errors_become_one_clear_line() -> None:
    assert "no AWS credentials found" in str(explain_botocore(NoCredentialsError(), CONTEXT))
    partial = PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY")
    assert "no AWS credentials found" in str(explain_botocore(partial, CONTEXT))
    assert "no AWS region" in str(explain_botocore(NoRegionError(), CONTEXT))
    endpoint = EndpointConnectionError(endpoint_url="https://ec2.xx-nowhere-1.amazonaws.com/")
    text = str(explain_botocore(endpoint, CONTEXT))
    assert text.startswith("cannot reach EC2 in eu-west-1") and "region exist" in text
    assert "(AuthFailure)" in str(explain_botocore(client_error("AuthFailure"), CONTEXT))
