"""A tree of SSH (``--fanout K``, issue 24) on real sshd test hosts: the launcher connects to
K gateways and each reaches its subtree with its own OpenSSH client.

- ``exec`` and ``launch --backend ssh`` run on every host, and each subtree host's login
  comes from its gateway's address (``$SSH_CLIENT``), not from here;
- a failing instance stops everything: nothing is left on any host (process search in their
  namespaces) nor here (no ``ssh`` child);
- a lost gateway is named once as the cause for its subtree, whose instances are stopped;
- ``--fanout 0`` is one line and exit 2, nothing started.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster, TestHost
from poprun_py.ssh.fanout import nodeset
from tests.integration.helpers import marked_on, need_mpi, sessions_started, settled, unique_sleep
from tests.integration.test_launch_hosts_cli import spec_for
from tests.integration.test_openssh_hosts import ssh_clients_using

pytestmark = pytest.mark.hosts


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def client_addresses(stdout: str) -> dict[str, str]:
    """``HOST ADDRESS`` lines: the address each host's login came from."""
    return dict(re.findall(r"^\S+: (\S+) from (\S+)$", stdout, re.M))


def test_exec_through_one_gateway_reaches_every_host_from_the_gateway(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    done = poprun(
        "exec", "-c", str(spec), "--fanout", "1", "--", "sh", "-c",
        'echo "$(hostname) from ${SSH_CLIENT%% *}"', cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    came = client_addresses(done.stdout)
    gateway, *rest = test_cluster_4.hosts
    assert set(came) == {h.name for h in test_cluster_4.hosts}, done.stdout
    assert {came[h.name] for h in rest} == {gateway.address}, came
    assert came[gateway.name] != gateway.address


def test_launch_through_two_gateways_runs_every_instance_and_leaves_nothing(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    done = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--fanout", "2", "-n", "4", "--", "sh", "-c",
        'echo "rank $RANK on $(hostname) from ${SSH_CLIENT%% *}"', cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    hosts = test_cluster_4.hosts
    came = dict(re.findall(r"rank \d+ on (\S+) from (\S+)$", done.stdout, re.M))
    assert set(came) == {h.name for h in hosts}, done.stdout
    # h1 and h2 are the gateways; h3 is h1's subtree, h4 is h2's
    assert came[hosts[2].name] == hosts[0].address
    assert came[hosts[3].name] == hosts[1].address
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


@pytest.mark.parametrize("backend", ["mpirun", "mpiexec"])
def test_mpi_launches_through_a_gateway(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    need_mpi()
    spec = spec_for(test_cluster_4, tmp_path)
    done = poprun(
        "launch", "-c", str(spec), "-b", backend, "--fanout", "1", "-n", "4", "--", "sh", "-c",
        'echo "rank $RANK on $(hostname) from ${SSH_CLIENT%% *}"', cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    came = dict(re.findall(r"rank \d+ on (\S+) from (\S+)$", done.stdout, re.M))
    gateway, *rest = test_cluster_4.hosts
    assert set(came) == {h.name for h in test_cluster_4.hosts}, done.stdout
    assert {came[h.name] for h in rest} == {gateway.address}, came
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def test_a_failing_instance_behind_a_gateway_stops_everything_and_leaves_nothing(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    sleep = unique_sleep()
    started = time.monotonic()
    done = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--fanout", "1", "-n", "4", "--", "sh", "-c",
        f'[ "$RANK" = 3 ] && {{ sleep 1; exit 5; }}; exec sleep {sleep}', cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert time.monotonic() - started < 30
    assert settled(test_cluster_4) == {}
    assert sleeping(test_cluster_4.hosts[0], sleep) == []
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def test_a_lost_gateway_is_named_once_and_its_subtree_is_stopped(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    sleep = unique_sleep()
    child = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "launch", "-c", str(spec), "-b", "ssh",
         "--fanout", "1", "-n", "4", "--", "sh", "-c", f"exec sleep {sleep}"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    gateway = test_cluster_4.hosts[0]
    try:
        deadline = time.monotonic() + 30
        while len(sleeping(gateway, sleep)) < 4:  # the instances (one PID namespace here)
            assert time.monotonic() < deadline, "the instances did not start"
            time.sleep(0.1)
        relay = relay_pid(test_cluster_4.ssh_config)
        subprocess.run(["kill", "-9", str(relay)], check=True)
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode != 0
    assert err.count(f"gateway {gateway.name} lost") == 1, err  # the warning: the cause, once
    others = nodeset([h.name for h in test_cluster_4.hosts[1:]])
    assert f"gateway {gateway.name} lost (its connection closed): {others} lost with it" in err
    assert f"lost with gateway {gateway.name})" in err.splitlines()[-1]
    assert settled(test_cluster_4, 10.0) == {}
    assert sleeping(gateway, sleep) == []
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def sleeping(host: TestHost, sleep: str) -> list[str]:
    """The processes that are ``sleep SLEEP`` itself."""
    return [line for line in marked_on(host, f"sleep {sleep}") if line.endswith(f" sleep {sleep}")]


def relay_pid(config: Path) -> int:
    """The gateway's relay: the parent of the ``ssh`` clients given ``config`` (here, only the
    gateway runs them)."""
    parents = set()
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if Path(words[0].decode()).name == "ssh" and str(config).encode() in words:
            parents.add(int(stat[stat.rindex(")") + 2 :].split()[1]))
    assert len(parents) == 1, parents
    return parents.pop()


@pytest.mark.parametrize("fanout", ["0", "-2"])
def test_a_fanout_below_one_is_one_line_and_exit_2(
    test_cluster_4: TestCluster, tmp_path: Path, fanout: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    before = sessions_started(test_cluster_4)
    for command in (["exec"], ["launch", "-b", "ssh"]):
        done = poprun(*command, "-c", str(spec), "--fanout", fanout, "--", "true", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            "poprun-py: error: --fanout must be 1 or more (the gateways to connect to), "
            f"not {fanout}"
        ], done.stderr
    assert sessions_started(test_cluster_4) == before  # nothing was started


def test_a_host_its_gateway_cannot_reach_is_named_with_its_gateway_and_nothing_starts(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    gateway = test_cluster_4.hosts[0].address
    hosts = f"hosts:\n  - {{name: gw, address: {gateway}}}\n"
    hosts += "  - {name: gone, address: 198.18.255.254}\n"
    spec.write_text(spec.read_text().replace("hosts:\n", hosts, 1))
    done = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--fanout", "1", "--connect-timeout", "2",
        "--", "sh", "-c", f'touch "{tmp_path}/ran-$RANK"', cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "gone: from gateway gw: ssh: connect to host 198.18.255.254" in done.stderr
    assert list(tmp_path.glob("ran-*")) == []  # preflight failed: no instance anywhere
    assert settled(test_cluster_4) == {}
