"""``launch --up [--down]``: FastGPU's whole cycle in one command.

``--up`` brings the spec's ``provider:`` cluster up (as ``poprun-py up``: a cluster that is up is
reused, its setup runs where it changed), then the launch runs on the hosts of the inventory
``up`` wrote, with ``--sync`` (the program's directory is pushed first). ``--down`` removes the
cluster when the job ends: succeeded, failed or interrupted (Ctrl-C, SIGTERM, SIGHUP); the exit
code is still the job's. Without ``--down`` the cluster stays up for the next launch.

    $ poprun-py launch -c clusters/testhosts-4.yaml --up --down python examples/train.py

Example (no ``--up``: the options pass through untouched):

    >>> from poprun_py.prepare.job import LaunchOptions
    >>> with cycle(LaunchOptions(program=("t.py",)), OneKey(), "launch") as opts:
    ...     print(opts.cluster)
    None
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from poprun_py.errors import PoprunError, ProvisionError, UsageError

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec
    from poprun_py.prepare.job import LaunchOptions
    from poprun_py.providers.base import Provider


@dataclass(frozen=True)
class OneKey:
    """The one-key flags of ``launch``."""

    up: bool = False
    down: bool = False
    yes: bool = False
    detach: bool = False  # the job's supervisor removes the cluster (--down) when it ends


@contextlib.contextmanager
def cycle(
    opts: LaunchOptions, keys: OneKey, mode: str, dry_run: bool = False
) -> Iterator[LaunchOptions]:
    """Yield the options to launch with: unchanged without ``--up``; else, once the cluster is
    up, the same options on the inventory ``up`` wrote. With ``--down`` the cluster is removed
    afterwards whatever happened (the job's error, if any, goes on unchanged). Bad flags raise
    UsageError before anything is created."""
    if not (keys.up or keys.down):
        yield opts
        return
    from poprun_py.cli.provision_cmd import confirmed_provider

    spec = checked(opts, keys, mode, dry_run)
    assert opts.cluster is not None
    provider = confirmed_provider(spec, keys.yes)
    try:
        inventory = bring_up(spec, opts, provider)
        yield replace(opts, cluster=str(inventory))
    except BaseException:
        _end(spec, opts, keys.down, failed=True)
        raise
    if keys.detach and keys.down:
        sys.stderr.write(f"poprun-py: cluster {spec.name} is removed when the job ends\n")
        return
    _end(spec, opts, keys.down, failed=False)


def checked(opts: LaunchOptions, keys: OneKey, mode: str, dry_run: bool) -> ClusterSpec:
    """The spec to bring up; UsageError (exit 2, nothing created) for flags that do not fit."""
    from poprun_py.prepare.specfile import load_cluster

    flag = "--up" if keys.up else "--down"
    if mode != "launch":
        raise UsageError(f"{flag} is an option of launch only, not of {mode}")
    if opts.cluster is None:
        raise UsageError(f"{flag} needs --cluster/-c SPEC: a cluster spec with a provider: block")
    spec = load_cluster(opts.cluster)
    if spec.provider is None:
        raise UsageError(
            f"{flag} needs a cluster spec with a provider: block, and {opts.cluster} has none "
            "(launch on its hosts without --up)"
        )
    if not keys.up:
        raise UsageError(
            "--down needs --up (launch -c SPEC --up --down PROGRAM); "
            f"`poprun-py down {opts.cluster}` removes a cluster that is up"
        )
    if opts.hosts is not None:
        raise UsageError("--up launches on the hosts up provides: drop --hosts (or use --exclude)")
    if dry_run:
        raise UsageError(
            "--dry-run starts nothing and --up creates machines: drop one "
            f"(`poprun-py plan -c {opts.cluster}` shows the plan)"
        )
    return spec


def bring_up(spec: ClusterSpec, opts: LaunchOptions, provider: Provider) -> Path:
    """``poprun-py up`` for the spec, with the launch's SSH flags; the inventory's path.
    Ctrl-C, SIGTERM and SIGHUP interrupt it (KeyboardInterrupt), so ``--down`` still runs."""
    from poprun_py.cli.provision_cmd import cluster_up
    from poprun_py.process.signals import interrupting

    with interrupting():
        ssh = replace(opts.ssh, accept_new_host_keys=False)
        result = cluster_up(spec, provider, accept_new_host_keys=opts.accept_new_host_keys, ssh=ssh)
    return result.inventory


def take_down(spec: ClusterSpec, opts: LaunchOptions) -> None:
    """``poprun-py down`` for the spec (no signal cuts it short), with the launch's SSH flags."""
    from poprun_py.cli.provision_cmd import cluster_down

    ssh = replace(opts.ssh, accept_new_host_keys=False)
    cluster_down(spec, accept_new_host_keys=opts.accept_new_host_keys, ssh=ssh, hold_signals=True)


def _end(spec: ClusterSpec, opts: LaunchOptions, down: bool, failed: bool) -> None:
    """Tear down (``--down``) or say how to; a failed teardown is the error only when the job
    itself succeeded, else it is one more line and the job's error goes on."""
    assert opts.cluster is not None
    again = f"`poprun-py down {opts.cluster}`"
    if not down:
        sys.stderr.write(f"poprun-py: cluster {spec.name} stays up; {again} removes it\n")
        return
    try:
        take_down(spec, opts)
    except PoprunError as exc:
        message = f"tearing down cluster {spec.name} failed: {exc}; run {again}"
        if not failed:
            raise ProvisionError(message) from exc
        sys.stderr.write(f"poprun-py: error: {message}\n")
