"""SSH from the providers' side: wait until every node answers, then run one step on each.

:func:`wait_for_ssh` retries each node (in parallel) until an SSH session runs ``true`` there,
or the timeout passes; then it names every node that never answered and why. The probe is a
parameter, so the retry logic is tested without a network and the real probe against real
test hosts. :func:`on_each_host` opens one connection per node and runs a function on each in
parallel, collecting every node's outcome before raising the first failure.

Example::

    wait_for_ssh(record.host_specs(), known_hosts="/state/demo.known_hosts",
                 accept_new_host_keys=True, timeout=600)
    outcomes = on_each_host(record.host_specs(), ssh_settings(known_hosts=...),
                            lambda conn, host: conn.run(["hostname"]).stdout)

Run as a doctest (tests/unit/test_docstrings.py)::

    >>> from poprun_py.core.spec import HostSpec
    >>> hosts = [HostSpec("n1"), HostSpec("n2")]
    >>> wait_for_ssh(hosts, known_hosts=None, timeout=5, probe=lambda host: None)  # all answer
    >>> def probe(host):  # the real one runs `true` over SSH; raising means "not yet"
    ...     if host.name == "n2":
    ...         raise OSError("connection refused")
    >>> wait_for_ssh(hosts, known_hosts=None, timeout=0.2, interval=0.05, probe=probe)
    Traceback (most recent call last):
    ...
    poprun_py.errors.ProvisionError: n2 did not answer SSH within 0.2s: connection refused
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from poprun_py.core.spec import ClusterSpec, SshOptions
from poprun_py.errors import PoprunError, ProvisionError
from poprun_py.providers.base import NullReporter, ProvisionContext, Reporter

if TYPE_CHECKING:
    from poprun_py.core.spec import HostSpec
    from poprun_py.providers.records import ProvisionRecord
    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.settings import SshSettings

Probe = Callable[["HostSpec"], None]  # raises when the host does not answer (yet)
CONNECT_TIMEOUT = 10.0
MAX_THREADS = 32
_T = TypeVar("_T")
STEP = "waiting for SSH"


def ssh_settings(
    *,
    known_hosts: str | None,
    accept_new_host_keys: bool = False,
    ssh_config: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    flags: SshOptions | None = None,
) -> SshSettings:
    """Transport settings for provisioned nodes, by the one builder
    (:func:`~poprun_py.ssh.settings.settings_for`): ``up``/``down``'s SSH flags first (as every
    remote command takes them; :func:`~poprun_py.providers.lifecycle.up` puts the spec's
    ``defaults.connect_timeout`` among them), then what the provider recorded, then
    ``connect_timeout``; identity and user otherwise come with each host. New host keys are
    accepted if the flags or the provider (``accept_new_host_keys``: fresh machines) say so."""
    from poprun_py.ssh.settings import settings_for

    flags = flags or SshOptions()
    recorded = ClusterSpec(name="", hosts=(), known_hosts=known_hosts, ssh_config=ssh_config)
    trust = flags.accept_new_host_keys or accept_new_host_keys
    return settings_for(
        recorded, replace(flags, accept_new_host_keys=trust), fallback_timeout=connect_timeout
    )


class ProbeFatal(ProvisionError):
    """A probe failure that waiting cannot cure (a refused host key): stop retrying."""


def ssh_probe(settings: SshSettings) -> Probe:
    """A probe that opens an SSH connection to the host and runs ``true`` there."""
    from poprun_py.ssh.connect import connect
    from poprun_py.ssh.errors import HostKeyError

    def probe(host: HostSpec) -> None:
        try:
            conn = connect(host, settings)
        except HostKeyError as exc:
            raise ProbeFatal(str(exc)) from exc
        try:
            result = conn.run(["true"], timeout=settings.connect_timeout + 5.0)
        finally:
            conn.close()
        if result.exit_code != 0:
            raise ProvisionError(f"`true` exited with {result.exit_code}")

    return probe


def wait_for_record(
    record: ProvisionRecord,
    ctx: ProvisionContext,
    timeout: float,
    *,
    accept_new_host_keys: bool = False,
    ssh_config: str | None = None,
) -> bool:
    """:func:`wait_for_ssh` on a provisioned cluster's hosts, with its known_hosts and the
    command's SSH flags, for ``ctx.wait_timeout`` (else ``timeout``) seconds; True."""
    wait_for_ssh(
        record.host_specs(),
        known_hosts=record.known_hosts,
        accept_new_host_keys=accept_new_host_keys,
        ssh_config=ssh_config,
        timeout=ctx.wait_timeout or timeout,
        reporter=ctx.reporter,
        flags=ctx.ssh,
    )
    return True


def wait_for_ssh(
    hosts: Sequence[HostSpec],
    *,
    known_hosts: str | None,
    accept_new_host_keys: bool = False,
    ssh_config: str | None = None,
    timeout: float,
    reporter: Reporter | None = None,
    interval: float = 1.0,
    probe: Probe | None = None,
    flags: SshOptions | None = None,
) -> None:
    """Block until every host answers SSH; ProvisionError naming the ones that never did."""
    if probe is None:
        settings = ssh_settings(
            known_hosts=known_hosts,
            accept_new_host_keys=accept_new_host_keys,
            ssh_config=ssh_config,
            connect_timeout=min(CONNECT_TIMEOUT, max(timeout, 1.0)),
            flags=flags,
        )
        probe = ssh_probe(settings)
    report = reporter or NullReporter()
    report.start(STEP, len(hosts))
    lock = threading.Lock()
    deadline = time.monotonic() + timeout

    def one(host: HostSpec) -> str | None:
        error = _retry(probe, host, deadline, interval)
        if error is None:
            with lock:
                report.advance(STEP)
        return error

    errors = _parallel(one, hosts)
    failed = [(h.name, e) for h, e in zip(hosts, errors, strict=True) if e is not None]
    if failed:
        first_host, first_error = failed[0]
        more = f" (and {len(failed) - 1} more: {', '.join(n for n, _ in failed[1:])})"
        raise ProvisionError(
            f"{first_host} did not answer SSH within {timeout:g}s: {first_error}"
            + (more if len(failed) > 1 else "")
        )


def _retry(probe: Probe, host: HostSpec, deadline: float, interval: float) -> str | None:
    """Probe until success (None) or the deadline (the last error, one line)."""
    while True:
        try:
            probe(host)
            return None
        except Exception as exc:  # any failure means "not yet"; the last one is reported
            error = " ".join(str(exc).split()) or type(exc).__name__
            fatal = isinstance(exc, ProbeFatal)
        if fatal or time.monotonic() + interval > deadline:
            return error
        time.sleep(interval)


def _parallel(fn: Callable[[HostSpec], _T], hosts: Sequence[HostSpec]) -> list[_T]:
    """``[fn(h) for h in hosts]`` on threads; all finish before the first error is raised."""
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(hosts), MAX_THREADS)) as pool:
        futures = [pool.submit(fn, host) for host in hosts]
        wait(futures)
    return [future.result() for future in futures]


def on_each_host(
    hosts: Sequence[HostSpec], settings: SshSettings, fn: Callable[[Connection, HostSpec], _T]
) -> tuple[_T, ...]:
    """Open a connection to every host and run ``fn(connection, host)`` on each, in parallel."""
    from poprun_py.ssh.pool import ConnectionPool

    try:
        with ConnectionPool(list(hosts), settings) as pool:
            conns = pool.open_all()
            return tuple(_parallel(lambda host: fn(conns[host.name], host), hosts))
    except ProvisionError:
        raise
    except PoprunError as exc:  # e.g. the transport's own error for an unreachable host
        raise ProvisionError(str(exc)) from exc
