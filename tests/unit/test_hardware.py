"""Hardware discovery against the fixture trees (tests/fixtures/hw, made by make_trees.py): the
same shell snippet preflight runs, the same parser, then plans and the instances' device, NIC
and network variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun_py.core.env import hardware_env, instance_env
from poprun_py.core.hardware import Hardware, Interface, parse_discovery, with_hardware
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan, network_choice, replan_with_topologies
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import Topology, uniform
from poprun_py.core.views import hardware_lines, plan_dict
from poprun_py.preflight.probes import HARDWARE_MARK, Checks, parse_check_output
from poprun_py.prepare.discover import discover_hardware, discover_machine
from poprun_py.prepare.job import LaunchOptions, prepare

TREES = Path(__file__).resolve().parents[1] / "fixtures" / "hw"


def machine(name: str) -> Topology:
    env = {
        **os.environ,
        "PATH": f"{TREES / 'nvidia-smi'}:{os.environ['PATH']}",
        "POPRUN_FAKE_SMI": str(TREES / name / "nvidia-smi.csv"),
    }
    return discover_machine(str(TREES / name), environ=env)


def plan_on(topo: Topology, instances: int, replicas: int, **job: object) -> LaunchPlan:
    cluster = cluster_from_hosts(parse_hosts("n1,n2"), topology=topo)
    spec = JobSpec(("train.py",), replicas=replicas, instances=instances, **job)  # type: ignore[arg-type]
    return make_plan(cluster, spec)


def test_dgx_h100_tree_gives_8_gpus_and_8_nics_on_2_nodes() -> None:
    topo = machine("dgx-h100")
    assert topo.device_kind == "nvidia" and topo.cuda_ordinals and topo.devices_placed
    assert [n.devices for n in topo.numa_nodes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert topo.numa_nodes[1].nics == tuple(f"mlx5_{k}:1" for k in range(4, 8))
    assert len(topo.cpus) == 224


def test_dgx_instances_get_their_gpu_and_their_nodes_nics() -> None:
    plan = plan_on(machine("dgx-h100"), instances=16, replicas=16, nic_affinity=True)
    envs = [hardware_env(plan, i) for i in plan.instances]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs[:8]] == [str(k) for k in range(8)]
    assert envs[5]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert envs[5]["NCCL_IB_HCA"] == "=mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
    assert envs[1]["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert plan.instances[5].numa_nodes == (1,)
    full = instance_env(plan, plan.instances[9], "/tmp/s")
    assert full["POPRUN_DEVICES"] == full["CUDA_VISIBLE_DEVICES"] == "1"


def test_dgx_two_gpus_per_replica_stay_on_the_instances_node() -> None:
    plan = plan_on(machine("dgx-h100"), instances=4, replicas=4, devices_per_replica=2)
    assert [i.devices for i in plan.instances[:2]] == [(0, 1, 2, 3)[:2], (4, 5)]


def test_amd_mi300x_tree_sets_rocr_and_hip_relative() -> None:
    topo = machine("amd-mi300x")
    assert topo.device_kind == "amd" and [len(n.devices) for n in topo.numa_nodes] == [4, 4]
    plan = plan_on(topo, instances=8, replicas=8, devices_per_replica=2, nic_affinity=True)
    env = hardware_env(plan, plan.instances[3])
    assert env["ROCR_VISIBLE_DEVICES"] == "6,7"
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"  # counted among those ROCR left visible
    assert env["NCCL_IB_HCA"] == "=bnxt_re4:1,bnxt_re5:1,bnxt_re6:1,bnxt_re7:1"
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_numa_unknown_tree_spreads_devices_and_says_so() -> None:
    topo = machine("numa-unknown")
    assert not topo.devices_placed
    assert [n.devices for n in topo.numa_nodes] == [(0, 1), (2, 3)]
    assert all(n.nics == ("mlx5_0:1",) for n in topo.numa_nodes)  # unknown node: every node's
    plan = plan_on(topo, instances=4, replicas=4)
    assert any("numa_node -1" in n for n in plan.notes)


def test_cpu_only_tree_has_no_devices_and_no_device_variables() -> None:
    topo = machine("cpu-only")
    assert topo.devices == () and topo.device_kind is None
    hw = discover_hardware(str(TREES / "cpu-only"))
    assert [(i.name, i.numa) for i in hw.interfaces] == [("eth0", 0), ("lo", -1)]
    plan = plan_on(topo, instances=2, replicas=2)
    assert hardware_env(plan, plan.instances[0]) == {}
    assert hardware_lines(plan) == []


def test_cuda_ordinals_come_from_nvidia_smi_not_sysfs_order() -> None:
    text = (
        "gpu 0000:18:00.0 0x030200 0x10de 0\n"
        "gpu 0000:9a:00.0 0x030200 0x10de 1\n"
        "1, 00000000:18:00.0\n"
        "0, 00000000:9A:00.0\n"
    )
    hw = parse_discovery(text)
    assert [(g.index, g.bus) for g in hw.gpus] == [(0, "0000:9a:00.0"), (1, "0000:18:00.0")]
    topo = with_hardware(uniform(2, 2), hw)
    assert [n.devices for n in topo.numa_nodes] == [(1,), (0,)]


def test_declared_devices_win_and_get_only_poprun_devices() -> None:
    declared = uniform(2, 4, devices_per_node=2)
    cluster = cluster_from_hosts(parse_hosts("n1"), topology=declared)
    plan = make_plan(cluster, JobSpec(("t",), replicas=2, instances=2))
    again = replan_with_topologies(plan, {"n1": machine("dgx-h100")})
    assert again.hosts[0].topology == declared
    env = instance_env(again, again.instances[1])
    assert env["POPRUN_DEVICES"] == "2" and "CUDA_VISIBLE_DEVICES" not in env


def test_device_env_of_the_topology_and_of_the_launch() -> None:
    named = Topology(uniform(1, 4, devices_per_node=4).numa_nodes, device_env="IPU_VISIBLE")
    plan = plan_on(named, instances=4, replicas=4)
    assert hardware_env(plan, plan.instances[1]) == {"IPU_VISIBLE": "1"}
    plan = plan_on(machine("dgx-h100"), instances=2, replicas=2, device_env="MY_GPUS")
    assert hardware_env(plan, plan.instances[0]) == {"MY_GPUS": "0"}


def test_user_env_may_override_a_device_variable() -> None:
    from poprun_py.core.spec import EnvVar

    plan = plan_on(
        machine("dgx-h100"), instances=2, replicas=2, env=(EnvVar("CUDA_VISIBLE_DEVICES", "7"),)
    )
    assert instance_env(plan, plan.instances[0])["CUDA_VISIBLE_DEVICES"] == "7"


def test_plan_json_and_table_show_devices_nics_and_network() -> None:
    topo = machine("dgx-h100")
    cluster = cluster_from_hosts(parse_hosts("n1,n2"), topology=topo)
    job = JobSpec(("t",), replicas=4, instances=4, nic_affinity=True, network="198.19.0.0/24")
    ifaces = {"n1": ("data1", "198.19.0.11"), "n2": ("ens2", "198.19.0.12")}
    plan = make_plan(cluster, job, interfaces=ifaces)
    data = plan_dict(plan)
    assert data["master_addr"] == "198.19.0.11"
    assert data["hosts"][1]["interface"] == ["ens2", "198.19.0.12"]
    assert data["instances"][3]["hardware_env"]["NCCL_SOCKET_IFNAME"] == "ens2"
    assert data["instances"][3]["hardware_env"]["GLOO_SOCKET_IFNAME"] == "ens2"
    assert data["hosts"][0]["numa_nodes"][0]["nics"][0] == "mlx5_0:1"
    lines = hardware_lines(plan)
    assert "CUDA_VISIBLE_DEVICES" in lines[1] and "NCCL_IB_HCA" in lines[1]
    assert "data1, ens2" in network_choice(plan)


def test_without_network_the_plan_says_what_and_why() -> None:
    plan = plan_on(uniform(1, 2), instances=2, replicas=2)
    assert network_choice(plan) == (
        "none chosen (no --network): MASTER_ADDR is n1's SSH address (n1); "
        "Gloo and NCCL pick their own interface"
    )


def test_preflight_output_with_hardware_and_a_host_off_the_network() -> None:
    checks = Checks(commands=("python3",), network="198.19.0.0/24")
    text = (
        "cmd 0 1\ntopology sysfs\n/sys/devices/system/node/node0/cpulist:0-3\n"
        f"{HARDWARE_MARK}\n"
        "gpu 0000:18:00.0 0x030200 0x10de 0\nib mlx5_0 0 1\nnet eth0 -\n"
        "2: eth0    inet 198.18.0.11/24 brd 198.18.0.255 scope global eth0\\\n"
    )
    faults, report = parse_check_output("h1", checks, text)
    assert report.topology is not None and report.topology.devices == (0,)
    assert report.topology.numa_nodes[0].nics == ("mlx5_0:1",)
    assert [f.detail for f in faults] == ["no address in 198.19.0.0/24 (has: eth0 198.18.0.11)"]
    ok = text + "3: data1    inet 198.19.0.11/24 scope global data1\\\n"
    faults, report = parse_check_output("h1", checks, ok)
    assert faults == [] and report.hardware is not None
    assert report.hardware.interface_in("198.19.0.0/24") == ("data1", "198.19.0.11")


def test_interface_in_picks_the_address_in_the_network() -> None:
    hw = Hardware(
        interfaces=(
            Interface("eth0", 0, ("198.18.0.11/24",)),
            Interface("d1", 0, ("198.19.0.11/24",)),
        )
    )
    assert hw.interface_in("198.19.0.0/16") == ("d1", "198.19.0.11")
    assert hw.interface_in("10.0.0.0/8") is None


def test_exclude_takes_hosts_out_of_a_hostfile_and_a_slurm_allocation(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\nn2 slots=2\nn3 slots=2\n")
    prep = prepare(LaunchOptions(hosts=f"@{hostfile}", exclude="n2", program=("t",)), environ={})
    assert [h.name for h in prep.plan.hosts] == ["n1", "n3"] and prep.plan.num_instances == 4
    slurm = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[01-04]"}
    opts = LaunchOptions(exclude="node[02-03]", backend="ssh", program=("t",))
    assert [h.name for h in prepare(opts, environ=slurm).plan.hosts] == ["node01", "node04"]


@pytest.mark.requires("ip")
def test_local_network_is_found_at_planning() -> None:
    opts = LaunchOptions(hosts="localhost", instances=2, network="127.0.0.0/8", program=("t",))
    plan = prepare(opts, environ={}).plan
    assert plan.interfaces == {"localhost": ("lo", "127.0.0.1")}
    assert hardware_env(plan, plan.instances[1])["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.parametrize("cidr", ["198.19.0.7/24", "10.0.0.0/8"])
def test_network_is_normalized(cidr: str) -> None:
    opts = LaunchOptions(hosts="h1,h2", network=cidr, program=("t",))
    assert prepare(opts, environ={}).plan.network == str(
        __import__("ipaddress").ip_network(cidr, strict=False)
    )
