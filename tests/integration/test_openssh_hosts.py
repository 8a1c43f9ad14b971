"""OpenSSH as a transport on real sshd test hosts (issue 24, item 1): ``exec`` and ``launch
--backend ssh`` over ``--ssh-client openssh`` beside Paramiko; a failing instance leaves nothing
behind, on the hosts (process search in their namespaces) nor here (no ``ssh`` child left);
``--ssh-client openssh`` without an ``ssh`` here is one line and exit 3, nothing started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from poprun_py.ssh.fanout import nodeset
from tests.integration.helpers import sessions_started, settled
from tests.integration.test_launch_hosts_cli import spec_for

pytestmark = pytest.mark.hosts


def poprun(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def ssh_children_of(pid: int) -> list[int]:
    """Live ``ssh`` processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if name == "ssh" and ppid == pid:
            found.append(int(entry.name))
    return found


def ssh_clients_using(config: Path) -> list[str]:
    """Command lines of live ``ssh`` processes here given ``config`` (``-F``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(words[0].decode()).name == "ssh" and str(config).encode() in words:
            found.append(" ".join(w.decode() for w in words))
    return found


@pytest.mark.parametrize("client", ["openssh", "paramiko"])
def test_exec_runs_on_every_host(test_cluster_4: TestCluster, tmp_path: Path, client: str) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    done = poprun(
        "exec", "-c", str(spec), "--ssh-client", client, "--", "sh", "-c",
        'echo "$(hostname) $0"; exit 0', "a b",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for host in test_cluster_4.hosts:
        assert f"{host.name} a b" in done.stdout


def test_exec_keeps_each_hosts_exit_code_and_names_an_unreachable_one(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    text = spec.read_text().replace(
        "hosts:\n", "hosts:\n  - {name: gone, address: 198.18.255.254}\n", 1
    )
    spec.write_text(text)
    first = test_cluster_4.hosts[0].name
    done = poprun(
        "exec", "-c", str(spec), "--ssh-client", "openssh", "--connect-timeout", "2", "--",
        "sh", "-c", f'[ "$(hostname)" = {first} ] && exit 7; exit 0',
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 255, done.stderr
    assert f"{first}: exited with exit code 7" in done.stderr
    assert "gone: ssh: " in done.stderr


def test_launch_over_openssh_runs_every_instance_with_paramikos_sessions(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    sessions = {}
    for client in ("openssh", "paramiko"):
        before = sessions_started(test_cluster_4)
        done = poprun(
            "launch", "-c", str(spec), "-b", "ssh", "--ssh-client", client, "-n", "4", "--",
            "sh", "-c", 'echo "rank $RANK on $(hostname)"',
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        for rank, host in enumerate(test_cluster_4.hosts):
            assert f"rank {rank} on {host.name}" in done.stdout
        said = f"over OpenSSH's ssh: {nodeset([h.name for h in test_cluster_4.hosts])} ("
        assert (said in done.stderr) == (client == "openssh"), done.stderr
        after = sessions_started(test_cluster_4)
        sessions[client] = {h: after[h] - before.get(h, 0) for h in after}
        assert settled(test_cluster_4) == {}
        assert ssh_clients_using(test_cluster_4.ssh_config) == []
    # one login session a host: the agent's (preflight, staging, the job, and the job
    # directory's removal, through the agent lingering after its job)
    assert sessions["openssh"] == sessions["paramiko"] == {h.name: 1 for h in test_cluster_4.hosts}


def test_a_failing_instance_over_openssh_stops_everything_and_leaves_nothing(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "launch", "-c", str(spec), "-b", "ssh",
         "--ssh-client", "openssh", "-n", "4", "--", "sh", "-c",
         '[ "$RANK" = 2 ] && { sleep 1; exit 5; }; exec sleep 300'],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while len(ssh_children_of(child.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ssh_children_of(child.pid)) == 4  # one ssh per host: each carries an agent
    started = time.monotonic()
    _, err = child.communicate(timeout=60)
    assert child.returncode == 5, err
    assert time.monotonic() - started < 2 + 3 + 5  # grace 2 s + 3 s, and the rank's second
    assert "instance 2" in err
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def test_openssh_without_an_ssh_client_is_one_line_and_exit_3(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "hostname"):
        os.symlink(f"/bin/{tool}", bare / tool)
    before = sessions_started(test_cluster_4)
    for command in (["exec"], ["launch", "-b", "ssh"]):
        done = poprun(
            *command, "-c", str(spec), "--ssh-client", "openssh", "--", "hostname",
            cwd=tmp_path, env={"PATH": str(bare)},
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
        lines = done.stderr.strip().splitlines()
        assert any("no ssh client on PATH" in line for line in lines), done.stderr
    assert sessions_started(test_cluster_4) == before


def test_an_unreachable_host_over_openssh_is_a_preflight_fault(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    text = spec.read_text().replace(
        "hosts:\n", "hosts:\n  - {name: gone, address: 198.18.255.254}\n", 1
    )
    spec.write_text(text)
    done = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--ssh-client", "openssh",
        "--connect-timeout", "2", "--", "true",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "preflight failed on gone: reachable: gone: ssh: " in done.stderr
    assert "nothing was started" in done.stderr
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def _launch_sleepers(spec: Path, tmp_path: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "launch", "-c", str(spec), "-b", "ssh",
         "--ssh-client", "openssh", "-n", "4", "--", "sleep", "300"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    return child


def _until_running(cluster: TestCluster, child: subprocess.Popen[str]) -> list[int]:
    """The launch's four ssh processes, once every host runs its instance."""
    from poprun_py.providers.netns import host_pids

    deadline = time.monotonic() + 30
    while True:
        sleeping = [
            pid
            for host in cluster.hosts
            for pid in host_pids(host.netns)
            if Path(f"/proc/{pid}/comm").exists()
            and Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"
        ]
        if len(sleeping) == 4:
            return ssh_children_of(child.pid)
        assert child.poll() is None and time.monotonic() < deadline, child.stderr
        time.sleep(0.1)


def test_a_host_whose_ssh_ends_is_lost_at_once_and_everything_stops(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    child = _launch_sleepers(spec, tmp_path)
    ssh = _until_running(test_cluster_4, child)
    assert len(ssh) == 4
    victim = ssh[0]
    words = Path(f"/proc/{victim}/cmdline").read_bytes().decode().split("\0")
    host = words[words.index("--") + 1]  # ssh ... -- HOST LINE
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    _, err = child.communicate(timeout=60)
    assert child.returncode == 255, err
    assert time.monotonic() - started < 2 + 3 + 2  # the grace period, plus 3 s
    assert host in err and "lost" in err, err
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []


def test_poprun_killed_outright_leaves_nothing_over_openssh(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    child = _launch_sleepers(spec, tmp_path)
    assert len(_until_running(test_cluster_4, child)) == 4
    child.kill()  # SIGKILL: ssh's stdin ends, each agent reads EOF and stops its instance
    child.communicate(timeout=30)
    deadline = time.monotonic() + 15
    while ssh_clients_using(test_cluster_4.ssh_config) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ssh_clients_using(test_cluster_4.ssh_config) == []
    assert settled(test_cluster_4, 15.0) == {}


@pytest.mark.parametrize("how", ["timeout", "SIGINT"])
def test_exec_stopped_over_openssh_leaves_nothing(
    test_cluster_4: TestCluster, tmp_path: Path, how: str
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    limit = ["--timeout", "2"] if how == "timeout" else []
    child = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "exec", "-c", str(spec), "--ssh-client", "openssh",
         *limit, "--", "sleep", "300"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    if how == "SIGINT":
        _until_running(test_cluster_4, child)
        child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == (124 if how == "timeout" else 130), err
    assert settled(test_cluster_4) == {}
    assert ssh_clients_using(test_cluster_4.ssh_config) == []
