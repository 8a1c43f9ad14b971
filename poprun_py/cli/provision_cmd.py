"""``poprun-py up``, ``down`` and ``status``: provision a cluster, remove it, list clusters.

``up`` prints the inventory path on stdout (progress and notes go to stderr), so it composes:

    $ poprun-py up clusters/testhosts-4.yaml
    $ poprun-py launch --cluster "$(poprun-py up clusters/testhosts-4.yaml)" python train.py
    $ poprun-py status
    $ poprun-py down clusters/testhosts-4.yaml

A provider that costs money (aws) asks for confirmation first; ``--yes`` skips the question, and
without a terminal to ask on and without ``--yes``, ``up`` refuses (exit 2).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from poprun_py.cli import options as o
from poprun_py.cli.app import app, console
from poprun_py.cli.examples import epilog
from poprun_py.errors import UsageError

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec
    from poprun_py.providers.base import Provider
    from poprun_py.providers.lifecycle import ClusterStatus, UpResult


class RichReporter:
    """Progress bars on stderr (rich.progress), one per step; notes printed above them."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
        )
        self.tasks: dict[str, Any] = {}

    def start(self, step: str, total: int) -> None:
        """A new bar for ``step``."""
        self.tasks[step] = self.progress.add_task(step, total=total)

    def advance(self, step: str, amount: int = 1) -> None:
        """Move the bar of ``step``."""
        if step in self.tasks:
            self.progress.advance(self.tasks[step], amount)

    def note(self, message: str) -> None:
        """One line above the bars."""
        self.progress.console.print(message, markup=False, highlight=False)

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _load(path: str) -> ClusterSpec:
    from poprun_py.prepare.specfile import load_cluster

    return load_cluster(path)


def confirm_cost(notice: str, yes: bool) -> None:
    """Ask before spending money; refuse without a terminal unless ``--yes``."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(
            "up would create machines that cost money and there is no terminal to ask: "
            "pass --yes to confirm"
        )
    sys.stderr.write(notice + "\n")
    if not typer.confirm("Proceed?", default=False, err=True):
        raise UsageError("not confirmed: nothing was created")


def confirmed_provider(spec: ClusterSpec, yes: bool) -> Provider:
    """The spec's provider, once a cost it announces is confirmed (``--yes`` or a terminal)."""
    from poprun_py.providers.lifecycle import provider_for

    provider = provider_for(spec)
    notice = provider.cost_notice(spec)
    if notice:
        confirm_cost(notice, yes)
    return provider


def cluster_up(spec: ClusterSpec, provider: Provider, **options: Any) -> UpResult:
    """``up`` with its progress shown, then one line on stderr: the cluster is up, how many
    nodes, how long, where setup ran."""
    from poprun_py.providers.lifecycle import up

    started = time.monotonic()
    with RichReporter() as reporter:
        result = up(spec, reporter=reporter, provider=provider, **options)
    ran = sum(o.ran for o in result.setup)
    setup = f"; setup ran on {ran}, unchanged on {len(result.setup) - ran}" if result.setup else ""
    sys.stderr.write(
        f"poprun-py: cluster {spec.name} is up: {len(result.record.nodes)} node(s) "
        f"({result.record.provider}) in {time.monotonic() - started:.1f}s{setup}\n"
    )
    return result


def cluster_down(spec: ClusterSpec, **options: Any) -> None:
    """``down`` with its progress shown, then one line on stderr: the cluster is down, how
    long it took, what was removed."""
    from poprun_py.providers.lifecycle import down

    started = time.monotonic()
    with RichReporter() as reporter:
        result = down(spec, reporter=reporter, **options)
    what = ", ".join(f"{r.kind} {r.id}" for r in result.removed) or "nothing to remove"
    sys.stderr.write(
        f"poprun-py: cluster {spec.name} is down in {time.monotonic() - started:.1f}s: {what}\n"
    )


@app.command("up", epilog=epilog("up"))
@o.takes("up")
def up_command(
    cluster: str,
    yes: bool = False,
    accept_new_host_keys: bool = False,
    wait_timeout: float | None = None,
    ssh: o.Ssh = o.SSH_HERE,
) -> None:
    """Create the cluster's nodes, wait for SSH, run its setup script, write the inventory."""
    spec = _load(cluster)
    options = {"accept_new_host_keys": accept_new_host_keys, "ssh": ssh}
    result = cluster_up(spec, confirmed_provider(spec, yes), wait_timeout=wait_timeout, **options)
    sys.stdout.write(f"{result.inventory}\n")


@app.command("down", epilog=epilog("down"))
@o.takes("down")
def down_command(
    cluster: str,
    accept_new_host_keys: bool = False,
    ssh: o.Ssh = o.SSH_HERE,
) -> None:
    """Remove everything poprun-py created for the cluster (harmless when nothing exists)."""
    cluster_down(_spec_or_name(cluster), accept_new_host_keys=accept_new_host_keys, ssh=ssh)


def _spec_or_name(cluster: str) -> ClusterSpec:
    """The spec file ``cluster``, or the spec recorded for the cluster named ``cluster``."""
    from poprun_py.providers.lifecycle import spec_from_record
    from poprun_py.providers.state import ClusterState

    if Path(cluster).is_file() or cluster.endswith((".yaml", ".yml")):
        return _load(cluster)
    record = ClusterState.of(cluster).load()
    if record is None:
        raise UsageError(f"{cluster!r} is neither a spec file nor a cluster with a state file")
    return spec_from_record(record)


@app.command("status", epilog=epilog("status"))
@o.takes("status")
def status_command(cluster: str | None = None, refresh: bool = True, fmt: str = "table") -> None:
    """List provisioned clusters and their nodes."""
    from poprun_py.providers.lifecycle import status

    if fmt not in ("table", "json"):
        raise UsageError(f"--format must be table or json, got {fmt!r}")
    wanted = _load(cluster).name if cluster and Path(cluster).is_file() else cluster
    rows = [s for s in status(refresh=refresh) if wanted is None or s.record.cluster == wanted]
    if fmt == "json":
        json.dump([_status_dict(s) for s in rows], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if not rows:
        sys.stderr.write("poprun-py: no provisioned clusters\n")
        return
    from poprun_py.core import look

    lines = look.bold_header(_status_table(rows), look.use_colour(sys.stdout))
    look.write_lines(sys.stdout, lines)


def _status_dict(s: ClusterStatus) -> dict[str, Any]:
    return {
        "cluster": s.record.cluster,
        "provider": s.record.provider,
        "phase": s.record.phase,
        "inventory": str(s.inventory) if s.inventory else None,
        "error": s.error,
        "nodes": [
            {"name": n.name, "address": n.address, "state": n.state, "id": n.resource_id}
            for n in s.nodes
        ],
    }


def _status_table(rows: list[ClusterStatus]) -> list[str]:
    """The one table style (:mod:`poprun_py.core.look`); nothing is cut: ids are copied."""
    from poprun_py.core.look import table_lines

    table: list[list[str]] = []
    for s in rows:
        head = [s.record.cluster, s.record.provider, s.record.phase]
        if not s.nodes:
            table.append([*head, "-", "-", s.error or "-", "-"])
        for i, n in enumerate(s.nodes):
            state = f"{n.state} ({s.error})" if s.error and i == 0 else n.state
            table.append(
                [*(head if i == 0 else ["", "", ""]), n.name, n.address, state, n.resource_id]
            )
    columns = ("cluster", "provider", "phase", "node", "address", "state", "id")
    return table_lines(columns, table)
