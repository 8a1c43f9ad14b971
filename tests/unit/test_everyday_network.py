"""Issue 20, items 6 and 7: Open MPI's interface selection as ``render``/``--dry-run`` show it.

``--network`` is passed whatever the hosts are (names, one host); without it, a covering
network is selected only while it stays narrow (a /16 at most), else Open MPI chooses.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from poprun_py.backends import mpi
from poprun_py.launch import launcher
from poprun_py.prepare.job import LaunchOptions, prepare


def selection(
    tmp_path: Path, hosts: str, network: str | None = None, mpi_args: str | None = None
) -> dict[str, str]:
    """``{btl_tcp_if_include: ..., oob_tcp_if_include: ...}`` of the rendered mpirun argv."""
    opts = LaunchOptions(
        program=("true",), hosts=hosts, backend="mpirun", network=network, mpi_args=mpi_args
    )
    argv = launcher.render(prepare(opts, environ={}), str(tmp_path / "job"), {}).launcher
    names = ("btl_tcp_if_include", "oob_tcp_if_include")
    return {a: argv[k + 1] for k, a in enumerate(argv) if a in names}


@pytest.fixture
def away(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no address in any --network, and reaches the hosts from 192.0.2.9."""
    monkeypatch.setattr(mpi, "here_on", lambda network: False)
    monkeypatch.setattr(mpi, "source_address", lambda t: ipaddress.IPv4Address("192.0.2.9"))


@pytest.mark.parametrize("hosts", ["node1,node2", "node1", "198.18.0.11", "node1,198.18.0.12"])
def test_network_is_passed_for_names_and_for_one_host(
    tmp_path: Path, away: None, hosts: str
) -> None:
    assert selection(tmp_path, hosts, "10.0.0.0/16") == {"btl_tcp_if_include": "10.0.0.0/16"}


def test_the_daemons_use_the_network_too_when_this_machine_is_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mpi, "here_on", lambda network: network == "10.0.0.0/16")
    assert selection(tmp_path, "node1,node2", "10.0.0.0/16") == {
        "btl_tcp_if_include": "10.0.0.0/16",
        "oob_tcp_if_include": "10.0.0.0/16",
    }


@pytest.mark.parametrize(
    "hosts", ["10.1.0.5,11.1.0.5", "10.1.0.5,10.200.0.5", "198.18.0.11,203.0.113.5"]
)
def test_hosts_only_a_wide_network_holds_get_no_selection(
    tmp_path: Path, away: None, hosts: str
) -> None:
    """Hosts in different /8s were given 0.0.0.0/0, which takes in loopback."""
    assert selection(tmp_path, hosts) == {}


def test_hosts_on_one_narrow_network_keep_their_selection(tmp_path: Path, away: None) -> None:
    """The test hosts' case (across namespaces Open MPI needs the subnet)."""
    assert selection(tmp_path, "198.18.0.11,198.18.0.12,198.18.3.14") == {
        "btl_tcp_if_include": "198.18.0.0/22",
        "oob_tcp_if_include": "198.18.0.0/22",
    }


def test_wide_hosts_with_a_network_get_the_network_for_the_ranks(
    tmp_path: Path, away: None
) -> None:
    assert selection(tmp_path, "10.1.0.5,11.1.0.5", "10.0.0.0/7") == {
        "btl_tcp_if_include": "10.0.0.0/7"
    }


def test_the_users_own_selection_wins_over_the_network(tmp_path: Path, away: None) -> None:
    given = "--mca btl_tcp_if_exclude lo,docker0"
    assert selection(tmp_path, "node1,node2", "10.0.0.0/16", given) == {}


def test_covering_never_selects_wider_than_a_slash_16() -> None:
    assert mpi.WIDEST_SUBNET == 16
    wide = [ipaddress.IPv4Address("10.1.0.5"), ipaddress.IPv4Address("10.200.0.5")]
    assert mpi.covering(wide).prefixlen < mpi.WIDEST_SUBNET  # so mpi_subnet leaves it out
