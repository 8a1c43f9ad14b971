"""`poprun-py launch` through the CLI on real test hosts (network namespaces with sshd):
the ssh backend (output, logs, hostnames, failure exit code, preflight refusal) and the mpirun
backend (mpi4py across 4 hosts). Afterwards nothing but sshd may run in any host."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from poprun_py.process.proctree import alive
from poprun_py.providers.netns import TestCluster, host_pids
from tests.integration.helpers import marked_on, sessions_started

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]


def spec_for(cluster: TestCluster, tmp_path: Path, **defaults: object) -> Path:
    lines = [
        f"name: {cluster.name}",
        "ssh:",
        f"  known_hosts: {cluster.known_hosts}",
        f"  ssh_config: {cluster.ssh_config}",
        f"  identity_file: {cluster.identity_file}",
        "  user: root",
        "hosts:",
        *(f"  - {{name: {h.name}, address: {h.address}}}" for h in cluster.hosts),
        "defaults:",
        "  grace_period: 2",
        *(f"  {k}: {v}" for k, v in defaults.items()),
    ]
    path = tmp_path / "cluster.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


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


def leftovers(cluster: TestCluster, marker: str) -> dict[str, list[str]]:
    found = {host.name: marked_on(host, marker) for host in cluster.hosts}
    return {name: lines for name, lines in found.items() if lines}


def running_besides_sshd(cluster: TestCluster) -> dict[str, list[str]]:
    """Per host: live processes other than sshd (zombies waiting for the container's init to
    reap them are not running and do not count), with their command lines."""
    found = {}
    for host in cluster.hosts:
        cmds = []
        for pid in sorted(alive(set(host_pids(host.netns)))):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                    cmds.append(
                        Path(f"/proc/{pid}/cmdline").read_bytes()[:120].decode(errors="replace")
                    )
        if cmds:
            found[host.name] = cmds
    return found


def only_sshd(cluster: TestCluster, settle: float = 2.0) -> None:
    """Nothing but sshd left in any host (agents told to exit get ``settle`` seconds)."""
    deadline = time.monotonic() + settle
    while (left := running_besides_sshd(cluster)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == {}


def test_ssh_backend_runs_every_instance_on_its_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    out = tmp_path / "logs"
    show = 'echo "$RANK $POPRUN_HOST_NAME $(hostname) $LOCAL_RANK"'
    proc = poprun(
        "launch",
        "-c",
        str(spec),
        "-b",
        "ssh",
        "-r",
        "8",
        "-n",
        "8",
        "-o",
        str(out),
        "--",
        "sh",
        "-c",
        show,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    names = [h.name for h in test_cluster_4.hosts]
    for i in range(8):
        rank, planned, actual, local = (out / f"instance-{i}.log").read_text().split()
        assert (int(rank), planned, actual, int(local)) == (i, names[i // 2], names[i // 2], i % 2)
        assert f"[{names[i // 2]}:{i}] {i} " in proc.stdout
    only_sshd(test_cluster_4)


def test_one_failing_instance_stops_all_hosts_with_its_code(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    marker = f"m{uuid.uuid4().hex[:10]}"
    script = f'[ "$RANK" = 5 ] && exit 9; exec sleep 60 # {marker}'
    proc = poprun(
        "launch",
        "-c",
        str(spec),
        "-b",
        "ssh",
        "-r",
        "8",
        "-n",
        "8",
        "--",
        "sh",
        "-c",
        script,
        cwd=tmp_path,
    )
    assert proc.returncode == 9, proc.stderr
    assert "instance 5 on" in proc.stderr and "exited with code 9" in proc.stderr
    assert leftovers(test_cluster_4, marker) == {}
    only_sshd(test_cluster_4)


def test_preflight_refuses_a_missing_program_and_starts_nothing(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    flag = tmp_path / "ran"
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--", "/no/such/program", str(flag), cwd=tmp_path
    )
    assert proc.returncode == 3, proc.stderr
    assert "preflight failed" in proc.stderr
    assert not flag.exists()
    only_sshd(test_cluster_4)


@pytest.mark.mpi
def test_mpirun_backend_across_four_hosts(test_cluster_4: TestCluster, tmp_path: Path) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    out = tmp_path / "logs"
    before = sessions_started(test_cluster_4)
    proc = poprun(
        "launch",
        "-c",
        str(spec),
        "-b",
        "mpirun",
        "-r",
        "8",
        "-n",
        "4",
        "-o",
        str(out),
        "--",
        sys.executable,
        str(ROOT / "examples" / "mpi_check.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # the interface selection matches this machine too: Open MPI did not ignore it
    assert "invalid value" not in proc.stdout + proc.stderr
    names = [h.name for h in test_cluster_4.hosts]
    for i in range(4):
        line = json.loads((out / f"instance-{i}.log").read_text().strip().splitlines()[-1])
        assert (line["rank"], line["size"], line["hostname"]) == (i, 4, names[i])
        assert line["allreduce"] == 10
        assert line["env"]["POPDIST_REPLICA_INDEX_OFFSET"] == str(2 * i)
    # preflight, staging and Open MPI's daemon: one login session per host (the agent's)
    after = sessions_started(test_cluster_4)
    assert {h: after[h] - before[h] for h in after} == {h: 1 for h in names}
    only_sshd(test_cluster_4)
