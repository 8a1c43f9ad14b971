"""The option catalog, as data: each option and argument of every command (``plan``/``render``/
``launch``/``check``, then the others' own) described once in :data:`OPTIONS` (flags, type,
default, range, help, spec key, the commands that take it, how it passes into the Slurm batch
job and a detached job's record). :mod:`poprun_py.cli.options` makes typer parameters of it,
:mod:`poprun_py.prepare.specfile` the spec's ``defaults:`` schema (:data:`SPEC_DEFAULTS`).

Example:

    >>> OPTIONS["host_timeout"].spec_key, SPEC_DEFAULTS["master_port"].most
    ('defaults.host_timeout', 65535)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional, Union, get_args

from poprun_py.core.backends import REGISTRY

H_SIZE, H_HOSTS, H_RUN, H_OUT, H_SSH = "Sizes", "Hosts", "Running", "Output", "SSH"
H_HW, H_SLURM, H_LONG, H_ONE_KEY = "Hardware and network", "Slurm", "Long runs", "Provisioning"
H_K8S = "Kubernetes"
H_NODE = "Per node"
PER_NODE = (
    "per-node mode runs a launcher on every node; the batch job's one launch starts every "
    "node with srun (and render does not take it)"
)
"""Why the Slurm batch job does not get the per-node options."""
PER_NODE_COMMANDS = ("launch", "check")
"""The commands that run in per-node mode (``check``: node 0 checks the joined nodes)."""
LAUNCHING = ("plan", "render", "launch", "check")
REMOTE = (*LAUNCHING, "exec", "sync")
EVERY = (*REMOTE, "jobs", "up", "down")
TARGETING = (*REMOTE, "jobs", "logs", "stop", "wait")
"""Commands naming their hosts with ``--hosts``/``--cluster``."""

Str = Optional[str]  # noqa: UP045 - typer needs Optional on 3.10
Int = Optional[int]  # noqa: UP045
Float = Optional[float]  # noqa: UP045
Bool = Optional[bool]  # noqa: UP045 - --x/--no-x: None when neither is given
Strs = Optional[list[str]]  # noqa: UP045 - repeatable
REQUIRED: Any = ...
"""The default of an argument that must be given."""


@dataclass(frozen=True)
class Flag:
    """One option: its parameter name, flags (none: the ``PROGRAM`` argument), type, default,
    help panel and help; the cluster spec key it comes before; the commands that take it;
    why the Slurm batch job's ``launch`` does not get it (``batch``) and why a detached job's
    record leaves it out (``detach``), empty when they do; ``field``: it is a
    :class:`~poprun_py.prepare.job.LaunchOptions` field (else the record's ``cli`` part);
    ``path``: ``"path"`` or ``"@"`` (a path after ``@``) is made absolute when passed on;
    ``duration``: the value is a duration (90s, 45m, 2h, or seconds): seconds for a float
    option, the checked text for a str one (``slurm_time``: Slurm's forms, or a duration made
    Slurm's, :data:`~poprun_py.cli.durations.SLURM_TIME`). The spec's value: ``least`` to ``most``
    (a duration: over 0, or 0 too if ``least=0``), one of ``choices``, a list (``words``). The
    help says the default in words (typer's ``[default: ...]`` is off: one default shown, once).
    ``key``: the catalog's key where another command's parameter of that name means something
    else (default: ``name``); ``default=REQUIRED``: an argument that must be given."""

    name: str
    decls: tuple[str, ...]
    type: Any
    default: Any
    panel: str | None
    help: str
    spec_key: str | None = None
    commands: tuple[str, ...] = LAUNCHING
    batch: str = ""
    detach: str = ""
    field: bool = True
    metavar: str | None = None
    path: str = ""
    duration: bool = False
    least: int | None = None
    most: int | None = None
    choices: tuple[str, ...] = ()
    words: bool = False
    key: str = ""

    @property
    def base(self) -> Any:
        """The type without ``Optional``: ``int``, ``bool``, ``list[str]``..."""
        args = [a for a in get_args(self.type) if a is not type(None)]
        return args[0] if args and getattr(self.type, "__origin__", None) is Union else self.type

    @property
    def many(self) -> bool:
        """Repeatable: a list given, a tuple in LaunchOptions."""
        return getattr(self.base, "__origin__", None) is list


# fmt: off
_ENTRIES = (
    Flag("program", (), Strs, None, None, "The program and its arguments; everything after "
         "PROGRAM is passed on.", batch="it goes last, after '--'"),
    Flag("hosts", ("--hosts", "-H"), Str, None, H_HOSTS, "Hosts: h1,h2 | node[01-16] | "
         "@hostfile ('host slots=N'). Default: the cluster spec's hosts, else the Slurm "
         "allocation, else localhost.", "hosts", TARGETING, path="@",
         batch="passed on only when the batch job asks for those very nodes (--nodelist); "
         "otherwise the allocation's nodes are the hosts"),
    Flag("cluster", ("--cluster", "-c"), Str, None, H_HOSTS, "Cluster spec YAML file.",
         commands=TARGETING, path="path"),
    Flag("replicas", ("--replicas", "-r"), Int, None, H_SIZE, "Total replicas (default: one "
         "per instance).", "defaults.replicas", least=1),
    Flag("instances", ("--instances", "-n"), Int, None, H_SIZE, "Total instances (default: "
         "hostfile slots, else one per host).", "defaults.instances", least=1),
    Flag("devices_per_replica", ("--devices-per-replica", "-d"), Int, None, H_SIZE, "Devices "
         "per replica (default 1).", "defaults.devices_per_replica", least=0),
    Flag("numa_aware", ("--numa-aware/--no-numa-aware",), Bool, None, H_SIZE, "Bind instances "
         "to their share of each host's NUMA nodes (default on).", "defaults.numa_aware"),
    Flag("group_size", ("--group-size", "-g"), Int, None, H_SIZE, "Replica groups of this "
         "size, kept within a host when possible.", "defaults.group_size", least=1),
    Flag("inputs", ("--input", "-i"), Strs, None, H_SIZE, "Input files: a glob (repeatable), "
         "a directory (every file under it) or @manifest ('path [size]' lines)."),
    Flag("eval_pad", ("--eval-pad",), Int, None, H_SIZE, "Pad inputs so every instance gets "
         "the same number of whole batches.", metavar="BATCH"),
    Flag("strict_shards", ("--strict-shards/--no-strict-shards",), Bool, None, H_SIZE,
         "Refuse (exit 2) input shards the plan notes as uneven: an instance with no files, "
         "or the largest shard over 2x the smallest (default: the spec's, else off).",
         "defaults.strict_shards"),
    Flag("env", ("--env", "-e"), Strs, None, H_RUN, "KEY=VALUE for every instance "
         "(repeatable); KEY alone passes the caller's value as a secret, never printed.", "env"),
    Flag("backend", ("--backend", "-b"), Str, None, H_RUN, f"{' | '.join(REGISTRY)} (default: "
         "local when every host is this machine, slurm inside an allocation, else ssh; k8s "
         "is only rendered: a manifest for kubectl apply).", "defaults.backend",
         choices=tuple(REGISTRY),
         batch="the batch job runs with --backend slurm, whatever render was given",
         detach="the record's launch options carry the backend the client resolved"),
    Flag("workdir", ("--workdir",), Str, None, H_RUN, "Working directory of every instance.",
         "workdir"),
    Flag("master_port", ("--master-port",), Int, None, H_RUN, "MASTER_PORT (default: a free "
         "port locally, 29500 on remote hosts).", "defaults.master_port", least=1, most=65535),
    Flag("mpi_args", ("--mpi-args",), Str, None, H_RUN, "Extra launcher options (mpirun, "
         "mpiexec, srun), as one string (split like a shell would).", "defaults.mpi_args",
         words=True),
    Flag("templates", ("--templates",), Str, None, H_RUN, "Directory of Jinja2 templates "
         "overriding the packaged ones by name.", path="path"),
    Flag("grace_period", ("--grace-period",), Float, None, H_RUN, "Time between SIGTERM and "
         "SIGKILL when stopping instances (default: the spec's, else 5s).",
         "defaults.grace_period", duration=True, least=0),
    Flag("host_timeout", ("--host-timeout",), Str, None, H_RUN, "A host silent this long (90s, "
         "45m, 2h, or seconds) is lost, and its agent stops its instances when poprun-py is "
         "silent this long (default: the spec's, else 3m). A closed connection is noticed at "
         "once.", "defaults.host_timeout", duration=True),
    Flag("connect_timeout", ("--connect-timeout",), Float, None, H_SSH, "SSH connect timeout "
         "(default: the cluster spec's, else 10s).", "defaults.connect_timeout", EVERY,
         duration=True),
    Flag("accept_new_host_keys", ("--accept-new-host-keys",), bool, False, H_SSH, "Record "
         "unknown SSH host keys (a changed key is always refused).", None,
         REMOTE),  # up and down have their own: the provider's trust in fresh static nodes
    Flag("known_hosts", ("--known-hosts",), Str, None, H_SSH, "Extra known_hosts file "
         "(default: the cluster spec's, then ~/.ssh).", "ssh.known_hosts", EVERY, path="path"),
    Flag("ssh_config", ("--ssh-config",), Str, None, H_SSH, "ssh_config file (default: the "
         "cluster spec's, else ~/.ssh/config).", "ssh.ssh_config", EVERY, path="path"),
    Flag("ssh_client", ("--ssh-client",), Str, None, H_SSH, "auto | paramiko | openssh: the "
         "SSH transport (default: the cluster spec's, else auto: OpenSSH's ssh for a host whose "
         "ssh configuration needs it, such as host-based or GSSAPI authentication or "
         "KnownHostsCommand, else Paramiko).", "ssh.client", EVERY),
    Flag("fanout", ("--fanout",), Int, None, H_SSH, "Connect to K hosts only, the gateways: "
         "each starts the others' agents and commands over its own OpenSSH client (a tree, "
         "as Open MPI's tree spawn; needs SSH between the hosts). Default: flat, every host "
         "from here.", None, (*LAUNCHING, "exec"), least=1,
         batch="the batch job's srun reaches its nodes without SSH"),
    Flag("identity", ("--identity",), Str, None, H_SSH, "Private key for hosts that name none.",
         None, EVERY, path="path"),
    Flag("user", ("--user", "-l"), Str, None, H_SSH, "Login user for hosts that name none.",
         None, EVERY),
    Flag("sync", ("--sync",), bool, False, H_RUN, "Push the program's directory to every host "
         "before launching.", field=False,
         detach="the client pushes its files before the supervisor starts"),
    Flag("fmt", ("--format", "-f"), str, "table", H_OUT, "table | json (default table)", None,
         (*LAUNCHING, "jobs", "status"), field=False,
         batch="it says how render prints (a batch script is printed for table only)",
         detach="it says how the client prints the job's id"),
    Flag("output_dir", ("--output-dir", "-o"), Str, None, H_OUT, "Write one log per instance "
         "(instance-N.log) and the job files here.", field=False, path="path",
         detach="the record carries it, made absolute"),
    Flag("only_output_from_instance", ("--only-output-from-instance",), Int, None, H_OUT,
         "Show only this instance's stdout (every instance's errors still show).", field=False),
    Flag("dry_run", ("--dry-run",), bool, False, H_OUT, "Print the plan and the commands; start "
         "nothing.", field=False,
         batch="a dry run prints the plan, never a batch script: the batch job is the launch",
         detach="a dry run never detaches"),
    Flag("keep_job_dir", ("--keep-job-dir",), bool, False, H_OUT, "Keep the job's directory "
         "(shard lists, hostfile) after a successful launch; it is removed otherwise (always "
         "kept after a failure, and with --output-dir).", field=False),
    Flag("print_topology", ("--print-topology",), bool, False, H_OUT, "Print the topology table "
         "before launching.", field=False,
         detach="the client prints the topology before it detaches"),
    Flag("slurm_time", ("--time",), Str, None, H_SLURM, "Time limit of the allocation "
         "--backend slurm asks for: Slurm's own (30 minutes, 1:00:00, 1-12) or a duration "
         "(90s, 45m, 2h)."),
    Flag("slurm_partition", ("--partition",), Str, None, H_SLURM, "Slurm partition to allocate "
         "from."),
    Flag("slurm_account", ("--account",), Str, None, H_SLURM, "Slurm account to charge."),
    Flag("k8s_image", ("--image",), Str, None, H_K8S, "render --backend k8s: the pods' "
         "container image, with poprun-py and the program (required there).",
         commands=("render",), field=False),
    Flag("k8s_kind", ("--k8s-kind",), str, "jobset", H_K8S, "render --backend k8s: jobset "
         "(a JobSet, jobset.x-k8s.io/v1alpha2) or job (an Indexed Job with a headless "
         "Service); default jobset.", commands=("render",), field=False),
    Flag("k8s_name", ("--k8s-name",), Str, None, H_K8S, "render --backend k8s: the name of "
         "the JobSet or Job, and its pods' subdomain (default: poprun-PROGRAM, as a DNS label).",
         commands=("render",), field=False),
    Flag("network", ("--network",), Str, None, H_HW, "The network instances talk on (e.g. "
         "10.1.0.0/16): per host the interface with an address in it sets MASTER_ADDR, "
         "GLOO/NCCL_SOCKET_IFNAME and MPI's interface (default: the spec's network:).",
         "network", metavar="CIDR"),
    Flag("device_env", ("--device-env",), Str, None, H_HW, "The variable that lists each "
         "instance's devices (default: CUDA_VISIBLE_DEVICES for NVIDIA, ROCR/HIP_VISIBLE_DEVICES "
         "for AMD, the topology's device_env:).", "hosts[].topology.device_env", metavar="NAME"),
    Flag("nic_affinity", ("--nic-affinity/--no-nic-affinity",), Bool, None, H_HW, "Give each "
         "instance the RDMA NICs of its NUMA node (NCCL_IB_HCA, UCX_NET_DEVICES)."),
    Flag("exclude", ("--exclude", "-x"), Str, None, H_HOSTS, "Hosts to leave out "
         "(h3,node[07-08]) of the spec, hostfile or Slurm allocation.", metavar="HOSTS"),
    Flag("check", ("--check",), bool, False, H_RUN, "Run `poprun-py check` on the planned "
         "instances first; launch only if it passes.", field=False,
         detach="the client runs the check before it detaches"),
    Flag("check_timeout", ("--check-timeout",), float, 5.0, H_RUN, "How long the check waits "
         "for every instance (default 5s).", field=False, detach="with --check, on the client",
         duration=True),
    Flag("check_torch", ("--check-torch",), bool, False, H_RUN, "The check also runs a "
         "torch.distributed Gloo all-reduce where torch is importable (importing torch costs "
         "each instance about a second).", field=False, detach="with --check, on the client"),
    Flag("max_restarts", ("--max-restarts",), Int, None, H_LONG, "Restart the whole job up to N "
         "times after a failure (an instance failed, a host was lost, a hang, the time limit); "
         "never after Ctrl-C/SIGTERM. Instances see POPRUN_RESTART_COUNT and "
         "TORCHELASTIC_RESTART_COUNT (default: spec, else 0).", "defaults.max_restarts",
         least=0),
    Flag("restart_delay", ("--restart-delay",), Float, None, H_LONG, "Time before a restart "
         "(default: the spec's, else 0).", "defaults.restart_delay", duration=True,
         least=0),
    Flag("timeout", ("--timeout",), Str, None, H_LONG, "Stop an attempt running longer than "
         "this (90s, 45m, 2h): 'timed out', exit 124 (default: the spec's, else no limit).",
         "defaults.timeout", duration=True),
    Flag("hang_timeout", ("--hang-timeout",), Float, None, H_LONG, "An instance without output "
         "(or poprun_py.dist.heartbeat()) this long is hung: its stacks are dumped into the "
         "logs, then the job stops (exit 124; default: the spec's, else never).",
         "defaults.hang_timeout", duration=True),
    Flag("min_progress", ("--min-progress",), Int, None, H_LONG, "Restart only an attempt "
         "that advanced at least N steps beyond the last one (poprun_py.dist.heartbeat(step=N), "
         "or --progress-file written); else stop with the attempt's exit code.",
         "defaults.min_progress", metavar="N", least=1),
    Flag("progress_file", ("--progress-file",), Str, None, H_LONG, "A checkpoint on this "
         "machine (or a filesystem it shares): an attempt that wrote it (its modification time "
         "advanced) made progress, for --min-progress.", "defaults.progress_file",
         path="path", metavar="PATH"),
    Flag("forward_signals", ("--forward-signals",), Str, None, H_LONG, "Signals to poprun-py "
         "passed on to every instance, the job going on (default USR1,USR2; from HUP, USR1, "
         "USR2). A forwarded HUP no longer stops the job. The first one is the instance's "
         "POPRUN_CHECKPOINT_SIGNAL (poprun_py.dist.on_checkpoint).", "defaults.forward_signals",
         metavar="SIGS"),
    Flag("spare_hosts", ("--spare-hosts",), Str, None, H_LONG, "Hosts held back to replace a "
         "lost one on a restart: host syntax, or N (the last N hosts given). Default: the "
         "spec's spares.", "spares", path="@"),
    Flag("detach", ("--detach",), bool, False, H_LONG, "Hand the job to a supervisor on its "
         "first host (this machine for --backend local) and return once every instance runs, "
         "printing the job id; the job keeps every rule without this client. See `jobs`, "
         "`logs`, `stop`, `wait`.", field=False,
         batch="the slurm backend refuses it: a batch job already outlives its client",
         detach="the supervisor runs the job attached, in a session of its own"),
    Flag("up", ("--up",), bool, False, H_ONE_KEY, "Bring the -c spec's provider: cluster up "
         "first (reused when it is up), push the program's directory (--sync), and launch on "
         "its hosts.", field=False,
         batch="launch only (render refuses it): provisioning happens on the client, around "
         "a job", detach="the client brings the cluster up; the record's spec is the inventory"),
    Flag("down", ("--down",), bool, False, H_ONE_KEY, "With --up: remove the cluster when the "
         "job ends (succeeded, failed or interrupted); the exit code stays the job's.",
         field=False, batch="launch only (render refuses it), with --up",
         detach="the record carries the spec to remove (its path and text)"),
    Flag("yes", ("--yes", "-y"), bool, False, H_ONE_KEY, "With --up: do not ask before creating "
         "machines that cost money.", field=False,
         batch="launch only, with --up: it answers the client's cost prompt",
         detach="it answers the client's cost prompt"),
    Flag("node_rank", ("--node-rank",), Int, None, H_NODE, "Per-node mode (every node runs "
         "this launch, no SSH between nodes; docs/per-node.md): this node's rank, 0 to N-1 "
         "(default: the environment's).", commands=PER_NODE_COMMANDS, batch=PER_NODE,
         metavar="K"),
    Flag("nnodes", ("--nnodes",), Int, None, H_NODE, "Per-node mode: the number of nodes, one "
         "per host of the plan (default: the environment's).", commands=PER_NODE_COMMANDS,
         batch=PER_NODE, metavar="N"),
    Flag("coordinator", ("--coordinator",), Str, None, H_NODE, "Per-node mode: node 0's "
         "address, which every node joins; port 29400 unless given (default: the "
         "environment's).",
         commands=PER_NODE_COMMANDS, batch=PER_NODE, metavar="HOST[:PORT]"),
    Flag("per_node", ("--per-node",), bool, False, H_NODE, "Per-node mode, the node's rank, "
         "the node count and the coordinator all from the environment (POPRUN_*, Kubeflow's "
         "PET_*, JOB_COMPLETION_INDEX, Slurm's, Open MPI's).", commands=PER_NODE_COMMANDS,
         batch=PER_NODE),
    Flag("join_timeout", ("--join-timeout",), float, 120.0, H_NODE, "Per-node mode: how long "
         "the coordinator waits for every node to join, and a node for the coordinator "
         "(default 2m).", commands=PER_NODE_COMMANDS, batch=PER_NODE,
         duration=True),
    Flag("secret_file", ("--secret-file",), Str, None, H_NODE, "Per-node mode: the file "
         "holding the secret every node shares (mode 600; default: POPRUN_SECRET_FILE's file, "
         "else POPRUN_SECRET). Never the secret itself in argv.", commands=PER_NODE_COMMANDS,
         batch=PER_NODE, path="path", metavar="PATH"),
)
PYTHON = Flag("python", (), Str, None, None, "The Python that runs a .py PROGRAM.",
              "defaults.python", (), field=False)  # a spec key with no flag
JOB = ("logs", "stop", "wait", "supervise")
_OWN = (  # the other commands' own options and arguments (none a LaunchOptions field)
    Flag("command", (), list[str], REQUIRED, None, "The command and its arguments (put them "
         "after --).", commands=("exec",)),
    Flag("paths", (), Strs, None, None, "Files or directories to push (default: the current "
         "directory).", commands=("sync",)),
    Flag("gather", ("--gather",), bool, False, None, "Fold hosts with identical output (like "
         "clush -b).", commands=("exec",)),
    Flag("timeout", ("--timeout", "-t"), Float, None, None, "Stop the command on a host running "
         "longer than this (90s, 45m, 2h, or seconds); that host exits 124 (default: no limit).",
         commands=("exec",), duration=True, key="exec_timeout"),
    Flag("dest", ("--dest",), Str, None, None, "Remote directory to push into (default: the "
         "same paths).", commands=("sync",)),
    Flag("method", ("--method",), str, "auto", None, "auto (rsync where both ends have it) | "
         "rsync | sftp (default auto)", commands=("sync",)),
    Flag("timeout", ("--timeout", "-t"), Str, None, None, "Stop pushing to a host still at it "
         "after this long (90s, 45m, 2h, or seconds); that host fails the sync (default: no "
         "limit).", commands=("sync",), duration=True, key="sync_timeout"),
    Flag("prune", ("--prune",), bool, False, None, "Remove the ended detached jobs (their "
         "directories on their supervisor hosts, and this machine's record of them) instead of "
         "listing them.", commands=("jobs",)),
    Flag("older_than", ("--older-than",), Str, None, None, "With --prune: only jobs that ended "
         "at least this long ago (90s, 45m, 2h, 7d).", commands=("jobs",), duration=True),
    Flag("job_id", (), str, REQUIRED, None, "The job id `launch --detach` printed.",
         commands=JOB),
    Flag("follow", ("--follow",), bool, False, None, "Follow the output until the job ends.",
         commands=("logs",)),
    Flag("instance", ("--instance",), Int, None, None, "Only this instance's output (its log).",
         commands=("logs",)),
    Flag("cluster", (), str, REQUIRED, None, "Cluster spec YAML with a provider: block (down "
         "also takes a cluster name).", commands=("up", "down"), key="spec"),
    Flag("yes", ("--yes", "-y"), bool, False, None, "Do not ask before creating machines that "
         "cost money.", commands=("up",), key="up_yes"),  # launch's: with --up, in its panel
    Flag("accept_new_host_keys", ("--accept-new-host-keys",), bool, False, None, "static nodes: "
         "record unknown SSH host keys (a changed key is always refused).",
         commands=("up", "down"), key="static_host_keys"),  # not the SSH group's: see above
    Flag("wait_timeout", ("--wait-timeout",), Float, None, None, "How long to wait for nodes to "
         "run and answer SSH (90s, 45m, 2h, or seconds; default: local/static 30s, aws 15m).",
         commands=("up",), duration=True),
    Flag("cluster", (), Str, None, None, "Only this cluster (name or spec file).",
         commands=("status",), key="status_cluster"),
    Flag("refresh", ("--refresh/--no-refresh",), bool, True, None, "Ask the providers for node "
         "states (default --refresh).", commands=("status",)),
)
# fmt: on
OPTIONS: Mapping[str, Flag] = {
    f.key or f.name: f for f in (*_ENTRIES, *(replace(f, field=False) for f in _OWN))
}
"""Every option, by its key (its parameter name unless two commands' parameters of one name
differ), in the order ``plan``/``render``/``launch``/``check`` take them (and their help lists
them), then the other commands' own."""

SPEC_DEFAULTS: Mapping[str, Flag] = {
    f.spec_key.removeprefix("defaults."): f
    for f in (*_ENTRIES, PYTHON)
    if f.spec_key and f.spec_key.startswith("defaults.")
}
"""The cluster spec's ``defaults:`` keys, each with its entry (``python``: a key only)."""


def taken_by(command: str, entries: Mapping[str, Flag] = OPTIONS) -> list[Flag]:
    """The options ``command`` takes, in order."""
    return [f for f in entries.values() if command in f.commands]
