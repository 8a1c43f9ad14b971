"""The environment of every instance: PopDist's names, torch's names, and poprun-py's own.

Pure: :func:`instance_env` maps a plan and an instance to ``{name: value}``; every backend uses
it, so an instance sees the same variables whichever backend started it. User variables
(``--env`` and the spec's ``env``) come last and may not override the layout variables.

Example:

    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.hosts import parse_hosts
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1,h2")), JobSpec(("t.py",), replicas=4))
    >>> env = instance_env(plan, plan.instances[1], shard_file="/tmp/s1")
    >>> env["POPDIST_REPLICA_INDEX_OFFSET"], env["RANK"], env["GROUP_RANK"], env["MASTER_ADDR"]
    ('2', '1', '1', 'h1')
    >>> instance_env(plan, plan.instances[0], restart_count=2)["TORCHELASTIC_RESTART_COUNT"]
    '2'
    >>> hup = instance_env(plan, plan.instances[0], checkpoint_signal="SIGHUP")
    >>> hup["POPRUN_CHECKPOINT_SIGNAL"]
    'SIGHUP'
"""

from __future__ import annotations

from collections.abc import Iterable

from poprun_py.core.plan import InstancePlan, LaunchPlan
from poprun_py.core.spec import EnvVar
from poprun_py.errors import UsageError

MASK = "******"

RESERVED_NAMES = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT",
    }
)
RESERVED_PREFIXES = ("POPDIST_", "POPRUN_")
CHECKPOINT_SIGNAL = "SIGUSR1"
"""``POPRUN_CHECKPOINT_SIGNAL`` by default: the first of the default forwarded signals."""


def check_user_env(names: Iterable[str]) -> None:
    """Refuse user variables that would override what poprun-py sets for every instance."""
    for name in names:
        if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
            raise UsageError(f"--env {name}: poprun-py sets {name} itself for every instance")


def layout_env(
    plan: LaunchPlan,
    inst: InstancePlan,
    shard_file: str = "",
    restart_count: int = 0,
    checkpoint_signal: str = CHECKPOINT_SIGNAL,
) -> dict[str, str]:
    """The variables that describe the layout (PopDist, torch, POPRUN_*), the attempt
    (``restart_count``: 0 for the first, k for the k-th restart of the whole job) and the
    signal that means "checkpoint now" (``checkpoint_signal``: the first forwarded one)."""
    env = {
        "POPDIST_NUM_TOTAL_REPLICAS": str(plan.num_replicas),
        "POPDIST_NUM_INSTANCES": str(plan.num_instances),
        "POPDIST_INSTANCE_INDEX": str(inst.index),
        "POPDIST_LOCAL_INSTANCE_INDEX": str(inst.local_index),
        "POPDIST_NUM_LOCAL_REPLICAS": str(inst.num_local_replicas),
        "POPDIST_REPLICA_INDEX_OFFSET": str(inst.replica_offset),
        "POPDIST_NUM_IPUS_PER_REPLICA": str(plan.devices_per_replica),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "RANK": str(inst.index),
        "WORLD_SIZE": str(plan.num_instances),
        "LOCAL_RANK": str(inst.local_index),
        "LOCAL_WORLD_SIZE": str(inst.num_local_instances),
        "GROUP_RANK": str(inst.host_index),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.master_port),
        "POPRUN_HOST_INDEX": str(inst.host_index),
        "POPRUN_NUM_HOSTS": str(len(plan.hosts)),
        "POPRUN_HOST_NAME": inst.host,
        "POPRUN_NUMA_NODES": ",".join(map(str, inst.numa_nodes)),
        "POPRUN_CPUS": ",".join(map(str, inst.cpus)),
        "POPRUN_DEVICES": ",".join(map(str, inst.devices)),
        "POPRUN_SHARD_FILE": shard_file,
        "POPRUN_SHARD_PADDING": str(inst.shard.padding),
        "POPRUN_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "POPRUN_CHECKPOINT_SIGNAL": checkpoint_signal,
    }
    if plan.group_size is not None:
        env["POPRUN_GROUP_SIZE"] = str(plan.group_size)
        env["POPRUN_REPLICA_GROUPS"] = ",".join(map(str, inst.groups))
    return env


def device_names(plan: LaunchPlan, inst: InstancePlan) -> tuple[str, ...]:
    """The variables naming an instance's devices: ``--device-env``, else its topology's
    ``device_env:``, else CUDA_VISIBLE_DEVICES (NVIDIA) or ROCR_VISIBLE_DEVICES and
    HIP_VISIBLE_DEVICES (AMD); none for generic declared devices (POPRUN_DEVICES only)."""
    topo = plan.hosts[inst.host_index].topology
    if topo is None or not topo.devices:
        return ()
    if plan.device_env or topo.device_env:
        return (plan.device_env or topo.device_env or "",)
    return {"nvidia": ("CUDA_VISIBLE_DEVICES",), "amd": AMD_NAMES}.get(topo.device_kind or "", ())


AMD_NAMES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def hardware_env(plan: LaunchPlan, inst: InstancePlan) -> dict[str, str]:
    """Devices as the instance's framework reads them, its NUMA node's NICs
    (``--nic-affinity``) and its host's interface in ``--network`` (Gloo's, NCCL's sockets and,
    without NIC affinity, UCX's).

    ``HIP_VISIBLE_DEVICES`` counts the devices ROCR_VISIBLE_DEVICES left visible (0..n-1); CUDA
    ordinals are PCI-bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, nvidia-smi's order)."""
    env: dict[str, str] = {}
    ids = ",".join(map(str, inst.devices))
    topo = plan.hosts[inst.host_index].topology
    for name in device_names(plan, inst):
        env[name] = ids
    if tuple(env) == AMD_NAMES:
        env["HIP_VISIBLE_DEVICES"] = ",".join(map(str, range(len(inst.devices))))
    if "CUDA_VISIBLE_DEVICES" in env and topo is not None and topo.device_kind == "nvidia":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if plan.nic_affinity and topo is not None:
        nics = [nic for n in topo.numa_nodes if n.id in inst.numa_nodes for nic in n.nics]
        if nics:
            env["NCCL_IB_HCA"] = "=" + ",".join(nics)  # '=': exact names (mlx5_1 != mlx5_10)
            env["UCX_NET_DEVICES"] = ",".join(nics)
    iface = plan.interfaces.get(inst.host)
    if iface is not None:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = iface[0]
        env.setdefault("UCX_NET_DEVICES", iface[0])  # UCX's TCP (MPICH ch4:ucx, Open MPI ucx)
    return env


def instance_env(
    plan: LaunchPlan,
    inst: InstancePlan,
    shard_file: str = "",
    restart_count: int = 0,
    checkpoint_signal: str = CHECKPOINT_SIGNAL,
) -> dict[str, str]:
    """Layout variables (with the attempt's ``restart_count`` and ``checkpoint_signal``),
    then the hardware's
    (:func:`hardware_env`), then the user's (``--env`` and spec ``env``, which may override the
    hardware's but not the layout's)."""
    env = layout_env(plan, inst, shard_file, restart_count, checkpoint_signal)
    hardware = hardware_env(plan, inst)
    env.update(hardware)
    layout = frozenset(env) - frozenset(hardware)
    for var in plan.env:
        if var.name in layout:
            raise UsageError(f"--env {var.name} would override a variable poprun-py sets")
        env[var.name] = var.value
    return env


def secret_names(env: tuple[EnvVar, ...]) -> frozenset[str]:
    """Names whose values must never be printed."""
    return frozenset(v.name for v in env if v.secret)


def masked(env: dict[str, str], secrets: frozenset[str]) -> dict[str, str]:
    """A copy of ``env`` with secret values replaced by a mask, for dry runs and logs."""
    return {k: (MASK if k in secrets else v) for k, v in env.items()}


def shard_text(inst: InstancePlan) -> str:
    """The contents of an instance's shard file: one path a line."""
    return "".join(f"{p}\n" for p in inst.shard.files)
