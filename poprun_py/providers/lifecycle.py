"""``up``, ``down`` and ``status``: the steps every provider shares, in one place.

``up``: the provider creates (or finds) the nodes, saving the state file after each resource;
every node must answer SSH; the spec's setup script runs where its digest changed; the inventory
is written next to the state file. ``down``: the provider removes everything, found by name or
tag when the state file is incomplete or gone, then the state files go; running it twice is
harmless (``hold_signals=True``: no signal cuts it short, for the end of a job).
``status``: every cluster with a state file, its nodes refreshed from the provider.

Example (as root, with the local provider)::

    from poprun_py.prepare.specfile import load_cluster
    result = up(load_cluster("clusters/testhosts-4.yaml"))
    print(result.inventory)       # ~/.local/state/poprun-py/clusters/testhosts-4.inventory.yaml
    down(load_cluster("clusters/testhosts-4.yaml"))

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.core.spec import ClusterSpec, HostSpec
    >>> provider_for(ClusterSpec(name="c", hosts=(HostSpec("h1"),))).name  # no provider block
    'static'
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

from poprun_py.core.spec import ClusterSpec, ProviderSpec, SshOptions
from poprun_py.errors import PoprunError, ProvisionError
from poprun_py.providers import get_provider
from poprun_py.providers.base import NullReporter, Provider, ProvisionContext, Reporter
from poprun_py.providers.inventory import inventory_text
from poprun_py.providers.records import Node, ProvisionRecord, Resource
from poprun_py.providers.setup import SetupOutcome, run_setup, script_digest
from poprun_py.providers.state import ClusterState, list_states, write_private
from poprun_py.ssh.settings import connect_timeout_for


@dataclass(frozen=True)
class UpResult:
    """What ``up`` left behind."""

    record: ProvisionRecord
    inventory: Path
    reachable: bool  # False when the provider skipped SSH (test-only setting)
    setup: tuple[SetupOutcome, ...] = ()


@dataclass(frozen=True)
class DownResult:
    """What ``down`` removed (empty when nothing existed)."""

    cluster: str
    removed: tuple[Resource, ...] = ()
    had_state: bool = False


@dataclass(frozen=True)
class ClusterStatus:
    """One cluster for ``status``: its record and its nodes as the provider sees them now."""

    record: ProvisionRecord
    nodes: tuple[Node, ...] = ()
    error: str | None = None  # why the provider could not be asked (nodes are then recorded)
    inventory: Path | None = None


def provider_for(spec: ClusterSpec) -> Provider:
    """The provider the spec names (``static`` when it has no ``provider:`` block)."""
    return get_provider((spec.provider or ProviderSpec()).kind)


def up(
    spec: ClusterSpec,
    *,
    reporter: Reporter | None = None,
    root: Path | None = None,
    wait_timeout: float | None = None,
    accept_new_host_keys: bool = False,
    provider: Provider | None = None,
    ssh: SshOptions | None = None,
) -> UpResult:
    """Create or reuse the cluster's nodes, wait for SSH, run setup, write the inventory.
    ``ssh``: the SSH flags, before what the provider recorded (as every remote command)."""
    provider = provider or provider_for(spec)
    state = ClusterState.of(spec.name, root)
    flags = _flags(spec, ssh)  # before anything is created: a bad --connect-timeout is exit 2
    ctx = ProvisionContext(
        state, reporter or NullReporter(), wait_timeout, accept_new_host_keys, flags
    )
    record = provider.create(spec, ctx)
    reachable = provider.wait_until_reachable(record, ctx)
    outcomes: tuple[SetupOutcome, ...] = ()
    if reachable and spec.setup:
        outcomes = _setup(spec, record, ctx)
        record = replace(record, setup_sha256=script_digest(spec.setup))
    write_private(state.inventory_path, inventory_text(spec, record))
    record = replace(record, phase="ready")
    state.save(record)
    return UpResult(record, state.inventory_path, reachable, outcomes)


def _flags(spec: ClusterSpec, ssh: SshOptions | None) -> SshOptions:
    """The SSH flags the provider's steps get: as given, with the spec's
    ``defaults.connect_timeout`` when ``--connect-timeout`` is not (the steps take the rest of
    the spec's side from what the provider recorded: ``reach.ssh_settings``)."""
    flags = ssh or SshOptions()
    return replace(flags, connect_timeout=connect_timeout_for(spec, flags.connect_timeout))


def _setup(
    spec: ClusterSpec, record: ProvisionRecord, ctx: ProvisionContext
) -> tuple[SetupOutcome, ...]:
    from poprun_py.providers.reach import ssh_settings

    assert spec.setup is not None
    settings = ssh_settings(
        known_hosts=record.known_hosts, ssh_config=record.ssh_config, flags=ctx.ssh
    )
    return run_setup(record.host_specs(), spec.name, spec.setup, settings, ctx.reporter)


def down(
    spec: ClusterSpec,
    *,
    reporter: Reporter | None = None,
    root: Path | None = None,
    accept_new_host_keys: bool = False,
    provider: Provider | None = None,
    ssh: SshOptions | None = None,
    hold_signals: bool = False,
) -> DownResult:
    """Remove everything ``up`` created for ``spec``; harmless when nothing exists.
    ``hold_signals``: no Ctrl-C, SIGTERM or SIGHUP cuts it short (each is only noted) -- for
    whatever removes a cluster when its job ends (``launch --up --down``, a supervisor)."""
    provider = provider or provider_for(spec)
    state = ClusterState.of(spec.name, root)
    ctx = ProvisionContext(
        state,
        reporter or NullReporter(),
        accept_new_host_keys=accept_new_host_keys,
        ssh=_flags(spec, ssh),
    )
    with _held(spec, ctx.reporter) if hold_signals else contextlib.nullcontext():
        try:
            record = state.load()
        except ProvisionError as exc:  # a damaged state file: fall back to names and tags
            ctx.reporter.note(f"{exc}; finding resources by name/tag instead")
            record = None
        removed = provider.terminate(spec, record, ctx)
        state.remove()
    return DownResult(spec.name, removed, record is not None)


def _held(spec: ClusterSpec, reporter: Reporter) -> contextlib.AbstractContextManager[object]:
    """Stop signals noted, not obeyed, until the teardown is done."""
    from poprun_py.process.signals import deferring

    def still(signum: int) -> None:
        reporter.note(f"signal {signum}: still tearing down cluster {spec.name}; it will finish")

    return deferring(still)


def spec_from_record(record: ProvisionRecord) -> ClusterSpec:
    """A minimal spec for ``down NAME`` when the spec file is not at hand."""
    hosts = record.host_specs() if record.provider == "static" else ()
    return ClusterSpec(
        name=record.cluster,
        hosts=hosts,
        provider=record.provider_spec(),
        known_hosts=record.known_hosts,
        ssh_config=record.ssh_config,
    )


def status(root: Path | None = None, *, refresh: bool = True) -> list[ClusterStatus]:
    """Every cluster with a state file; nodes refreshed from the provider when ``refresh``."""
    out: list[ClusterStatus] = []
    for state in list_states(root):
        try:
            record = state.load()
        except ProvisionError as exc:
            out.append(ClusterStatus(ProvisionRecord(state.name, "?"), error=str(exc)))
            continue
        if record is None:
            continue
        inventory = state.inventory_path if state.inventory_path.exists() else None
        out.append(_status_of(record, inventory, refresh))
    return out


def _status_of(record: ProvisionRecord, inventory: Path | None, refresh: bool) -> ClusterStatus:
    if not refresh:
        return ClusterStatus(record, record.nodes, inventory=inventory)
    try:
        nodes = get_provider(record.provider).list_nodes(record)
    except PoprunError as exc:
        return ClusterStatus(record, record.nodes, error=str(exc), inventory=inventory)
    return ClusterStatus(record, nodes, inventory=inventory)
