"""Option declarations shared by ``plan``, ``render`` and ``launch`` (typer ``Annotated``
aliases), and the SSH option group every remote command takes (:data:`SSH_FLAGS`,
:func:`ssh_flags`, :func:`ssh_options`).

Example:

    >>> from poprun_py.cli.options import SSH_FLAGS, Hosts, ssh_options
    >>> Hosts.__metadata__[0].param_decls
    ('--hosts', '-H')
    >>> [f.decls[0] for f in SSH_FLAGS if "jobs" in f.commands]
    ['--connect-timeout', '--known-hosts', '--ssh-config', '--identity', '--user']
    >>> ssh = ssh_options({"user": "ops", "hosts": "h1", "connect_timeout": 3.0})
    >>> ssh.user, ssh.connect_timeout, ssh.known_hosts
    ('ops', 3.0, None)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Annotated, Any, Optional

import typer

from poprun_py.core.spec import SshOptions

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
LAUNCHING = ("plan", "render", "launch", "check")
REMOTE = (*LAUNCHING, "exec", "sync")
EVERY = (*REMOTE, "jobs", "up", "down")


@dataclass(frozen=True)
class SshFlag:
    """One SSH flag: its parameter name (the :class:`SshOptions` field it fills), how it is
    declared, its type, default and help, the cluster spec key it comes before, and the
    commands that take it."""

    name: str
    decls: tuple[str, ...]
    type: Any
    default: Any
    help: str
    spec_key: str | None
    commands: tuple[str, ...] = EVERY

    @property
    def annotated(self) -> Any:
        """The typer parameter: ``Annotated[type, typer.Option(...)]``, in the SSH panel."""
        option = typer.Option(*self.decls, rich_help_panel=H_SSH, help=self.help)
        return Annotated[self.type, option]


SSH_FLAGS = (
    SshFlag(
        "connect_timeout",
        ("--connect-timeout",),
        Optional[float],  # noqa: UP045 - typer needs Optional on 3.10
        None,
        "SSH connect timeout in seconds (default: the cluster spec's, else 10).",
        "defaults.connect_timeout",
    ),
    SshFlag(
        "accept_new_host_keys",
        ("--accept-new-host-keys",),
        bool,
        False,
        "Record unknown SSH host keys (a changed key is always refused).",
        None,
        REMOTE,  # up and down have their own: the provider's trust in fresh static nodes
    ),
    SshFlag(
        "known_hosts",
        ("--known-hosts",),
        Optional[str],  # noqa: UP045
        None,
        "Extra known_hosts file (default: the cluster spec's, then ~/.ssh).",
        "ssh.known_hosts",
    ),
    SshFlag(
        "ssh_config",
        ("--ssh-config",),
        Optional[str],  # noqa: UP045
        None,
        "ssh_config file (default: the cluster spec's, else ~/.ssh/config).",
        "ssh.ssh_config",
    ),
    SshFlag(
        "identity",
        ("--identity",),
        Optional[str],  # noqa: UP045
        None,
        "Private key for hosts that name none.",
        None,
    ),
    SshFlag(
        "user",
        ("--user", "-l"),
        Optional[str],  # noqa: UP045
        None,
        "Login user for hosts that name none.",
        None,
    ),
)
"""The SSH options, each described once: flags first, then the cluster spec's key, then
~/.ssh (:func:`poprun_py.ssh.settings.settings_for`). A command takes them with
:func:`ssh_flags` and gets them as one :class:`SshOptions`, built by name."""

Ssh = SshOptions
SSH_HERE = SshOptions()
"""``ssh: Ssh = SSH_HERE``: where :func:`ssh_flags` puts a command's SSH flags."""


def ssh_options(params: Mapping[str, Any]) -> SshOptions:
    """The SSH options among a command's parsed parameters (its keyword arguments, or typer's
    ``ctx.params``), each by its name, as :func:`poprun_py.cli.option_model.launch_options`
    takes LaunchOptions; one the command does not take keeps its default."""
    return SshOptions(**{f.name: params[f.name] for f in fields(SshOptions) if f.name in params})


def ssh_flags(command: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command function the SSH flags of :data:`SSH_FLAGS` that ``command`` takes, in
    place of its parameter ``ssh`` (same kind, same position, so the help and the order of
    ``ctx.params`` follow the signature); the function is called with them as one
    :class:`SshOptions` (:func:`ssh_options`) in ``ssh``."""
    flags = [f for f in SSH_FLAGS if command in f.commands]
    names = {f.name for f in flags}

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn, eval_str=True)
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != "ssh":
                params.append(param)
                continue
            kind = param.kind
            params += [
                inspect.Parameter(f.name, kind, default=f.default, annotation=f.annotated)
                for f in flags
            ]

        @functools.wraps(fn)
        def with_ssh_flags(**kwargs: Any) -> None:
            rest = {k: v for k, v in kwargs.items() if k not in names}
            fn(**rest, ssh=ssh_options({k: v for k, v in kwargs.items() if k in names}))

        with_ssh_flags.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_ssh_flags.__annotations__ = {p.name: p.annotation for p in params}
        return with_ssh_flags

    return decorate


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
