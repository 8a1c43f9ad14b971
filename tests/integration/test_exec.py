"""``poprun-py exec`` on real sshd test hosts, run as the real command line: tagged and gathered
output, the worst host's exit code, unreachable hosts (255), bad host names (2, nothing
started), byte-exact arguments, and --timeout / Ctrl-C leaving nothing running anywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.helpers import unique_digits

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]
NASTY = ["a b", "q'uo\"te", "$(id)", "`id`", ";", "new\nline", "é☃", "", "*"]


def cli(cluster: TestCluster, *args: str, hosts: str | None = None) -> list[str]:
    names = hosts if hosts is not None else ",".join(cluster.host_names)
    ssh = ["--ssh-config", str(cluster.ssh_config), "--connect-timeout", "3"]
    return [sys.executable, "-m", "poprun_py", "exec", "--hosts", names, *ssh, *args]


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
    )


def pgrep(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def assert_gone(pattern: str, seconds: float = 5.0) -> None:
    """Nothing matching ``pattern`` runs on any host (they share this machine's process table)."""
    deadline = time.monotonic() + seconds
    while pgrep(pattern) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = pgrep(pattern)
    for pid in left:  # clean up by pid before failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running: {pattern}"


def logins(cluster: TestCluster) -> int:
    return sum(
        (cluster.state_dir / "hosts" / h.name / "sshd.log").read_text().count("Accepted publickey")
        for h in cluster.hosts
    )


def test_output_is_tagged_by_host(test_cluster_4: TestCluster):
    proc = run(cli(test_cluster_4, "--", "sh", "-c", 'echo "out $(hostname)"; echo oops >&2'))
    assert proc.returncode == 0, proc.stderr
    names = test_cluster_4.host_names
    assert sorted(proc.stdout.splitlines()) == sorted(f"{n}: out {n}" for n in names)
    assert sorted(proc.stderr.splitlines()) == sorted(f"{n}: oops" for n in names)


def test_gather_folds_identical_outputs(test_cluster_4: TestCluster):
    proc = run(cli(test_cluster_4, "--gather", "--", "echo", "same everywhere"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and lines[3] == "same everywhere"
    prefix = test_cluster_4.host_names[0][:-1]
    assert lines[1] == f"{prefix}[1-4] (4)"
    differ = run(cli(test_cluster_4, "--gather", "--", "hostname"))
    blocks = differ.stdout.split("---------------\n")[1:]
    assert [b.strip() for b in blocks[1::2]] == list(test_cluster_4.host_names)


def test_exit_code_is_the_worst_hosts(test_cluster_4: TestCluster):
    script = 'h=$(hostname); exit "${h##*[!0-9]}"'  # host N exits with N
    proc = run(cli(test_cluster_4, "--gather", "--", "sh", "-c", script))
    assert proc.returncode == 4
    names = test_cluster_4.host_names
    expected = [f"poprun-py: {n}: exited with exit code {i}" for i, n in enumerate(names, 1)]
    assert proc.stderr.splitlines() == expected


def test_unreachable_host_gives_255_and_the_others_still_run(test_cluster_4: TestCluster):
    names = ",".join([*test_cluster_4.host_names[:2], "zz-nowhere"])
    proc = run(cli(test_cluster_4, "--", "hostname", hosts=names))
    assert proc.returncode == 255
    assert proc.stderr.splitlines() == [
        "poprun-py: cannot resolve zz-nowhere: Name or service not known"
    ]
    assert sorted(proc.stdout.splitlines()) == sorted(f"{n}: {n}" for n in names.split(",")[:2])


def test_wrong_user_is_one_line_per_host(test_cluster_4: TestCluster):
    proc = run(cli(test_cluster_4, "--user", "nosuchuser-poprun", "--", "true"))
    assert proc.returncode == 255
    lines = proc.stderr.splitlines()
    assert len(lines) == 4
    assert all(
        line.startswith("poprun-py: nosuchuser-poprun@") and "refused every key" in line
        for line in lines
    )


def test_bad_host_name_never_reaches_a_shell(test_cluster_4: TestCluster, tmp_path: Path):
    marker = tmp_path / "marker"
    before = logins(test_cluster_4)
    proc = run(cli(test_cluster_4, "--", "touch", str(marker), hosts="a;rm -rf x"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "poprun-py: error: bad host name 'a;rm -rf x': use letters, digits, '.', '-' and '_' only"
    ]
    assert not marker.exists()
    assert logins(test_cluster_4) == before  # not one connection was made


def test_arguments_arrive_byte_for_byte(test_cluster_4: TestCluster):
    host = test_cluster_4.hosts[0].name
    probe = "import sys, json; print(json.dumps(sys.argv[1:]))"
    proc = run(cli(test_cluster_4, "--", "python3", "-c", probe, *NASTY, hosts=host))
    assert proc.returncode == 0, proc.stderr
    tag, _, payload = proc.stdout.partition(": ")
    assert tag == host
    assert json.loads(payload) == NASTY


def test_timeout_exits_124_and_leaves_nothing(test_cluster_4: TestCluster):
    mark = f"sleep 42{unique_digits()}.5"
    proc = run(cli(test_cluster_4, "--timeout", "1", "--", "sh", "-c", f"{mark} & {mark}; wait"))
    assert proc.returncode == 124
    assert len(proc.stderr.splitlines()) == 4
    assert all("timed out after 1 s" in line for line in proc.stderr.splitlines())
    assert_gone(mark)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_every_host_and_exits_130(test_cluster_4: TestCluster, sig: int):
    mark = f"sleep 43{unique_digits()}.{sig}"
    proc = subprocess.Popen(
        cli(test_cluster_4, "--", "sh", "-c", f"{mark} & {mark}; wait"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(pgrep(f"^{mark}")) < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pgrep(f"^{mark}")) == 8, "the command did not start on every host"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert_gone(mark)
