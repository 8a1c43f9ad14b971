"""The SSH transport against real sshd test hosts: parallel connections reused for every command,
host-key checking (mismatch, unknown, accept-new), auth and reachability faults, byte-exact
arguments, secrets kept out of every argv, and timeouts that leave nothing running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.errors import PreflightError
from poprun_py.preflight.probes import preflight
from poprun_py.providers.netns import TestCluster
from poprun_py.ssh.errors import RemoteTimeout
from poprun_py.ssh.hostresult import values
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from tests.integration.helpers import sshd_log_count, unique_digits

pytestmark = pytest.mark.hosts

NASTY = [
    "a b",
    "q'uo\"te",
    "$(touch /tmp/pwned-poprun-transport)",
    "`id`",
    "; rm -rf x",
    "line1\nline2",
    "é☃ünï",
    "",
    "*",
    "\\",
]
PROBE = "import sys, json; print(json.dumps(sys.argv[1:]))"


def by_name(cluster: TestCluster) -> tuple[list[HostSpec], SshSettings]:
    """Hosts by name, reached through the cluster's ssh_config (address, user, key, known_hosts)."""
    return [HostSpec(h.name) for h in cluster.hosts], SshSettings(ssh_config=cluster.ssh_config)


def direct(
    cluster: TestCluster, known_hosts: Path, accept_new: bool = False, timeout: float = 5.0
) -> SshSettings:
    """No ssh_config: the test decides which known_hosts file the transport sees."""
    return SshSettings(
        known_hosts=known_hosts,
        accept_new_host_keys=accept_new,
        identity_file=str(cluster.identity_file),
        user="root",
        connect_timeout=timeout,
    )


def addressed(cluster: TestCluster) -> list[HostSpec]:
    return [HostSpec(h.name, address=h.address) for h in cluster.hosts]


def logins(cluster: TestCluster) -> dict[str, int]:
    """How many logins each host's sshd has accepted so far."""
    return sshd_log_count(cluster, "Accepted publickey")


def leftovers(pattern: str) -> list[int]:
    """Pids whose command line matches ``pattern``; killed (by pid) so a failure cleans up."""
    out = subprocess.run(
        ["pgrep", "-f", pattern], capture_output=True, text=True, check=False
    ).stdout
    pids = [int(p) for p in out.split()]
    for pid in pids:
        os.kill(pid, 9)
    return pids


def wait_gone(pattern: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False).stdout:
            return []
        time.sleep(0.1)
    return leftovers(pattern)


def test_connect_and_run_on_four_hosts_over_one_connection_each(
    test_cluster_4: TestCluster, tmp_path: Path
):
    hosts, settings = by_name(test_cluster_4)
    before = logins(test_cluster_4)
    with ConnectionPool(hosts, settings) as pool:
        conns = pool.open_all()
        names = values(pool.each(lambda c: c.run(["hostname"]).stdout.strip()))
        again = values(pool.each(lambda c: c.run(["sh", "-c", "exit 7"]).exit_code))
        for conn in conns.values():
            conn.put_text(str(tmp_path / conn.name / "x"), "x")
        assert pool.connections == conns
    assert names == {h.name: h.name for h in test_cluster_4.hosts}
    assert again == {h.name: 7 for h in test_cluster_4.hosts}
    assert all((tmp_path / h.name / "x").read_text() == "x" for h in test_cluster_4.hosts)
    after = logins(test_cluster_4)
    assert {n: after[n] - before[n] for n in after} == {h.name: 1 for h in test_cluster_4.hosts}


def test_arguments_arrive_byte_for_byte(test_cluster_4: TestCluster):
    hosts, settings = by_name(test_cluster_4)
    with ConnectionPool(hosts[:1], settings) as pool:
        conn = pool.open_all()[hosts[0].name]
        result = conn.run(["python3", "-c", PROBE, *NASTY])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == NASTY
    assert not os.path.exists("/tmp/pwned-poprun-transport")


def test_env_and_stdin_reach_the_program_and_secrets_no_argv(test_cluster_4: TestCluster):
    secret = f"tok-{os.getpid()}-s3cr3t 'quoted' $(x)"
    hosts, settings = by_name(test_cluster_4)
    seen: list[str] = []
    with ConnectionPool(hosts[:1], settings) as pool:
        conn = pool.open_all()[hosts[0].name]
        box: dict[str, object] = {}
        script = 'sleep 1.5; printf "%s|" "$TOKEN"; cat'
        runner = threading.Thread(
            target=lambda: box.update(
                r=conn.run(["sh", "-c", script], env={"TOKEN": secret}, stdin=b"in put")
            )
        )
        runner.start()
        while runner.is_alive():  # every process on this machine, every host's included
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if "s3cr3t" in text:
                    seen.append(text)
            time.sleep(0.02)
    assert not seen, f"secret visible in an argv: {seen}"
    assert box["r"].stdout == f"{secret}|in put"  # type: ignore[attr-defined]


def test_changed_host_key_is_refused_with_one_clear_line(test_cluster_4: TestCluster, tmp_path):
    h1, h2 = test_cluster_4.hosts[:2]
    lines = test_cluster_4.known_hosts.read_text().splitlines()
    key_of = {line.split()[0].split(",")[0]: line.split(None, 1)[1] for line in lines}
    tampered = tmp_path / "known_hosts"
    tampered.write_text(
        "".join(
            f"{line.split()[0]} {key_of[h1.name]}\n"
            if line.startswith(f"{h2.name},")
            else line + "\n"
            for line in lines
        )
    )
    for accept in (False, True):  # a changed key is refused even when accepting new ones
        settings = direct(test_cluster_4, tampered, accept_new=accept)
        pool = ConnectionPool(addressed(test_cluster_4), settings)
        with pool, pytest.raises(PreflightError) as err:
            pool.open_all()
        assert [(f.host, f.check) for f in err.value.faults] == [(h2.name, "host key")]
        assert err.value.faults[0].detail == (
            f"host key for {h2.name} ({h2.address}) does not match known_hosts: "
            "possible man-in-the-middle (refused whatever StrictHostKeyChecking says; "
            "remove the old key to go on)"
        )
        assert err.value.exit_code == 3
    assert tampered.read_text().count(key_of[h1.name]) == 2  # nothing was recorded


def test_unknown_keys_refused_then_accepted_and_recorded(test_cluster_4: TestCluster, tmp_path):
    known = tmp_path / "known_hosts"
    pool = ConnectionPool(addressed(test_cluster_4), direct(test_cluster_4, known))
    with pool, pytest.raises(PreflightError) as err:
        pool.open_all()
    assert len(err.value.faults) == 4
    assert all("--accept-new-host-keys" in f.detail for f in err.value.faults)
    assert not known.exists()
    settings = direct(test_cluster_4, known, accept_new=True)
    with ConnectionPool(addressed(test_cluster_4), settings) as pool:
        pool.open_all()
    recorded = {line.split()[0]: line.split()[2] for line in known.read_text().splitlines()}
    real = {
        line.split()[0]: line.split()[2]
        for line in test_cluster_4.known_hosts.read_text().splitlines()
    }
    assert recorded == {
        f"{h.address},{h.name}": real[f"{h.name},{h.address}"] for h in test_cluster_4.hosts
    }
    with ConnectionPool(addressed(test_cluster_4), direct(test_cluster_4, known)) as pool:
        assert len(pool.open_all()) == 4  # now known, no flag needed


def test_wrong_user_refused_key_and_unreachable_address_are_one_line_each(
    test_cluster_4: TestCluster, tmp_path: Path
):
    h1, h2, h3, h4 = test_cluster_4.hosts
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    unassigned = re.sub(r"\.\d+$", ".250", h1.address)  # inside this cluster's own /24
    hosts = [
        HostSpec(h1.name, address=h1.address, user="nosuchuser-poprun"),
        HostSpec(h2.name, address=h2.address, identity_file=str(stranger)),
        HostSpec(h3.name, address=unassigned),
        HostSpec(h4.name, address=h4.address),
    ]
    settings = direct(test_cluster_4, test_cluster_4.known_hosts, timeout=2.0)
    started = time.monotonic()
    with ConnectionPool(hosts, settings) as pool, pytest.raises(PreflightError) as err:
        preflight(pool)
    # not hung: each host's check ends within its 2 s connect timeout, not at TCP's own (about
    # 2 min); "< 60" is generous for a loaded 2-core machine (or one CPU)
    assert time.monotonic() - started < 60
    faults = err.value.faults
    assert [(f.host, f.check) for f in faults] == [
        (h1.name, "auth"),
        (h2.name, "auth"),
        (h3.name, "reachable"),
    ]
    assert all("\n" not in f.detail for f in faults)
    assert faults[0].detail.startswith(
        f"nosuchuser-poprun@{h1.name} ({h1.address}) refused every key"
    )
    assert faults[1].detail.startswith(f"root@{h2.name} ({h2.address}) refused every key")
    assert str(stranger) in faults[1].detail
    assert faults[2].detail.startswith(f"cannot reach {h3.name} ({unassigned}) port 22:")
    assert err.value.exit_code == 3


def test_timeout_stops_the_remote_process_group(test_cluster_4: TestCluster):
    hosts, settings = by_name(test_cluster_4)
    mark = f"sleep 41{unique_digits()}.25"
    with ConnectionPool(hosts[:1], settings) as pool:
        conn = pool.open_all()[hosts[0].name]
        started = time.monotonic()
        with pytest.raises(RemoteTimeout, match="timed out after 1 s"):
            conn.run(["sh", "-c", f"{mark} & {mark}; wait"], timeout=1)
        # at the 1 s timeout, not when the 41 s sleep ends: "< 30" is generous for a loaded
        # machine (the stop of the remote group is part of it)
        assert time.monotonic() - started < 30
        assert conn.run(["true"]).exit_code == 0  # the connection is still usable
    assert wait_gone(mark) == []


def test_put_text_creates_parents_and_sets_mode_first(test_cluster_4: TestCluster, tmp_path):
    hosts, settings = by_name(test_cluster_4)
    target = tmp_path / "a" / "b" / "secret.env"
    with ConnectionPool(hosts[:1], settings) as pool:
        pool.open_all()[hosts[0].name].put_text(str(target), "TOKEN=x\n")
    assert target.read_text() == "TOKEN=x\n"
    assert target.stat().st_mode & 0o777 == 0o600
