"""Pytest plugin: real test hosts (network namespaces + sshd) from poprun_py.providers.netns.

Enable with ``pytest_plugins = ["tests.hostfixtures"]`` in tests/conftest.py. Fixtures:

- ``test_cluster_4``: one 4-host TestCluster for the whole session.
- ``make_test_cluster``: a factory, ``make_test_cluster(n, prefix)``, for clusters that live
  for one test (``data_network=True``: a second, data network besides SSH's).
- ``data_cluster_3``: three hosts with a data network, for one module.

Example::

    def test_hostname(test_cluster_4):
        host = test_cluster_4.hosts[1]
        out = subprocess.run(["ssh", "-F", str(test_cluster_4.ssh_config), host.name, "hostname"],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == host.name

When test hosts cannot be created here (not root, no sshd, namespaces not permitted...), the
fixtures skip with the reason (what is missing and its Debian package: tests/requirements.py),
which is also printed in the terminal summary; with ``CI=true`` they fail instead. Every
cluster is destroyed at teardown, also when the test failed, and the teardown checks that none
of its namespaces, links or /etc/hosts lines remain.

Several pytest sessions may run at once on one machine, so names carry a per-session tag:
cluster ``pt<pid>-<prefix>`` with hosts ``<prefix><tag><i>`` (host names must be unique machine
wide); use ``cluster.hosts[i].name``, never a literal host name.

A killed session leaves its clusters and routes behind; the next session that asks for hosts
removes them. A session is dead when no process has its pid, or the process that has it started
at another time than the one recorded in ``<state root>/.sessions/<pid>`` (pids are reused): the
record is written before the session's first cluster, with every route the session adds.

Tests that cut this machine off some hosts add their routes with :func:`add_route` (removed with
:func:`delete_route`); routes of dead sessions, and any blackhole/prohibit/unreachable route to a
test network (198.18.0.0/15) that no cluster has any more, are removed before each new cluster.
:func:`session_leftovers` names what this session still has (tests/conftest.py checks it at the
end of the session).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from poprun_py.hostside.identity import identify
from poprun_py.providers.netns import (
    DEFAULT_STATE_ROOT,
    TestCluster,
    can_create_hosts,
    create_cluster,
    destroy_cluster,
    host_pids,
    list_clusters,
)
from tests import requirements

MakeCluster = Callable[..., TestCluster]

SESSIONS_DIR = DEFAULT_STATE_ROOT / ".sessions"  # one record per session that made hosts
TEST_NETS = (ipaddress.ip_network("198.18.0.0/15"),)  # the test hosts' networks (netns.py)
ROUTE_KINDS = ("blackhole", "prohibit", "unreachable")  # routes that cut this machine off hosts
NETNS_DIR = Path("/run/netns")

_SESSION_CLUSTER = re.compile(r"pt(\d+)-[a-z0-9]+")
_unavailable: set[str] = set()
_routes: set[tuple[str, str]] = set()  # (kind, address) this session added and still has


def session_tag() -> str:
    """This process's pid in letters, so host names stay ``[a-z][a-z0-9]*`` and unique."""
    pid, letters = os.getpid(), ""
    while True:
        pid, digit = divmod(pid, 26)
        letters = chr(ord("a") + digit) + letters
        if pid == 0:
            return letters


@functools.cache
def _why_no_hosts() -> str | None:
    return can_create_hosts()  # probes with a throwaway namespace: once per session


def require_hosts() -> None:
    """Skip the requesting test when no hosts can be created here, saying why (naming the
    Debian package of a missing tool); with CI=true tests/conftest.py makes it a failure."""
    requirements.require(*requirements.HOST_NEEDS)
    reason = _why_no_hosts()
    if reason is None:
        return
    message = f"cannot create test hosts: {reason}"
    _unavailable.add(message)
    pytest.skip(message)


# ---------------------------------------------------------------- sessions: alive or dead


def _record_path(pid: int) -> Path:
    return SESSIONS_DIR / str(pid)


def _read_record(pid: int) -> dict[str, object] | None:
    try:
        record = json.loads(_record_path(pid).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_record() -> None:
    """This session's record: its process's start time and the routes it has added."""
    me = identify(os.getpid())
    assert me is not None
    record = {"start": me[1], "routes": sorted(_routes)}
    SESSIONS_DIR.mkdir(parents=True, exist_ok=True)
    temporary = SESSIONS_DIR / f".{os.getpid()}.tmp"
    temporary.write_text(json.dumps(record) + "\n")
    temporary.replace(_record_path(os.getpid()))


def session_alive(pid: int) -> bool:
    """Whether the pytest session of ``pid`` still runs: a process has that pid, and it started
    when the session's record says (a pid reused by a later process is not that session). A
    session from before the records is judged by its pid alone."""
    now = identify(pid)
    if now is None:
        return False
    record = _read_record(pid)
    return record is None or record.get("start") == now[1]


@functools.cache
def register_session() -> None:
    """Once, before this session's first cluster: remove what dead sessions left (a dead one may
    have had this pid), then record this session, so that others can tell it lives."""
    _reap_stale_clusters()
    _write_record()


def forget_session() -> None:
    """Remove this session's record, once nothing of it is left (end of the session)."""
    if not session_leftovers():
        _record_path(os.getpid()).unlink(missing_ok=True)


# ---------------------------------------------------------------- routes to test hosts


def add_route(kind: str, address: str) -> None:
    """``ip route add KIND ADDRESS/32`` (``kind`` one of :data:`ROUTE_KINDS`): this machine's
    packets to ``address`` are dropped or refused until :func:`delete_route`. Recorded first, so
    that a killed session's route is removed by the next session."""
    if kind not in ROUTE_KINDS or not _in_test_nets(address):
        raise ValueError(f"not a test route: {kind} {address}")
    _routes.add((kind, address))
    _write_record()
    subprocess.run(["ip", "route", "add", kind, f"{address}/32"], check=True)


def delete_route(kind: str, address: str) -> None:
    """Remove a route of :func:`add_route`; raises when it was not there."""
    try:
        subprocess.run(["ip", "route", "del", kind, f"{address}/32"], check=True)
    finally:
        if (kind, address) not in _test_routes():
            _routes.discard((kind, address))
            _write_record()


def _in_test_nets(address: str) -> bool:
    return any(ipaddress.ip_address(address) in net for net in TEST_NETS)


def _test_routes() -> set[tuple[str, str]]:
    """(kind, address) of every route of :data:`ROUTE_KINDS` to one address of a test net."""
    if shutil.which("ip") is None:
        return set()
    found: set[tuple[str, str]] = set()
    for kind in ROUTE_KINDS:
        argv = ["ip", "-4", "-o", "route", "show", "type", kind]
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        for fields in (line.split() for line in out.splitlines()):
            one = len(fields) > 1 and fields[0] == kind and "/" not in fields[1]  # /32: bare
            if one and _in_test_nets(fields[1]):
                found.add((kind, fields[1]))
    return found


def _subnets_in_use() -> set[str]:
    """The /24s (``a.b.c``) that an interface of this namespace has an address in."""
    argv = ["ip", "-4", "-o", "addr", "show"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    return set(re.findall(r"inet (\d+\.\d+\.\d+)\.\d+/", out))


def _reap_stale_routes() -> None:
    """Remove the routes of dead sessions, and test routes whose /24 no cluster has any more
    (a session killed before its records: nothing else could have added them)."""
    stale: set[tuple[str, str]] = set()
    for pid in _recorded_sessions():
        if not session_alive(pid):  # this pid's too, when its record is another session's
            stale.update(_recorded_routes(pid))
    in_use = _subnets_in_use()
    existing = _test_routes()
    stale.update(r for r in existing if r[1].rsplit(".", 1)[0] not in in_use)
    for kind, address in stale & existing:
        subprocess.run(["ip", "route", "del", kind, f"{address}/32"], check=False)


def _recorded_routes(pid: int) -> set[tuple[str, str]]:
    routes = (_read_record(pid) or {}).get("routes")
    if not isinstance(routes, list):
        return set()
    return {(str(r[0]), str(r[1])) for r in routes if isinstance(r, list) and len(r) == 2}


def _recorded_sessions() -> list[int]:
    try:
        return [int(p.name) for p in SESSIONS_DIR.iterdir() if p.name.isdigit()]
    except OSError:
        return []


# ---------------------------------------------------------------- stale clusters


@functools.cache
def _reap_stale_clusters() -> None:
    """Destroy clusters of earlier pytest sessions that are dead (pid gone or reused), then
    forget those sessions."""
    for name in list_clusters(DEFAULT_STATE_ROOT):
        match = _SESSION_CLUSTER.fullmatch(name)
        if match and not session_alive(int(match.group(1))):
            destroy_cluster(name)
    _reap_stale_routes()
    for pid in _recorded_sessions():
        if pid != os.getpid() and not session_alive(pid):
            _record_path(pid).unlink(missing_ok=True)


def session_leftovers() -> list[str]:
    """What this session still has of test hosts: network namespaces and routes."""
    prefix = f"poprun-pt{os.getpid()}-"
    try:
        namespaces = sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except OSError:
        namespaces = []
    left = [f"network namespace {n}" for n in namespaces]
    left += [f"route {kind} {address}" for kind, address in sorted(_routes & _test_routes())]
    return left


def remove_session_leftovers() -> None:
    """Destroy this session's clusters and delete its routes (after a failed clean-up)."""
    for name in list_clusters(DEFAULT_STATE_ROOT):
        if name.startswith(f"pt{os.getpid()}-"):
            destroy_cluster(name)
    for kind, address in sorted(_routes & _test_routes()):
        subprocess.run(["ip", "route", "del", kind, f"{address}/32"], check=False)
    _routes.clear()
    if _record_path(os.getpid()).exists():
        _write_record()


def _assert_gone(cluster: TestCluster) -> None:
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    existing = {line.split()[0] for line in out.splitlines() if line.strip()}
    left = [h.netns for h in cluster.hosts if h.netns in existing]
    assert not left, f"namespaces of {cluster.name} left after destroy: {left}"
    assert all(host_pids(h.netns) == [] for h in cluster.hosts)
    link = subprocess.run(["ip", "link", "show", cluster.bridge], check=False, capture_output=True)
    assert link.returncode != 0, f"bridge {cluster.bridge} left after destroy"
    marker = f"# poprun-py testhosts {cluster.name}"
    assert not [line for line in Path("/etc/hosts").read_text().splitlines() if marker in line]
    assert cluster.name not in list_clusters(DEFAULT_STATE_ROOT)


class _Clusters:
    """Creates clusters for one scope and destroys every one of them at teardown."""

    def __init__(self) -> None:
        self.created: list[TestCluster] = []
        self.names: list[str] = []

    def make(self, num_hosts: int, prefix: str, *, data_network: bool = False) -> TestCluster:
        require_hosts()
        register_session()
        _reap_stale_routes()  # before each cluster: it may get the /24 of a dead session's route
        name = f"pt{os.getpid()}-{prefix}"
        self.names.append(name)
        host_prefix = f"{prefix}{session_tag()}"
        cluster = create_cluster(
            name, num_hosts, host_prefix=host_prefix, data_network=data_network
        )
        self.created.append(cluster)
        return cluster

    def destroy_all(self) -> None:
        errors: list[Exception] = []
        for name in self.names:
            try:
                destroy_cluster(name)
            except Exception as exc:  # destroy the others before reporting
                errors.append(exc)
        if errors:
            raise errors[0]
        for cluster in self.created:
            _assert_gone(cluster)


@pytest.fixture(scope="session")
def test_cluster_4() -> Iterator[TestCluster]:
    """Four real hosts (``h<tag>1``..``h<tag>4``) shared by the whole session."""
    clusters = _Clusters()
    try:
        yield clusters.make(4, "h")
    finally:
        clusters.destroy_all()


@pytest.fixture(scope="module")
def data_cluster_3() -> Iterator[TestCluster]:
    """Three hosts with a management (SSH) and a data network, shared by one test module."""
    clusters = _Clusters()
    try:
        yield clusters.make(3, "dn", data_network=True)
    finally:
        clusters.destroy_all()


@pytest.fixture
def make_test_cluster() -> Iterator[MakeCluster]:
    """``make_test_cluster(n, prefix, data_network=False)``: n fresh hosts, destroyed when the
    test ends; with ``data_network`` each also has a data interface (providers/netns_data.py).

    ``prefix`` is a letter then ``[a-z0-9]``, distinct per cluster within one test and from
    ``h`` (used by ``test_cluster_4``).
    """
    clusters = _Clusters()
    try:
        yield clusters.make
    finally:
        clusters.destroy_all()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why host tests were skipped, even without ``-rs``."""
    for message in sorted(_unavailable):
        terminalreporter.write_line(f"tests.hostfixtures: {message}", yellow=True)
