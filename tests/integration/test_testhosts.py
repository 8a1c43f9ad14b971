"""Real test hosts: namespaces, sshd, addresses, reachability, process tracking and teardown."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from poprun_py.errors import ProvisionError
from poprun_py.process.proctree import alive as live_pids
from poprun_py.providers.netns import (
    TestCluster,
    create_cluster,
    destroy_cluster,
    host_pids,
    list_clusters,
    load_cluster,
)
from tests.hostfixtures import MakeCluster

pytestmark = pytest.mark.hosts


def ssh(cluster: TestCluster, host: str, command: str) -> str:
    proc = subprocess.run(
        ["ssh", "-F", str(cluster.ssh_config), host, command],
        check=False,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, f"ssh {host} {command!r}: {proc.returncode} {proc.stderr}"
    return proc.stdout


def ssh_all(cluster: TestCluster, command: str) -> dict[str, str]:
    """Run ``command`` on every host at once; host name -> stdout."""
    argv = ["ssh", "-F", str(cluster.ssh_config)]
    procs = {
        h.name: subprocess.Popen([*argv, h.name, command], stdout=subprocess.PIPE, text=True)
        for h in cluster.hosts
    }
    outs = {name: proc.communicate(timeout=20)[0] for name, proc in procs.items()}
    assert all(proc.returncode == 0 for proc in procs.values()), outs
    return outs


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return (
        subprocess.run(["ip", "link", "show", name], check=False, capture_output=True).returncode
        == 0
    )


def hosts_lines(cluster_name: str) -> list[str]:
    marker = f"# poprun-py testhosts {cluster_name}"
    return [line for line in Path("/etc/hosts").read_text().splitlines() if line.endswith(marker)]


def alive(pid: int) -> bool:
    """A zombie counts as dead: PID 1 here reaps daemonized children late."""
    return bool(live_pids({pid}))


def start_sleeper(cluster: TestCluster, host: str) -> int:
    return int(ssh(cluster, host, "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"))


def test_cluster_shape(test_cluster_4: TestCluster) -> None:
    cluster = test_cluster_4
    assert len(cluster.hosts) == 4
    assert len({h.address for h in cluster.hosts}) == 4
    assert all(h.address.startswith("198.18.") and h.port == 22 for h in cluster.hosts)
    assert cluster.subnet.startswith("198.18.") and cluster.subnet.endswith(".0/24")
    assert {h.netns for h in cluster.hosts} <= netns_names()
    assert link_exists(cluster.bridge)
    assert sorted(hosts_lines(cluster.name)) == sorted(
        f"{h.address} {h.name} # poprun-py testhosts {cluster.name}" for h in cluster.hosts
    )
    assert all(alive(h.sshd_pid) and h.sshd_pid in host_pids(h.netns) for h in cluster.hosts)
    assert load_cluster(cluster.name) == cluster
    assert cluster.name in list_clusters()


def test_ssh_hostname_is_the_host_name(test_cluster_4: TestCluster) -> None:
    outs = ssh_all(test_cluster_4, "hostname")
    assert {name: out.strip() for name, out in outs.items()} == {
        h.name: h.name for h in test_cluster_4.hosts
    }


def test_each_host_sees_its_own_address(test_cluster_4: TestCluster) -> None:
    outs = ssh_all(test_cluster_4, "ip -4 -o addr show scope global")
    for host in test_cluster_4.hosts:
        assert f"inet {host.address}/24" in outs[host.name]
        assert outs[host.name].count("inet ") == 1, outs[host.name]


def test_hosts_reach_each_other(test_cluster_4: TestCluster) -> None:
    cluster = test_cluster_4
    first, third, fourth = cluster.hosts[0], cluster.hosts[2], cluster.hosts[3]
    nested = f"ssh -F {cluster.ssh_config} {third.name} hostname"
    assert ssh(cluster, first.name, nested).strip() == third.name
    banner = f"exec 3<>/dev/tcp/{fourth.name}/22 && head -c 8 <&3"
    assert ssh(cluster, first.name, f"bash -c '{banner}'") == "SSH-2.0-"


@pytest.mark.requires("ping")  # a named skip without ping (a failure with CI=true)
def test_hosts_ping_each_other(test_cluster_4: TestCluster) -> None:
    first, fourth = test_cluster_4.hosts[0], test_cluster_4.hosts[3]
    assert " 0% packet loss" in ssh(test_cluster_4, first.name, f"ping -c 1 -W 2 {fourth.name}")


def test_process_on_a_host_shows_in_host_pids(test_cluster_4: TestCluster) -> None:
    second, third = test_cluster_4.hosts[1], test_cluster_4.hosts[2]
    pid = start_sleeper(test_cluster_4, second.name)
    try:
        assert pid in host_pids(second.netns)
        assert pid not in host_pids(third.netns)
    finally:
        ssh(test_cluster_4, second.name, f"kill {pid}")


def test_destroy_removes_everything_and_is_idempotent(make_test_cluster: MakeCluster) -> None:
    cluster = make_test_cluster(2, "d")
    sleeper = start_sleeper(cluster, cluster.hosts[0].name)
    destroy_cluster(cluster.name)
    assert not {h.netns for h in cluster.hosts} & netns_names()
    assert not link_exists(cluster.bridge)
    assert hosts_lines(cluster.name) == []
    assert not [pid for pid in [sleeper, *(h.sshd_pid for h in cluster.hosts)] if alive(pid)]
    assert not cluster.state_dir.exists()
    assert cluster.name not in list_clusters()
    destroy_cluster(cluster.name)  # twice is harmless


def test_destroy_by_name_after_state_dir_is_lost(make_test_cluster: MakeCluster) -> None:
    cluster = make_test_cluster(2, "lost")
    shutil.rmtree(cluster.state_dir)
    destroy_cluster(cluster.name)
    assert not {h.netns for h in cluster.hosts} & netns_names()
    assert not link_exists(cluster.bridge)
    assert hosts_lines(cluster.name) == []
    assert not [h for h in cluster.hosts if alive(h.sshd_pid)]


def test_destroy_finds_a_bare_namespace_by_name(test_cluster_4: TestCluster) -> None:
    name = f"{test_cluster_4.name}-bare"
    subprocess.run(["ip", "netns", "add", f"poprun-{name}-orphan1"], check=True)
    assert name in list_clusters()
    destroy_cluster(name)
    assert f"poprun-{name}-orphan1" not in netns_names()


def test_create_refuses_bad_or_taken_names(test_cluster_4: TestCluster) -> None:
    taken_prefix = test_cluster_4.hosts[0].name[:-1]
    with pytest.raises(ProvisionError, match="already exists"):
        create_cluster(test_cluster_4.name, 1, host_prefix="zz")
    with pytest.raises(ProvisionError, match="already in use"):
        create_cluster(f"{test_cluster_4.name}-dup", 1, host_prefix=taken_prefix)
    with pytest.raises(ProvisionError, match="bad test cluster name"):
        create_cluster("Bad_Name", 1)
    with pytest.raises(ProvisionError, match="bad host prefix"):
        create_cluster(f"{test_cluster_4.name}-x", 1, host_prefix="h-1")
    assert ssh(test_cluster_4, test_cluster_4.hosts[0].name, "hostname").strip()
