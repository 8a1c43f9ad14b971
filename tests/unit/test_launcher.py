"""How a launch renders mpirun's remote start: through the rsh shim for remote hosts (what
``--dry-run`` prints is what runs), Open MPI's ssh when the user chose an agent, nothing extra
for local launches."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from poprun_py.backends import mpi
from poprun_py.hostside.rsh_shim import SOCKET_VAR, agent_command
from poprun_py.launch import launcher
from poprun_py.prepare.job import LaunchOptions, prepare


def mpirun_argv(tmp_path: Path, hosts: str, mpi_args: str | None = None) -> tuple[str, ...]:
    spec = tmp_path / "cluster.yaml"
    names = "".join(f"  - name: {name}\n" for name in hosts.split(","))
    spec.write_text(f"name: t\nhosts:\n{names}ssh: {{ssh_config: /etc/poprun/ssh_config}}\n")
    opts = LaunchOptions(program=("true",), cluster=str(spec), backend="mpirun", mpi_args=mpi_args)
    job = launcher.render(prepare(opts, environ={}), str(tmp_path / "job"), {})
    assert SOCKET_VAR not in job.launcher_env  # the socket is named at run time only
    return job.launcher


def test_remote_mpirun_starts_its_daemons_through_the_shim(tmp_path: Path) -> None:
    argv = mpirun_argv(tmp_path, "198.18.0.11,198.18.0.12")
    assert argv[argv.index("plm_rsh_agent") + 1] == agent_command()
    assert argv[argv.index("plm_rsh_no_tree_spawn") + 1] == "1"
    assert argv[argv.index("orte_leave_session_attached") + 1] == "1"
    assert "plm_rsh_args" not in argv  # no ssh: the shim needs no ssh_config
    assert argv == mpirun_argv(tmp_path, "198.18.0.11,198.18.0.12")  # deterministic


def test_the_users_own_agent_keeps_open_mpis_ssh_with_the_cluster_config(tmp_path: Path) -> None:
    argv = mpirun_argv(tmp_path, "198.18.0.11,198.18.0.12", "--mca plm_rsh_agent ssh")
    assert argv[argv.index("plm_rsh_agent") + 1] == "ssh"
    assert argv.count("plm_rsh_agent") == 1
    assert argv[argv.index("plm_rsh_args") + 1] == "-F /etc/poprun/ssh_config"


def test_local_mpirun_is_unchanged(tmp_path: Path) -> None:
    argv = mpirun_argv(tmp_path, "localhost")
    assert "plm_rsh_agent" not in argv and "plm_rsh_no_tree_spawn" not in argv


@pytest.mark.parametrize(
    ("here", "subnet"),
    [
        ("198.18.0.1", "198.18.0.0/28"),  # on the hosts' LAN: widened to hold mpirun's machine
        ("198.18.0.12", "198.18.0.8/29"),  # already inside
        ("10.0.0.5", "198.18.0.8/29"),  # routed from afar: the hosts' network alone
        (None, "198.18.0.8/29"),  # no route
    ],
)
def test_mpi_subnet_holds_the_hosts_and_the_launching_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: str | None, subnet: str
) -> None:
    address = ipaddress.IPv4Address(here) if here else None
    monkeypatch.setattr(mpi, "source_address", lambda target: address)
    argv = mpirun_argv(tmp_path, "198.18.0.11,198.18.0.12")
    for name in ("btl_tcp_if_include", "oob_tcp_if_include"):
        assert argv[argv.index(name) + 1] == subnet
