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
wide); use ``cluster.hosts[i].name``, never a literal host name. Clusters left behind by killed
sessions (whose pid is gone) are destroyed when the next session first asks for hosts.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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

_SESSION_CLUSTER = re.compile(r"pt(\d+)-[a-z0-9]+")
_unavailable: set[str] = set()


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


@functools.cache
def _reap_stale_clusters() -> None:
    """Destroy clusters of earlier pytest sessions whose process no longer exists."""
    for name in list_clusters(DEFAULT_STATE_ROOT):
        match = _SESSION_CLUSTER.fullmatch(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            destroy_cluster(name)


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
        _reap_stale_clusters()
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
