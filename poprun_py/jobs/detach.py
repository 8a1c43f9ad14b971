"""The client side of ``launch --detach``: hand the prepared job to a supervisor and return.

Where the supervisor runs (:func:`supervisor_host`): on the job's first host, reached over SSH
with the launch's own settings -- it then reaches the other hosts from there as an attached
launch does, so the client may vanish (SIGKILL, a cut network) and the job goes on. On this
machine for the local backend, and for a local-provider cluster (its hosts are network
namespaces of this machine, which the supervisor must be outside of to remove them with
``--down``).

What the supervisor gets (:func:`supervisor_record`): the job record with the launch's
options -- every LaunchOptions field, resolved so that it plans the same job there (backend,
working directory, the cluster spec's absolute path and its text, used where that path does
not exist), and under ``cli`` every other option the client does not apply itself
(:func:`poprun_py.cli.option_model.detached_cli`: ``--only-output-from-instance``,
``--keep-job-dir``, ...); the values of
``--env NAME`` secrets only in its environment, over the channel (never on disk, never in an
argv). ``--sync`` is done here first, from the client's files. With ``--check`` and spares,
the client runs the check and swaps failing hosts (the supervisor then runs on the first host
of the replaced set); under ``check``, the record says what it decided.

In per-node mode (:func:`detach_node`) every node's launcher detaches its own part: its
supervisor runs on that node, node 0's coordinating the job; the record carries the node's
identity as resolved and the secret file's path, never the secret.

Example::

    record = detach(prep, DetachOptions(output_dir=None, sync=False))
    print(record.id)        # c-20261201-120000-ab12

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> options = LaunchOptions(hosts="h1", program=("t",), env=("TOKEN",))
    >>> prep = prepare(options, environ={"TOKEN": "s3"})
    >>> secrets(prep)  # only for the supervisor's environment: never on disk nor in an argv
    {'TOKEN': 's3'}
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.core.backends import capabilities
from poprun_py.errors import UsageError
from poprun_py.jobs import registry
from poprun_py.jobs.place import JobHost, LocalJobHost, remote_job_host
from poprun_py.jobs.record import JobRecord, new_job_id, to_json

if TYPE_CHECKING:
    from poprun_py.core.spec import HostSpec
    from poprun_py.pernode.identity import NodeIdentity
    from poprun_py.prepare.job import LaunchOptions, Prepared


@dataclass(frozen=True)
class DetachOptions:
    """What ``launch`` adds to a detached job: its logs' directory, ``--sync``, with ``--down``
    the spec of the cluster to remove when the job ends, ``here`` when the cluster's hosts
    are this machine's (a local-provider cluster): the supervisor then runs here; ``cli``: the
    other options the supervisor applies, by parameter name; ``check``: what ``--check`` with
    spares decided (:meth:`~poprun_py.launch.check.Swapped.choices`: the supervisor runs the
    job on the same hosts, and checks a spare before a restart uses it)."""

    output_dir: str | None = None
    sync: bool = False
    down: str | None = None
    here: bool = False
    cli: Mapping[str, Any] = field(default_factory=dict)
    check: Mapping[str, Any] | None = None


def check_detachable(prep: Prepared) -> None:
    """UsageError (exit 2, nothing started) for a job that cannot be detached."""
    can = capabilities(prep.backend)
    if can.outlives_client:
        raise UsageError(
            f"--detach does not apply to the {prep.backend} backend: a batch job already "
            f"outlives its client (poprun-py render --backend {prep.backend} ... | sbatch)"
        )
    if can.runs_on_this_machine and not prep.plan.cluster.all_local:
        raise UsageError(
            f"--detach with --backend {prep.backend} needs every host to be this machine: "
            "use --backend ssh (or mpirun/mpiexec) for remote hosts"
        )


def supervisor_host(prep: Prepared, here: bool) -> HostSpec | None:
    """The host the supervisor runs on (None: this machine)."""
    provider = prep.plan.cluster.provider
    if here or prep.plan.cluster.all_local or capabilities(prep.backend).runs_on_this_machine:
        return None
    if provider is not None and provider.kind == "local":
        return None
    return prep.plan.hosts[0].spec


def detach_node(prep: Prepared, options: DetachOptions) -> JobRecord:
    """Per-node mode: this node's part goes to a supervisor on this machine, which runs it as
    an attached ``launch --node-rank K`` does (node 0's coordinates the job); returned once
    every instance runs (node 0) or node 0 accepted this node (any other). Identity, secret
    and node count are checked here first (exit 2, nothing started); the record carries the
    identity resolved and the secret file's path -- never the secret, which the supervisor
    reads as this launch does (the file, or ``POPRUN_SECRET`` in its environment)."""
    from poprun_py.pernode.node import checked_node

    if options.down is not None:
        raise UsageError("--down is not available in per-node mode (docs/per-node.md)")
    node, _ = checked_node(prep, sync=options.sync)
    record = supervisor_record(prep, options, "localhost", node=node)
    return _start(LocalJobHost(), record, prep)


def supervisor_record(
    prep: Prepared, options: DetachOptions, where: str, *, node: NodeIdentity | None = None
) -> JobRecord:
    """The record the supervisor starts from (see the module docstring); ``node``: this
    node's identity in per-node mode (its part: its own host, and the instances too on
    node 0, which has their output)."""
    opts = prep.options
    paths = _absolute_paths(opts)  # the cluster spec's among them
    cluster = paths.get("cluster")
    workdir = prep.plan.workdir or os.getcwd()
    resolved = replace(opts, backend=prep.backend, workdir=workdir, **paths)
    if node is not None:  # what the environment gave, as flags: the same node anywhere
        resolved = replace(
            resolved,
            node_rank=node.rank,
            nnodes=node.nnodes,
            coordinator=opts.coordinator or node.address,
        )
    extra: dict[str, Any] = {
        "launch": asdict(resolved),
        "output_dir": options.output_dir and os.path.abspath(options.output_dir),
        "down": options.down and os.path.abspath(options.down),
        "grace_period": prep.grace_period,
        "cli": dict(options.cli),
    }
    if options.check is not None:
        extra["check"] = dict(options.check)
    for key, path in (("cluster", cluster), ("down", extra["down"])):
        if path:
            extra[f"{key}_text"] = Path(path).read_text(encoding="utf-8")
    plan = prep.plan
    hosts, instances = tuple(h.name for h in plan.hosts), tuple(i.host for i in plan.instances)
    name = plan.cluster.name
    if node is not None:
        extra["per_node"] = {"rank": node.rank, "nnodes": node.nnodes, "coordinator": node.address}
        name = f"{name}-node{node.rank}"
        if node.rank:
            hosts, instances = hosts[node.rank : node.rank + 1], ()
    return JobRecord(
        id=new_job_id(name),
        hosts=hosts,
        backend=prep.backend,
        created=time.time(),
        supervisor=where,
        instances=instances,
        options=extra,
    )


def _absolute_paths(opts: LaunchOptions) -> dict[str, Any]:
    """The launch options that the option catalog marks as paths (``path``: ``"path"``, or
    ``"@"`` before a path), made absolute: the supervisor plans in the job's working
    directory, which need not be the client's."""
    from poprun_py.core.options import OPTIONS

    made: dict[str, Any] = {}
    for flag in OPTIONS.values():
        value = getattr(opts, flag.name, None) if flag.field and flag.path else None
        if not isinstance(value, str) or not value:
            continue
        if flag.path == "path":
            made[flag.name] = os.path.abspath(os.path.expanduser(value))
        elif value.startswith("@"):
            made[flag.name] = "@" + os.path.abspath(os.path.expanduser(value[1:]))
    return made


def secrets(prep: Prepared) -> dict[str, str]:
    """The ``--env NAME`` values, for the supervisor's environment only."""
    job = prep.job
    return {v.name: v.value for v in job.env if v.secret} if job is not None else {}


def detach(prep: Prepared, options: DetachOptions) -> JobRecord:
    """Start the job's supervisor; return its record once every instance runs (in per-node
    mode: :func:`detach_node`)."""
    from poprun_py.pernode.identity import wanted

    opts = prep.options
    if wanted(opts.node_rank, opts.nnodes, opts.coordinator, opts.per_node):
        return detach_node(prep, options)
    check_detachable(prep)
    host = supervisor_host(prep, options.here)
    record = supervisor_record(prep, options, host.name if host is not None else "localhost")
    if options.sync and host is not None:
        _sync(prep)
    if host is None:
        return _start(LocalJobHost(), record, prep)
    from poprun_py.ssh.settings import settings_for

    settings = settings_for(prep.plan.cluster, prep.options.ssh)
    with remote_job_host(host, settings) as remote:
        return _start(remote, record, prep)


def _start(host: JobHost, record: JobRecord, prep: Prepared) -> JobRecord:
    """Remember the job here first (a client killed meanwhile leaves a findable job), then
    start its supervisor."""
    opts = prep.options
    entry = registry.Entry(
        record.id,
        record.supervisor,
        cluster=record.options.get("launch", {}).get("cluster"),
        hosts=opts.hosts,
        ssh=asdict(opts.ssh),
        created=record.created,
    )
    registry.save(entry, cluster_text=record.options.get("cluster_text"))
    job_dir = host.start_supervisor(record.id, to_json(record), secrets(prep))
    return replace(record, job_dir=job_dir)


def _sync(prep: Prepared) -> None:
    """``--sync`` from here, before the supervisor starts (it has the client's files then)."""
    from poprun_py.launch.launcher import sync_root
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import settings_for
    from poprun_py.ssh.sync import sync

    hosts = [h.spec for h in prep.plan.hosts]
    with ConnectionPool(hosts, settings_for(prep.plan.cluster, prep.options.ssh)) as pool:
        sync(pool, [sync_root(prep.plan)], timeout=prep.long_run.timeout)
