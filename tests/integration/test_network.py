"""``--network`` and ``poprun-py check`` on real test hosts with two networks: SSH on the
management bridge (eth0, 198.18.x.x), the job on the data bridge (data1, data2, data3: a name of
its own per host, 198.19.x.x). Discovery runs in preflight's own login session; the instances'
variables, the rendered MPI commands and the all-reduce's sockets (``ss`` inside the
namespaces) are on the data network; ``check`` passes, then names the host whose data link is
down. Afterwards nothing but sshd runs in any host."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers import netns_data
from poprun_py.providers.netns import TestCluster
from tests.integration.helpers import need_mpi, sessions_started
from tests.integration.test_launch_hosts_cli import only_sshd, spec_for

pytestmark = pytest.mark.hosts

# Every instance reports its variables; rank 0 serves a sum all-reduce over TCP at
# MASTER_ADDR:MASTER_PORT; while every connection is open, each instance lists its established
# sockets on MASTER_PORT with ss, inside its own namespace.
ALLREDUCE = r"""
import json, os, socket, subprocess, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
def ss():
    out = subprocess.run(["ss", "-tnH", "state", "established"], capture_output=True, text=True)
    return [l.split()[-2:] for l in out.stdout.splitlines() if f":{port}" in l]
if rank == 0:
    srv = socket.create_server(("", port), reuse_port=False)
    peers = [srv.accept()[0] for _ in range(world - 1)]
    total = 1 + sum(int(p.recv(16)) for p in peers)
    seen = ss()
    for p in peers:
        p.sendall(str(total).encode())
    for p in peers:
        p.recv(1)
else:
    deadline = time.monotonic() + 10
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.sendall(str(rank + 1).encode())
    seen = ss()
    total = int(s.recv(16))
    s.close()
names = ("MASTER_ADDR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES")
print(json.dumps({"rank": rank, "sum": total, "ss": seen,
                  "env": {n: os.environ.get(n) for n in names}}))
"""


@pytest.fixture
def cluster(data_cluster_3: TestCluster) -> Iterator[TestCluster]:
    yield data_cluster_3
    for k, host in enumerate(data_cluster_3.hosts):  # every data link up again
        subprocess.run(["ip", "-n", host.netns, "link", "set", f"data{k + 1}", "up"], check=True)
    only_sshd(data_cluster_3)


def poprun(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def reports(out: Path, n: int) -> list[dict[str, object]]:
    return [
        json.loads((out / f"instance-{i}.log").read_text().strip().splitlines()[-1])
        for i in range(n)
    ]


def test_two_networks_different_interface_names(cluster: TestCluster) -> None:
    assert cluster.data_subnet is not None
    for k, host in enumerate(cluster.hosts):
        out = subprocess.run(
            ["ip", "-n", host.netns, "-o", "-4", "addr", "show"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"eth0    inet {host.address}/24" in out
        assert f"data{k + 1}    inet {host.data_address}/24" in out
        assert host.data_interface == netns_data.data_interface(k)


def test_network_sets_each_hosts_interface_and_the_sockets_use_it(
    cluster: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(cluster, tmp_path)
    out = tmp_path / "logs"
    before = sessions_started(cluster)
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "-n", "6", "-r", "6", "-o", str(out),
        "--network", str(cluster.data_subnet), "--",
        sys.executable, "-c", ALLREDUCE, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    after = sessions_started(cluster)
    assert {h: after[h] - before[h] for h in after} == {h.name: 1 for h in cluster.hosts}
    data = ipaddress.ip_network(cluster.data_subnet or "")
    for i, rep in enumerate(reports(out, 6)):
        host = cluster.hosts[i // 2]
        assert rep["sum"] == 21
        assert rep["env"] == {
            "MASTER_ADDR": cluster.hosts[0].data_address,
            "GLOO_SOCKET_IFNAME": host.data_interface,
            "NCCL_SOCKET_IFNAME": host.data_interface,
            "UCX_NET_DEVICES": host.data_interface,
        }
        sockets = rep["ss"]
        assert isinstance(sockets, list) and sockets, rep
        for local, peer in sockets:
            for end in (local, peer):
                assert ipaddress.ip_address(end.rsplit(":", 1)[0]) in data, sockets


def test_mpi_commands_follow_the_network(cluster: TestCluster, tmp_path: Path) -> None:
    from poprun_py.backends import get_backend
    from poprun_py.core.result import RunSettings
    from poprun_py.launch.launcher import render
    from poprun_py.prepare.job import LaunchOptions, prepare

    spec = spec_for(cluster, tmp_path)
    by_name = {h.name: h for h in cluster.hosts}
    for backend in ("mpirun", "mpiexec"):
        opts = LaunchOptions(
            cluster=str(spec), backend=backend, network=cluster.data_subnet, program=("true",)
        )
        prep = prepare(opts)
        session = get_backend(backend).open(prep, RunSettings())
        try:
            checked = session.preflight(prep)  # discovery over the agents' sessions
            job = render(checked.prep, str(tmp_path / backend), checked.topologies)
        finally:
            session.close()
        words = list(job.launcher)
        if backend == "mpirun":
            at = words.index("btl_tcp_if_include")
            assert words[at + 1] == cluster.data_subnet
            assert words[words.index("oob_tcp_if_include") + 1] == cluster.data_subnet
        else:  # names differ per host: no -iface; each rank names its own host's
            assert "-iface" not in words
            for inst in job.instances:
                at = [k for k, w in enumerate(words) if w == "UCX_NET_DEVICES"]
                assert words[at[inst.index] + 1] == by_name[inst.host].data_interface
        for inst in job.instances:
            assert inst.env["GLOO_SOCKET_IFNAME"] == by_name[inst.host].data_interface


@pytest.mark.mpi
@pytest.mark.requires("mpirun", "mpi4py")
def test_mpirun_on_the_data_network(cluster: TestCluster, tmp_path: Path) -> None:
    spec = spec_for(cluster, tmp_path)
    out = tmp_path / "logs"
    root = Path(__file__).resolve().parents[2]
    proc = poprun(
        "launch", "-c", str(spec), "-b", "mpirun", "-o", str(out),
        "--network", str(cluster.data_subnet), "--",
        sys.executable, str(root / "examples" / "mpi_check.py"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [r["allreduce"] for r in reports(out, 3)] == [6, 6, 6]


def test_preflight_refuses_hosts_without_an_address_in_the_network(
    cluster: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(cluster, tmp_path)
    only_first = f"{cluster.hosts[0].data_address}/32"
    marker = tmp_path / "started"
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--network", only_first,
        "--", "touch", str(marker), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    for host in cluster.hosts[1:]:
        assert host.name in proc.stderr
    assert f"no address in {only_first}" in proc.stderr
    assert cluster.hosts[0].name not in proc.stderr.split("fault(s)")[1]


def test_check_passes_then_names_the_host_whose_data_link_is_down(
    cluster: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(cluster, tmp_path)
    args = ("check", "-c", str(spec), "-b", "ssh", "--network", str(cluster.data_subnet))
    proc = poprun(*args, "--check-timeout", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: 3/3 host(s) ok" in proc.stdout
    broken = cluster.hosts[2]
    netns_data.set_data_link(
        lambda argv: subprocess.run(argv, check=True, capture_output=True, text=True).stdout,
        broken.netns,
        2,
        up=False,
    )
    proc = poprun(*args, "--check-timeout", "3", cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "check: 2/3 host(s) ok" in proc.stdout
    bad = [line for line in proc.stdout.splitlines() if "cannot reach MASTER_ADDR" in line]
    assert [line.split()[0] for line in bad] == [broken.name], proc.stdout
    assert broken.name in proc.stderr  # the fault table


def test_launch_check_runs_the_program_only_when_the_check_passes(
    cluster: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(cluster, tmp_path)
    marker = tmp_path / "ran"
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--check", "--check-timeout", "3",
        "--network", str(cluster.data_subnet), "--", "touch", str(marker), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() and "check: 3/3 host(s) ok" in proc.stderr


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec"])
def test_check_needs_nothing_of_poprun_py_on_the_hosts(
    cluster: TestCluster, tmp_path: Path, backend: str
) -> None:
    """The hosts' Python (the spec's ``defaults.python``) is a fresh venv that cannot import
    poprun_py: the check's program ships in the instances' environment."""
    if backend == "mpirun":
        need_mpi()
    elif backend == "mpiexec":
        from tests.integration.test_mpiexec import need_mpich

        need_mpich()
    venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    checked_with(cluster, tmp_path, venv / "bin" / "python", backend)


@pytest.mark.old_pythons
def test_check_runs_on_a_hosts_python_3_7(cluster: TestCluster, tmp_path: Path) -> None:
    """The oldest Python the agent runs on runs the check too (a pyenv build, no poprun_py)."""
    from tests.integration.test_host_tools import old_python

    checked_with(cluster, tmp_path, old_python("3.7"), "ssh")


def checked_with(cluster: TestCluster, tmp_path: Path, python: Path, backend: str) -> None:
    """``check`` passes on every host with ``python`` as the spec's ``defaults.python``, an
    interpreter that cannot import poprun_py; the program's source is never printed."""
    alone = subprocess.run(
        [python, "-c", "import poprun_py"], cwd=tmp_path, capture_output=True, check=False
    )
    assert alone.returncode != 0  # what a host without poprun-py has
    spec = spec_for(cluster, tmp_path, python=python)
    proc = poprun("check", "-c", str(spec), "-b", backend, "--check-timeout", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: 3/3 host(s) ok" in proc.stdout
    assert "def program()" not in proc.stdout + proc.stderr  # the source is never printed


@pytest.mark.mpi
def test_mpiexec_on_the_data_network(cluster: TestCluster, tmp_path: Path) -> None:
    from tests.integration.test_mpiexec import MPI_PROGRAM, need_mpich

    need_mpich()
    (tmp_path / "check.c").write_text(MPI_PROGRAM)
    program = str(tmp_path / "check")
    subprocess.run(["mpicc.mpich", "-O1", "-o", program, str(tmp_path / "check.c")], check=True)
    spec = spec_for(cluster, tmp_path)
    proc = poprun(
        "launch", "-c", str(spec), "-b", "mpiexec", "-n", "6", "-r", "6",
        "--network", str(cluster.data_subnet), "--", program, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sums = [json.loads(line.split("] ", 1)[1])["allreduce"] for line in proc.stdout.splitlines()]
    assert sums == [21] * 6


# torch.distributed's Gloo from the torch variables; after an all-reduce, every established TCP
# socket of this process (Gloo's pairs and its store) as seen by ss in the instance's namespace.
GLOO = r"""
import json, os, subprocess
import torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(value)
out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True)
mine = [l.split()[2:4] for l in out.stdout.splitlines() if f"pid={os.getpid()}," in l]
dist.barrier()
dist.destroy_process_group()
print(json.dumps({"sum": value.item(), "ss": mine}))
"""


def ipv4_of(end: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``198.19.0.11:5000`` or ``[::ffff:198.19.0.11]:5000`` -> the IPv4 address."""
    host = end.rsplit(":", 1)[0].strip("[]")
    return ipaddress.ip_address(host.removeprefix("::ffff:"))


@pytest.mark.torch
def test_torch_gloo_sockets_follow_the_network(cluster: TestCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spec = spec_for(cluster, tmp_path)
    out = tmp_path / "logs"
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "-o", str(out),
        "--network", str(cluster.data_subnet), "--", sys.executable, "-c", GLOO,
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = ipaddress.ip_network(cluster.data_subnet or "")
    for rep in reports(out, 3):
        assert rep["sum"] == 6.0
        sockets = rep["ss"]
        assert isinstance(sockets, list) and len(sockets) >= 2, rep  # the store and a peer
        for pair in sockets:
            for end in pair:
                assert ipv4_of(end) in data, sockets


@pytest.mark.torch
def test_check_with_torch_gloo(cluster: TestCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spec = spec_for(cluster, tmp_path)
    proc = poprun(
        "check", "-c", str(spec), "-b", "ssh", "--network", str(cluster.data_subnet),
        "--check-torch", "--check-timeout", "30", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:4]]
    assert [row[5] for row in rows] == ["ok", "ok", "ok"], proc.stdout
