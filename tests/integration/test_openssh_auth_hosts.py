"""What only OpenSSH's client can do, beside ``ssh -o BatchMode=yes HOST true`` on real sshd
test hosts (issue 24, item 1): ``KnownHostsCommand`` and host-based authentication. Paramiko
(``--ssh-client paramiko``) is refused where ``ssh`` gets in; ``auto`` takes OpenSSH for these
hosts, and ``exec`` and ``launch --backend ssh`` work, preflight naming the hosts and why.

Host-based authentication needs files at fixed paths on both sides -- ssh-keysign reads
``/etc/ssh/ssh_config`` (``EnableSSHKeysign``) and this machine's host keys in ``/etc/ssh``;
sshd reads ``/etc/ssh/ssh_known_hosts`` and, for root, ``~/.shosts`` (``shosts.equiv`` is not
used for root) -- so each side runs in a mount namespace of its own, with a directory of the
test's bound over ``/etc/ssh`` (and, for sshd, over ``/root``): nothing of this machine's is
changed. The test hosts' second sshd (port 2224) takes host-based logins only
(``PubkeyAuthentication no``, ``HostbasedUsesNameFromPacketOnly yes``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from poprun_py.ssh.fanout import nodeset
from tests import requirements
from tests.hostfixtures import _Clusters
from tests.integration.helpers import need_mpi, settled
from tests.integration.test_openssh_hosts import ssh_clients_using

pytestmark = pytest.mark.hosts

HOSTBASED_PORT = 2224
PRIVATE_ETC = 'mount --bind "$1" /etc/ssh && shift && exec "$@"'


@dataclass(frozen=True)
class Lab:
    cluster: TestCluster
    dir: Path
    khc_config: Path  # KnownHostsCommand, no known_hosts file
    hb_config: Path  # host-based, port 2224
    client_etc: Path  # bound over /etc/ssh for the client side

    @property
    def names(self) -> str:
        return ",".join(h.name for h in self.cluster.hosts)


def _run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kw)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def _keygen(path: Path) -> str:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)])
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def _config(cluster: TestCluster, body: str, port: int = 22) -> str:
    return "".join(
        f"Host {h.name}\n  HostName {h.address}\n  Port {port}\n  User root\n{body}"
        for h in cluster.hosts
    )


def _hostbased_sshd(lab_dir: Path, cluster: TestCluster, client_key: str) -> None:
    """A second sshd in each host's namespace and a mount namespace of its own, taking
    host-based logins of this machine (any name: the test's key) and nothing else."""
    server_etc, root_home = lab_dir / "server_etc", lab_dir / "server_root"
    server_etc.mkdir()
    root_home.mkdir(mode=0o700)
    (server_etc / "ssh_known_hosts").write_text(f"* {client_key}\n")
    names = {socket.gethostname(), socket.getfqdn(), "localhost"}
    (root_home / ".shosts").write_text("".join(f"{n} root\n" for n in sorted(names)))
    for host in cluster.hosts:
        base = (cluster.state_dir / "hosts" / host.name / "sshd_config").read_text()
        text = base.replace("Port 22\n", f"Port {HOSTBASED_PORT}\n").replace(
            "PubkeyAuthentication yes", "PubkeyAuthentication no"
        )
        text = text.replace("PidFile ", f"PidFile {lab_dir}/sshd_{host.name}.pid\n# was: ")
        conf = lab_dir / f"sshd_{host.name}"
        conf.write_text(
            text + "HostbasedAuthentication yes\nHostbasedUsesNameFromPacketOnly yes\n"
            "IgnoreRhosts no\nIgnoreUserKnownHosts yes\n"
        )
        sshd = ["/usr/sbin/sshd", "-f", str(conf), "-E", str(lab_dir / f"sshd_{host.name}.log")]
        script = 'hostname "$3" && mount --bind "$1" /etc/ssh && mount --bind "$2" /root'
        script += ' && shift 3 && exec "$@"'
        _run(["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "sh", "-c",
              script, "sh", str(server_etc), str(root_home), host.name, *sshd])  # fmt: skip
        _wait_port(host.address, HOSTBASED_PORT)


def _wait_port(address: str, port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.2):
                return
        except OSError:
            assert time.monotonic() < deadline, f"no sshd on {address}:{port}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    clusters = _Clusters()
    try:
        cluster = clusters.make(2, "k")
        d = tmp_path_factory.mktemp("openssh_auth")
        key = f"  IdentityFile {cluster.identity_file}\n  IdentitiesOnly yes\n"
        nowhere = "  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n"
        khc = d / "khc_config"
        khc.write_text(
            _config(cluster, key + nowhere + f"  KnownHostsCommand /bin/cat {cluster.known_hosts}"
                    "\n  StrictHostKeyChecking yes\n")
        )  # fmt: skip
        client_etc = d / "client_etc"
        client_etc.mkdir()
        client_key = _keygen(client_etc / "ssh_host_ed25519_key")
        (client_etc / "ssh_config").write_text("Host *\n  EnableSSHKeysign yes\n")
        _hostbased_sshd(d, cluster, client_key)
        known = "".join(
            f"[{h.name}]:{HOSTBASED_PORT},[{h.address}]:{HOSTBASED_PORT} "
            + " ".join(line.split()[1:3])
            + "\n"
            for h, line in zip(
                cluster.hosts, cluster.known_hosts.read_text().splitlines(), strict=True
            )
        )
        (d / "hb_known_hosts").write_text(known)
        hb = d / "hb_config"
        hb.write_text(
            _config(
                cluster,
                "  HostbasedAuthentication yes\n  EnableSSHKeysign yes\n"
                "  PubkeyAuthentication no\n"
                f"  UserKnownHostsFile {d / 'hb_known_hosts'}\n  GlobalKnownHostsFile /dev/null\n",
                HOSTBASED_PORT,
            )
        )
        yield Lab(cluster, d, khc, hb, client_etc)
    finally:
        clusters.destroy_all()


def client_side(lab: Lab, argv: list[str]) -> list[str]:
    """``argv`` in a mount namespace with the test's /etc/ssh (ssh-keysign's files)."""
    return ["unshare", "--mount", "sh", "-c", PRIVATE_ETC, "sh", str(lab.client_etc), *argv]


def poprun(lab: Lab, *args: str, private_etc: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "poprun_py", *args]
    return subprocess.run(
        client_side(lab, argv) if private_etc else argv,
        cwd=lab.dir, capture_output=True, text=True, timeout=120, check=False,
        stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def ssh_true(lab: Lab, config: Path, host: str, private_etc: bool = False) -> int:
    argv = ["ssh", "-F", str(config), "-o", "BatchMode=yes", host, "true"]
    argv = client_side(lab, argv) if private_etc else argv
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode


CASES = {  # what, its config, whether ssh-keysign's /etc/ssh is needed, why auto takes OpenSSH
    "KnownHostsCommand": ("khc_config", False, "KnownHostsCommand"),
    "hostbased": ("hb_config", True, "HostbasedAuthentication yes"),
}

REFUSALS = {"KnownHostsCommand": "is not in known_hosts", "hostbased": "refused every key"}


@pytest.mark.parametrize("case", CASES)
def test_paramiko_is_refused_where_ssh_gets_in_and_auto_takes_openssh(lab: Lab, case: str) -> None:
    attr, private, why = CASES[case]
    refusal = REFUSALS[case]
    config = getattr(lab, attr)
    for host in lab.cluster.hosts:
        assert ssh_true(lab, config, host.name, private) == 0
    common = ("--ssh-config", str(config), "--hosts", lab.names)
    refused = poprun(lab, "exec", *common, "--ssh-client", "paramiko", "--", "true",
                     private_etc=private)  # fmt: skip
    assert refused.returncode == 255, refused.stderr
    assert refusal in refused.stderr  # as the issue saw it
    for client in ("auto", "openssh"):
        done = poprun(lab, "exec", *common, "--ssh-client", client, "--", "hostname",
                      private_etc=private)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == [
            f"{h.name}: {h.name}" for h in lab.cluster.hosts
        ]
    launched = poprun(
        lab, "launch", "-b", "ssh", *common, "-n", "2", "--",
        "sh", "-c", 'echo "rank $RANK on $(hostname)"',
        private_etc=private,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    for rank, host in enumerate(lab.cluster.hosts):
        assert f"rank {rank} on {host.name}" in launched.stdout
    hosts = nodeset([h.name for h in lab.cluster.hosts])
    assert f"over OpenSSH's ssh: {hosts} ({why})" in launched.stderr
    assert _only_extra_sshd(lab)
    assert ssh_clients_using(config) == []


@pytest.mark.parametrize("case", CASES)
def test_a_failing_instance_leaves_nothing_behind(lab: Lab, case: str) -> None:
    attr, private, _ = CASES[case]
    config = getattr(lab, attr)
    started = time.monotonic()
    done = poprun(
        lab, "launch", "-b", "ssh", "--ssh-config", str(config), "--hosts", lab.names,
        "--grace-period", "2", "-n", "2", "--", "sh", "-c",
        '[ "$RANK" = 1 ] && { sleep 1; exit 6; }; exec sleep 300',
        private_etc=private,
    )  # fmt: skip
    assert done.returncode == 6, done.stderr
    assert time.monotonic() - started < 30
    assert ssh_clients_using(config) == []
    assert _only_extra_sshd(lab)


def _only_extra_sshd(lab: Lab, within: float = 5.0) -> bool:
    """Nothing but sshd (the test's second ones included) left on any host."""
    deadline = time.monotonic() + within
    while True:
        left = {
            name: [pid for pid in pids if _comm(pid) != "sshd"]
            for name, pids in settled(lab.cluster, 0.0).items()
        }
        if not any(left.values()):
            return True
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind: {left}")
        time.sleep(0.05)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# ------------------------------------------- every command, where only OpenSSH gets in


def khc_spec(lab: Lab) -> Path:
    """A cluster spec whose hosts only OpenSSH can reach (their keys come from a command)."""
    spec = lab.dir / "khc.yaml"
    hosts = "".join(f"  - {{name: {h.name}}}\n" for h in lab.cluster.hosts)
    spec.write_text(
        f"name: khc\nssh:\n  ssh_config: {lab.khc_config}\nhosts:\n{hosts}"
        "defaults:\n  grace_period: 2\n"
    )
    return spec


def test_detached_jobs_logs_stop_and_wait_over_openssh(lab: Lab) -> None:
    spec = str(khc_spec(lab))
    done = poprun(lab, "launch", "-c", spec, "-b", "ssh", "-n", "2", "--detach", "--",
                  "sh", "-c", 'echo "detached $RANK"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[-1]
    waited = poprun(lab, "wait", job, "-c", spec)
    assert waited.returncode == 0, waited.stderr
    logs = poprun(lab, "logs", job, "-c", spec)
    assert logs.returncode == 0, logs.stderr
    assert "detached 0" in logs.stdout and "detached 1" in logs.stdout
    listed = poprun(lab, "jobs", "-c", spec, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert job in listed.stdout
    long = poprun(lab, "launch", "-c", spec, "-b", "ssh", "-n", "2", "--detach", "--",
                  "sleep", "300")  # fmt: skip
    assert long.returncode == 0, long.stderr
    long_job = long.stdout.strip().splitlines()[-1]
    stopped = poprun(lab, "stop", long_job, "-c", spec)
    assert stopped.returncode == 0, stopped.stderr
    assert poprun(lab, "wait", long_job, "-c", spec).returncode != 0
    assert ssh_clients_using(lab.khc_config) == []
    assert _only_extra_sshd(lab, within=10.0)
    refused = poprun(lab, "jobs", "-c", spec, "--ssh-client", "paramiko")
    assert "not in known_hosts" in refused.stderr  # jobs names the hosts it cannot reach


def test_mpirun_over_openssh(lab: Lab) -> None:
    need_mpi()
    spec = str(khc_spec(lab))
    done = poprun(lab, "launch", "-c", spec, "-b", "mpirun", "-n", "2", "--",
                  "sh", "-c", 'echo "mpi rank $RANK on $(hostname)"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    for rank, host in enumerate(lab.cluster.hosts):
        assert f"mpi rank {rank} on {host.name}" in done.stdout
    assert ssh_clients_using(lab.khc_config) == []
    assert _only_extra_sshd(lab)


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sync_over_openssh(lab: Lab, method: str) -> None:
    spec = str(khc_spec(lab))
    src = lab.dir / f"src_{method}"
    (src / "sub dir").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub dir" / "b's.txt").write_text("beta\n")
    dest = lab.dir / f"dest_{method}"  # the test hosts share this machine's files
    done = poprun(lab, "sync", "-c", spec, "--method", method, "--dest", str(dest), str(src))
    assert done.returncode == 0, done.stderr
    assert (dest / f"src_{method}" / "a.txt").read_text() == "alpha\n"
    assert (dest / f"src_{method}" / "sub dir" / "b's.txt").read_text() == "beta\n"
    assert ssh_clients_using(lab.khc_config) == []
    refused = poprun(lab, "sync", "-c", spec, "--ssh-client", "paramiko", "--dest", str(dest),
                     str(src))  # fmt: skip
    assert refused.returncode == 3 and "not in known_hosts" in refused.stderr


def test_check_and_mpiexec_over_openssh(lab: Lab) -> None:
    spec = str(khc_spec(lab))
    checked = poprun(lab, "check", "-c", spec, "-b", "ssh", "--check-timeout", "3")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "check: 2/2 host(s) ok" in checked.stdout
    requirements.require("mpiexec.hydra")
    done = poprun(lab, "launch", "-c", spec, "-b", "mpiexec", "-n", "2", "--",
                  "sh", "-c", 'echo "hydra rank $RANK on $(hostname)"')  # fmt: skip
    assert done.returncode == 0, done.stderr
    for host in lab.cluster.hosts:
        assert f"on {host.name}" in done.stdout
    assert ssh_clients_using(lab.khc_config) == []
    assert _only_extra_sshd(lab)


def test_up_and_down_of_a_static_cluster_over_openssh(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    from poprun_py.providers.setup import MARKER_ROOT
    from tests.integration.test_provision_local import hosts_home

    monkeypatch.setenv("POPRUN_PY_STATE_DIR", str(lab.dir / "state"))
    name = f"ko{os.getpid()}"
    spec = lab.dir / "static.yaml"
    names = "".join(f"  - name: {h.name}\n" for h in lab.cluster.hosts)
    spec.write_text(f"name: {name}\nprovider: {{kind: static}}\nsetup: hostname\nhosts:\n{names}")
    flags = ["--ssh-config", str(lab.khc_config), "--connect-timeout", "5"]
    refused = poprun(lab, "up", str(spec), *flags, "--ssh-client", "paramiko",
                     "--wait-timeout", "2")  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    went_up = poprun(lab, "up", str(spec), *flags)
    assert went_up.returncode == 0, went_up.stderr
    marker = hosts_home() / MARKER_ROOT / name  # the hosts share this machine's filesystem
    assert sorted(p.name for p in marker.iterdir()) == sorted(h.name for h in lab.cluster.hosts)
    went_down = poprun(lab, "down", str(spec), *flags)
    assert went_down.returncode == 0, went_down.stderr
    assert not marker.exists()
    assert ssh_clients_using(lab.khc_config) == []


def test_connection_sharing_with_controlmaster(lab: Lab) -> None:
    """``ControlMaster``/``ControlPath`` (Paramiko has no such thing): auto takes OpenSSH, the
    commands share each host's master connection, and the master ends ``ControlPersist``
    after the last one."""
    cm = lab.dir / "cm"
    cm.mkdir(exist_ok=True)
    config = lab.dir / "cm_config"
    config.write_text(
        lab.khc_config.read_text().replace(
            "  StrictHostKeyChecking yes\n",
            f"  StrictHostKeyChecking yes\n  ControlMaster auto\n  ControlPath {cm}/%C\n"
            "  ControlPersist 2\n",
        )
    )
    common = ("--ssh-config", str(config), "--hosts", lab.names)
    for _ in range(2):
        done = poprun(lab, "exec", *common, "--", "true")
        assert done.returncode == 0, done.stderr
    launched = poprun(lab, "launch", "-b", "ssh", *common, "-n", "2", "--", "true")
    assert launched.returncode == 0, launched.stderr
    assert "(KnownHostsCommand, ControlMaster, ControlPath)" in launched.stderr
    deadline = time.monotonic() + 20  # the masters persist 2 s after their last session
    while ssh_clients_using(config) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ssh_clients_using(config) == []
    assert _only_extra_sshd(lab)
