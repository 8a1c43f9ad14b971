"""Preflight on real sshd test hosts: every fault of every host in one PreflightError (exit 3),
the NUMA topology discovered in the same round trip, and name-resolution warnings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.spec import HostSpec, JobSpec, cluster_from_hosts
from poprun_py.errors import PreflightError
from poprun_py.preflight.probes import Checks, format_faults, preflight
from poprun_py.prepare.discover import discover_local
from poprun_py.providers.netns import TestCluster
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings

pytestmark = pytest.mark.hosts


def pool_for(cluster: TestCluster, extra: list[HostSpec] | None = None) -> ConnectionPool:
    hosts = [HostSpec(h.name) for h in cluster.hosts] + (extra or [])
    return ConnectionPool(hosts, SshSettings(ssh_config=cluster.ssh_config, connect_timeout=2.0))


def test_every_fault_of_every_host_comes_in_one_error(test_cluster_4: TestCluster, tmp_path):
    first = test_cluster_4.hosts[0]
    unassigned = re.sub(r"\.\d+$", ".251", first.address)
    checks = Checks(
        workdir=str(tmp_path),
        commands=("python3", "no-such-program-xyz"),
        files=("train.py",),
    )
    pool = pool_for(test_cluster_4, [HostSpec("gone", address=unassigned)])
    with pool, pytest.raises(PreflightError) as err:
        preflight(pool, checks=checks)
    faults = err.value.faults
    per_host = {
        h.name: [f.detail for f in faults if f.host == h.name] for h in test_cluster_4.hosts
    }
    assert all(
        details
        == ["no-such-program-xyz: not found on PATH", f"train.py: no such file in {tmp_path}"]
        for details in per_host.values()
    ), per_host
    assert [(f.host, f.check) for f in faults if f.host == "gone"] == [("gone", "reachable")]
    assert len(faults) == 9
    assert err.value.exit_code == 3
    console = Console(width=200, record=True)
    console.print(format_faults(faults))
    table = console.export_text()
    assert "9 fault(s), nothing was started" in table
    assert table.count("no-such-program-xyz") == 4


def test_missing_workdir_is_reported_per_host(test_cluster_4: TestCluster, tmp_path):
    checks = Checks(workdir=str(tmp_path / "absent"), commands=("python3",), files=("t.py",))
    with pool_for(test_cluster_4) as pool, pytest.raises(PreflightError) as err:
        preflight(pool, checks=checks)
    assert {(f.host, f.check) for f in err.value.faults} == {
        (h.name, "workdir") for h in test_cluster_4.hosts
    }


def test_plan_passes_and_topology_is_discovered(test_cluster_4: TestCluster, tmp_path: Path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    cluster = cluster_from_hosts(parse_hosts(",".join(test_cluster_4.host_names)))
    job = JobSpec(("python3", "train.py"), replicas=4, workdir=str(tmp_path))
    plan = make_plan(cluster, job)
    with pool_for(test_cluster_4) as pool:
        report = preflight(pool, plan)
    local = discover_local()
    assert report.faults == ()
    assert report.topologies == {h.name: local for h in test_cluster_4.hosts}
    assert {h.topology_source for h in report.hosts} == {"sysfs"}
    assert all(h.resolve_seconds is not None and h.resolve_seconds < 0.5 for h in report.hosts)


def test_a_name_that_does_not_resolve_here_is_reported(test_cluster_4: TestCluster, tmp_path):
    host = test_cluster_4.hosts[0]
    alias = "zz-unresolvable-poprun"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {alias}\n  HostName {host.address}\n  User root\n"
        f"  IdentityFile {test_cluster_4.identity_file}\n"
        f"  UserKnownHostsFile {test_cluster_4.known_hosts}\n  HostKeyAlias {host.name}\n"
    )
    with ConnectionPool([HostSpec(alias)], SshSettings(ssh_config=config)) as pool:
        report = preflight(pool)
    assert report.faults == ()
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith(f"{alias} does not resolve on this machine")
    assert "addresses" in report.warnings[0]
