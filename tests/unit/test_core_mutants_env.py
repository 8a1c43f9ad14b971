"""Every instance's environment: the defaults of a first attempt without a shard file, the
replica groups' list, UCX's interface without NIC affinity, and the refusal of a user variable
that would override the layout.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2).
"""

import pytest

from poprun_py.core.env import hardware_env, instance_env, layout_env
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts
from poprun_py.errors import UsageError


def test_a_first_attempt_without_shard_file_says_so() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("t",), 1, 1))
    for env in (layout_env(plan, plan.instances[0]), instance_env(plan, plan.instances[0])):
        assert env["POPRUN_SHARD_FILE"] == ""
        assert env["POPRUN_RESTART_COUNT"] == env["TORCHELASTIC_RESTART_COUNT"] == "0"


def test_an_instance_in_several_replica_groups_lists_them_with_commas() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("t",), 4, 1, group_size=2))
    env = layout_env(plan, plan.instances[0])
    assert (env["POPRUN_GROUP_SIZE"], env["POPRUN_REPLICA_GROUPS"]) == ("2", "0,1")


def test_the_network_interface_is_ucxs_too_without_nic_affinity() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1")),
        JobSpec(("t",), 1, 1, network="10.0.0.0/8"),
        interfaces={"h1": ("eth1", "10.0.0.1")},
    )
    assert hardware_env(plan, plan.instances[0]) == {
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_SOCKET_IFNAME": "eth1",
        "UCX_NET_DEVICES": "eth1",
    }


def test_a_user_variable_may_not_override_the_layout() -> None:
    plan = make_plan(
        cluster_from_hosts(parse_hosts("h1")),
        JobSpec(("t",), 1, 1, env=(EnvVar("LOCAL_RANK", "3"),)),
    )
    with pytest.raises(UsageError) as caught:
        instance_env(plan, plan.instances[0])
    assert str(caught.value) == "--env LOCAL_RANK would override a variable poprun-py sets"
