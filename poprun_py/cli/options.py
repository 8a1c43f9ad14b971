"""Option declarations shared by ``plan``, ``render`` and ``launch``, and the SSH options every
remote command takes (typer ``Annotated`` aliases).

Example:

    >>> from poprun_py.cli.options import Hosts, Identity, KnownHosts, SshConfig, User
    >>> Hosts.__metadata__[0].param_decls
    ('--hosts', '-H')
    >>> [o.__metadata__[0].param_decls[0] for o in (SshConfig, Identity, User, KnownHosts)]
    ['--ssh-config', '--identity', '--user', '--known-hosts']
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

H_SIZE = "Sizes"
H_HOSTS = "Hosts"
H_RUN = "Running"
H_OUT = "Output"

Program = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Argument(help="The program and its arguments; everything after PROGRAM is passed on."),
]
Hosts = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--hosts",
        "-H",
        rich_help_panel=H_HOSTS,
        help="Hosts: h1,h2 | node[01-16] | @hostfile ('host slots=N'). Default: the cluster "
        "spec's hosts, else the Slurm allocation, else localhost.",
    ),
]
Cluster = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--cluster", "-c", rich_help_panel=H_HOSTS, help="Cluster spec YAML file."),
]
Replicas = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--replicas",
        "-r",
        rich_help_panel=H_SIZE,
        help="Total replicas (default: one per instance).",
    ),
]
Instances = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--instances",
        "-n",
        rich_help_panel=H_SIZE,
        help="Total instances (default: hostfile slots, else one per host).",
    ),
]
DevicesPerReplica = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--devices-per-replica",
        "-d",
        rich_help_panel=H_SIZE,
        help="Devices per replica (default 1).",
    ),
]
NumaAware = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--numa-aware/--no-numa-aware",
        rich_help_panel=H_SIZE,
        help="Bind instances to their share of each host's NUMA nodes (default on).",
    ),
]
GroupSize = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--group-size",
        "-g",
        rich_help_panel=H_SIZE,
        help="Replica groups of this size, kept within a host when possible.",
    ),
]
Inputs = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--input",
        "-i",
        rich_help_panel=H_SIZE,
        help="Input files: a glob (repeatable), a directory (every file under it) or @manifest "
        "('path [size]' lines).",
    ),
]
StrictShards = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--strict-shards/--no-strict-shards",
        rich_help_panel=H_SIZE,
        help="Refuse (exit 2) input shards the plan notes as uneven: an instance with no "
        "files, or the largest shard over 2x the smallest (default: the spec's, else off).",
    ),
]
EvalPad = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--eval-pad",
        rich_help_panel=H_SIZE,
        metavar="BATCH",
        help="Pad inputs so every instance gets the same number of whole batches.",
    ),
]
Env = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--env",
        "-e",
        rich_help_panel=H_RUN,
        help="KEY=VALUE for every instance (repeatable); KEY alone passes the caller's "
        "value as a secret, never printed.",
    ),
]
Backend = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--backend",
        "-b",
        rich_help_panel=H_RUN,
        help="local | ssh | mpirun | mpiexec | slurm (default: local when every host is this "
        "machine, slurm inside an allocation, else ssh).",
    ),
]
Workdir = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--workdir", rich_help_panel=H_RUN, help="Working directory of every instance."),
]
MasterPort = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--master-port",
        rich_help_panel=H_RUN,
        help="MASTER_PORT (default: a free port locally, 29500 on remote hosts).",
    ),
]
MpiArgs = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--mpi-args",
        rich_help_panel=H_RUN,
        help="Extra launcher options (mpirun, mpiexec, srun), as one string (split like a "
        "shell would).",
    ),
]
Templates = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--templates",
        rich_help_panel=H_RUN,
        help="Directory of Jinja2 templates overriding the packaged ones by name.",
    ),
]
GracePeriod = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--grace-period",
        rich_help_panel=H_RUN,
        help="Seconds between SIGTERM and SIGKILL when stopping instances (default 5).",
    ),
]
HostTimeout = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--host-timeout",
        rich_help_panel=H_RUN,
        help="A host silent this long (90s, 45m, 2h, or seconds) is lost, and its agent stops "
        "its instances when poprun-py is silent this long (default: the spec's, else 3m). A "
        "closed connection is noticed at once.",
    ),
]
H_SSH = "SSH"
# The SSH options: the same six on every command that reaches hosts (launch, plan, render,
# exec, sync). Flags first, then the cluster spec's ``ssh:``, then ~/.ssh (see
# poprun_py.prepare.job.ssh_settings).
ConnectTimeout = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--connect-timeout",
        rich_help_panel=H_SSH,
        help="SSH connect timeout in seconds (default: the cluster spec's, else 10).",
    ),
]
AcceptNewHostKeys = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        rich_help_panel=H_SSH,
        help="Record unknown SSH host keys (a changed key is always refused).",
    ),
]
KnownHosts = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--known-hosts",
        rich_help_panel=H_SSH,
        help="Extra known_hosts file (default: the cluster spec's, then ~/.ssh).",
    ),
]
SshConfig = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--ssh-config",
        rich_help_panel=H_SSH,
        help="ssh_config file (default: the cluster spec's, else ~/.ssh/config).",
    ),
]
Identity = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--identity", rich_help_panel=H_SSH, help="Private key for hosts that name none."),
]
User = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--user", "-l", rich_help_panel=H_SSH, help="Login user for hosts that name none."
    ),
]
Format = Annotated[
    str,
    typer.Option("--format", "-f", rich_help_panel=H_OUT, help="table | json"),
]
OutputDir = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--output-dir",
        "-o",
        rich_help_panel=H_OUT,
        help="Write one log per instance (instance-N.log) and the job files here.",
    ),
]
OnlyOutputFrom = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        "--only-output-from-instance",
        rich_help_panel=H_OUT,
        help="Show only this instance's stdout (every instance's errors still show).",
    ),
]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run", rich_help_panel=H_OUT, help="Print the plan and the commands; start nothing."
    ),
]
KeepJobDir = Annotated[
    bool,
    typer.Option(
        "--keep-job-dir",
        rich_help_panel=H_OUT,
        help="Keep the job's directory (shard lists, hostfile) after a successful launch; "
        "it is removed otherwise (always kept after a failure, and with --output-dir).",
    ),
]
PrintTopology = Annotated[
    bool,
    typer.Option(
        "--print-topology", rich_help_panel=H_OUT, help="Print the topology table before launching."
    ),
]
Sync = Annotated[
    bool,
    typer.Option(
        "--sync",
        rich_help_panel=H_RUN,
        help="Push the program's directory to every host before launching.",
    ),
]

H_HW = "Hardware and network"
Network = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--network",
        rich_help_panel=H_HW,
        metavar="CIDR",
        help="The network instances talk on (e.g. 10.1.0.0/16): per host the interface with an "
        "address in it sets MASTER_ADDR, GLOO/NCCL_SOCKET_IFNAME and MPI's interface "
        "(default: the spec's network:).",
    ),
]
DeviceEnv = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--device-env",
        rich_help_panel=H_HW,
        metavar="NAME",
        help="The variable that lists each instance's devices (default: CUDA_VISIBLE_DEVICES "
        "for NVIDIA, ROCR/HIP_VISIBLE_DEVICES for AMD, the topology's device_env:).",
    ),
]
NicAffinity = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option(
        "--nic-affinity/--no-nic-affinity",
        rich_help_panel=H_HW,
        help="Give each instance the RDMA NICs of its NUMA node (NCCL_IB_HCA, UCX_NET_DEVICES).",
    ),
]
Exclude = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--exclude",
        "-x",
        rich_help_panel=H_HOSTS,
        metavar="HOSTS",
        help="Hosts to leave out (h3,node[07-08]) of the spec, hostfile or Slurm allocation.",
    ),
]
Check = Annotated[
    bool,
    typer.Option(
        "--check",
        rich_help_panel=H_RUN,
        help="Run `poprun-py check` on the planned instances first; launch only if it passes.",
    ),
]
CheckTorch = Annotated[
    bool,
    typer.Option(
        "--check-torch",
        rich_help_panel=H_RUN,
        help="The check also runs a torch.distributed Gloo all-reduce where torch is importable "
        "(importing torch costs each instance about a second).",
    ),
]
CheckTimeout = Annotated[
    float,
    typer.Option(
        "--check-timeout",
        rich_help_panel=H_RUN,
        help="Seconds the check waits for every instance (default 5).",
    ),
]

H_SLURM = "Slurm"
SlurmTime = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--time",
        rich_help_panel=H_SLURM,
        help="Time limit of the allocation --backend slurm asks for (e.g. 30, 1:00:00).",
    ),
]
SlurmPartition = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--partition", rich_help_panel=H_SLURM, help="Slurm partition to allocate from."),
]
SlurmAccount = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--account", rich_help_panel=H_SLURM, help="Slurm account to charge."),
]
