"""The cluster spec's ``ssh:`` settings and the SSH flags, on real sshd test hosts through the
real command line: ``-c spec.yaml --hosts ...`` keeps the spec's ``ssh_config`` and
``known_hosts`` for launch, exec and sync (they used to be dropped), and ``launch`` takes
``--ssh-config``/``--identity``/``--user`` as exec and sync do. Nothing is left on any host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.helpers import settled

pytestmark = pytest.mark.hosts


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def write_spec(
    cluster: TestCluster, tmp_path: Path, ssh: dict[str, object], addresses: bool
) -> Path:
    """A spec naming every test host; the hosts' addresses only when ``addresses``."""
    hosts = [
        f"  - {{name: {h.name}" + (f", address: {h.address}}}" if addresses else "}")
        for h in cluster.hosts
    ]
    lines = [f"name: {cluster.name}", "ssh:", *(f"  {k}: {v}" for k, v in ssh.items())]
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join([*lines, "hosts:", *hosts, "defaults: {connect_timeout: 5}"]) + "\n")
    return path


def config_spec(cluster: TestCluster, tmp_path: Path) -> Path:
    """Only the spec's ssh_config says how to reach the hosts (their names do not resolve)."""
    return write_spec(cluster, tmp_path, {"ssh_config": cluster.ssh_config}, addresses=False)


def known_hosts_spec(cluster: TestCluster, tmp_path: Path) -> Path:
    """Addresses, key and user in the spec; its known_hosts is the only one holding their keys."""
    ssh = {
        "known_hosts": cluster.known_hosts,
        "identity_file": cluster.identity_file,
        "user": "root",
    }
    return write_spec(cluster, tmp_path, ssh, addresses=True)


def show_host() -> list[str]:
    return ["--", "sh", "-c", 'echo "$RANK $(hostname)"']


def test_launch_with_spec_and_hosts_uses_the_specs_ssh_config(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = config_spec(test_cluster_4, tmp_path)
    h = test_cluster_4.host_names
    proc = poprun("launch", "-c", str(spec), "--hosts", f"{h[1]},{h[3]}", "-b", "ssh",
                  *show_host(), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"[{h[1]}:0] 0 {h[1]}" in proc.stdout and f"[{h[3]}:1] 1 {h[3]}" in proc.stdout
    assert settled(test_cluster_4) == {}


def test_launch_with_spec_and_hosts_uses_the_specs_known_hosts(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = known_hosts_spec(test_cluster_4, tmp_path)
    h = test_cluster_4.host_names
    proc = poprun("launch", "-c", str(spec), "--hosts", h[2], "-b", "ssh", *show_host(),
                  cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"[{h[2]}:0] 0 {h[2]}" in proc.stdout
    assert settled(test_cluster_4) == {}


def test_exec_and_sync_with_spec_and_hosts_use_the_specs_ssh_settings(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    h = test_cluster_4.host_names
    for spec in (config_spec(test_cluster_4, tmp_path), known_hosts_spec(test_cluster_4, tmp_path)):
        proc = poprun("exec", "-c", str(spec), "--hosts", f"{h[0]},{h[2]}", "--", "hostname",
                      cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == [f"{h[0]}: {h[0]}", f"{h[2]}: {h[2]}"]
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "f.txt").write_text("x")
    dest = f"/tmp/poprun-sshopt-{os.getpid()}"
    try:
        proc = poprun("sync", "-c", str(config_spec(test_cluster_4, tmp_path)), "--hosts", h[1],
                      "--dest", dest, str(payload), cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "synced 1 file(s) to 1 host(s)" in proc.stderr
    finally:
        subprocess.run(["rm", "-rf", dest], check=False)
    assert settled(test_cluster_4) == {}


def test_launch_takes_the_ssh_options_exec_and_sync_take(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    h = test_cluster_4.host_names
    a = [host.address for host in test_cluster_4.hosts]
    by_config = poprun("launch", "--hosts", f"{h[0]},{h[1]}", "-b", "ssh", "--ssh-config",
                       str(test_cluster_4.ssh_config), *show_host(), cwd=tmp_path)  # fmt: skip
    assert by_config.returncode == 0, by_config.stderr
    assert f"[{h[1]}:1] 1 {h[1]}" in by_config.stdout
    key, known = str(test_cluster_4.identity_file), str(test_cluster_4.known_hosts)
    flags = ["--identity", key, "--user", "root",
             "--known-hosts", known, "--connect-timeout", "5"]  # fmt: skip
    by_flags = poprun("launch", "--hosts", a[3], "-b", "ssh", *flags, *show_host(), cwd=tmp_path)
    assert by_flags.returncode == 0, by_flags.stderr
    assert f"0 {h[3]}" in by_flags.stdout
    wrong_user = poprun("launch", "--hosts", a[3], "-b", "ssh", *flags, "--user", "nobody-here",
                        *show_host(), cwd=tmp_path)  # fmt: skip
    assert wrong_user.returncode == 3, wrong_user.stderr  # --user reached the transport
    assert settled(test_cluster_4) == {}


def test_preflight_warnings_are_shown_one_line_each_before_the_launch(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    host = test_cluster_4.hosts[0]
    alias = "zz-unresolvable-poprun"  # reachable through ssh_config, unknown to this machine
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {alias}\n  HostName {host.address}\n  User root\n"
        f"  IdentityFile {test_cluster_4.identity_file}\n"
        f"  UserKnownHostsFile {test_cluster_4.known_hosts}\n  HostKeyAlias {host.name}\n"
    )
    for backend in ("mpirun", "ssh"):  # mpirun resolves the names itself; ssh goes by HostName
        proc = poprun("launch", "--hosts", alias, "-b", backend, "--ssh-config", str(config),
                      "--", "sh", "-c", "echo started >&2", cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lines = proc.stderr.splitlines()
        warnings = [i for i, line in enumerate(lines) if line.startswith("poprun-py: warning: ")]
        assert len(warnings) == (backend == "mpirun"), proc.stderr
        if backend == "mpirun":
            assert lines[warnings[0]].startswith(f"poprun-py: warning: {alias} does not resolve")
            assert warnings[0] < lines.index(f"[{alias}:0] started")
        assert settled(test_cluster_4) == {}
