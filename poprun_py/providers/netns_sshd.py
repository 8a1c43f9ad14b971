"""One test host brought up (:mod:`poprun_py.providers.netns`): its host key, its namespace,
and its own sshd, started in a fresh UTS namespace so ``hostname`` answers the host's name.

Each sshd listens on the host's address only, accepts the cluster's one client key, logs to
``<state dir>/hosts/<host>/sshd.log`` at level VERBOSE (one ``Starting session:`` line per login
session, which tests count) and gives its sessions the ``PATH`` of the process that created the
cluster. A host is ready once its sshd wrote its pid file and accepts connections.

Example:

    >>> from pathlib import Path
    >>> from poprun_py.providers.netns_layout import Layout
    >>> layout = Layout("demo", 9, ("d1", "d2"), Path("/s/demo"))
    >>> print(sshd_config_text(layout, 1).splitlines()[1])
    ListenAddress 198.18.9.12
    >>> as_test_host(layout, 1, pid=42)
    TestHost(name='d2', address='198.18.9.12', netns='poprun-demo-d2', sshd_pid=42, ...)
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from poprun_py.errors import ProvisionError
from poprun_py.process.commands import last_line
from poprun_py.providers import netns_data
from poprun_py.providers.netns_files import HOSTS_MARKER, SSH_PORT, TestHost
from poprun_py.providers.netns_layout import Layout, host_dir, netns_name
from poprun_py.providers.netns_links import create_netns, run

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
READY_TIMEOUT = 10.0


def keygen(path: Path, comment: str) -> None:
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def start_host(layout: Layout, index: int) -> TestHost:
    host = layout.host_names[index]
    directory = host_dir(layout, host)
    directory.mkdir(parents=True)
    keygen(directory / "ssh_host_ed25519_key", f"poprun-py testhosts {host}")
    netns = netns_name(layout.name, host)
    create_netns(layout, index, netns)
    config = directory / "sshd_config"
    config.write_text(sshd_config_text(layout, index))
    pid = _start_sshd(netns, host, config, directory)
    _wait_accepting(layout.address(index), directory / "sshd.log", time.monotonic() + READY_TIMEOUT)
    return as_test_host(layout, index, pid)


def as_test_host(layout: Layout, index: int, pid: int) -> TestHost:
    data = layout.data
    return TestHost(
        name=layout.host_names[index],
        address=layout.address(index),
        netns=netns_name(layout.name, layout.host_names[index]),
        sshd_pid=pid,
        data_address=netns_data.data_address(layout.subnet_index, index) if data else None,
        data_interface=netns_data.data_interface(index) if data else None,
    )


def sshd_config_text(layout: Layout, index: int) -> str:
    directory = host_dir(layout, layout.host_names[index])
    path_env = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    lines = [
        f"# {HOSTS_MARKER} {layout.name}: sshd of {layout.host_names[index]}",
        f"ListenAddress {layout.address(index)}",
        f"Port {SSH_PORT}",
        f"HostKey {directory / 'ssh_host_ed25519_key'}",
        f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {layout.state_dir / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel VERBOSE",  # logs every session it starts: tests count login sessions
        f'SetEnv "PATH={path_env}"' if '"' not in path_env else "",
        "Subsystem sftp internal-sftp",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _start_sshd(netns: str, host: str, config: Path, directory: Path) -> int:
    """Start a daemonizing sshd in ``netns`` and a fresh UTS namespace; return its pid."""
    script = 'hostname "$1" && exec "$2" -f "$3" -E "$4"'
    log = directory / "sshd.log"
    argv = ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c", script, "sh"]
    try:
        run([*argv, host, SSHD, str(config), str(log)])
    except ProvisionError as exc:
        raise ProvisionError(f"sshd of test host {host} did not start: {last_line(log)}") from exc
    return _read_pid(directory / "sshd.pid", log, time.monotonic() + READY_TIMEOUT)


def _read_pid(pid_file: Path, log: Path, deadline: float) -> int:
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(pid_file.read_text().strip())
        if time.monotonic() > deadline:
            raise ProvisionError(f"sshd wrote no pid file {pid_file}: {last_line(log)}")
        time.sleep(0.01)


def _wait_accepting(address: str, log: Path, deadline: float) -> None:
    while True:
        try:
            with socket.create_connection((address, SSH_PORT), timeout=0.2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                detail = f"{exc}; sshd log: {last_line(log)}"
                raise ProvisionError(f"sshd on {address} not accepting: {detail}") from exc
            time.sleep(0.02)
