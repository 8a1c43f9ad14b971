"""Sync on real sshd test hosts: rsync and SFTP each send a tree once and nothing the second time,
preserve modes, mtimes and symlinks, report progress, and fail with exit 3 (writing nothing)
when a host cannot be reached.

The test hosts share this machine's filesystem, so a one-host pool with ``dest`` counts transfers
exactly; several hosts pushing the same files to one path see each other's work.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.errors import PreflightError
from poprun_py.providers.netns import TestCluster
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from poprun_py.ssh.sync import sync

pytestmark = pytest.mark.hosts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "src" / "proj"
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o750)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "deep" / "weights.bin").write_bytes(os.urandom(200_000))
    (root / "data with space.txt").write_text("é☃\n")
    (root / "latest").symlink_to("train.py")
    return root


def pool_of(cluster: TestCluster, count: int = 1) -> ConnectionPool:
    hosts = [HostSpec(h.name) for h in cluster.hosts[:count]]
    return ConnectionPool(hosts, SshSettings(ssh_config=cluster.ssh_config, connect_timeout=2.0))


def same_tree(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b)
    assert not (cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files), cmp.report()
    for path in a.rglob("*"):
        other = b / path.relative_to(a)
        if path.is_symlink():
            assert os.readlink(other) == os.readlink(path)
        elif path.is_file():
            assert other.stat().st_mode == path.stat().st_mode
            assert int(other.stat().st_mtime) == int(path.stat().st_mtime)
    for sub in cmp.common_dirs:
        same_tree(a / sub, b / sub)


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sends_once_then_nothing_then_only_the_change(
    test_cluster_4: TestCluster, project: Path, tmp_path: Path, method: str
):
    dest = tmp_path / "dst"
    with pool_of(test_cluster_4) as pool:
        first = sync(pool, [str(project)], dest=str(dest), method=method)
        same_tree(project, dest / "proj")
        second = sync(pool, [str(project)], dest=str(dest), method=method)
        (project / "train.py").write_text("print('changed')\n")
        os.utime(project / "train.py", (1_700_000_000, 1_700_000_000))
        third = sync(pool, [str(project)], dest=str(dest), method=method)
    assert {h.method for h in first.hosts} == {method}
    assert (first.files_sent, first.files_total) == (5, 5)
    assert first.hosts[0].bytes_sent == first.bytes_total
    assert second.files_sent == 0
    assert third.files_sent == 1 and third.hosts[0].bytes_sent == len("print('changed')\n")
    same_tree(project, dest / "proj")


def test_every_host_in_parallel_with_progress(
    test_cluster_4: TestCluster, project: Path, tmp_path: Path
):
    seen: dict[str, tuple[int, int]] = {}
    with pool_of(test_cluster_4, 4) as pool:
        report = sync(
            pool,
            [str(project)],
            dest=str(tmp_path / "all"),
            progress=lambda h, d, t: seen.update({h: (d, t)}),
        )
        again = sync(pool, [str(project)])  # the same absolute path: here, the very same files
    total = report.bytes_total
    assert seen == {h.name: (total, total) for h in test_cluster_4.hosts}
    assert {h.host for h in report.hosts} == set(test_cluster_4.host_names)
    assert again.files_sent == 0
    same_tree(project, tmp_path / "all" / "proj")


def test_unreachable_host_fails_before_anything_is_written(
    test_cluster_4: TestCluster, project: Path, tmp_path: Path
):
    dest = tmp_path / "never"
    argv = [
        sys.executable,
        "-m",
        "poprun_py",
        "sync",
        "--hosts",
        f"{test_cluster_4.hosts[0].name},zz-nohost",
    ]
    argv += ["--ssh-config", str(test_cluster_4.ssh_config), "--dest", str(dest), str(project)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "zz-nohost" in proc.stderr and "nothing was started" in proc.stderr
    assert not dest.exists()
    hosts = [HostSpec(test_cluster_4.hosts[0].name), HostSpec("zz-nohost")]
    pool = ConnectionPool(hosts, SshSettings(ssh_config=test_cluster_4.ssh_config))
    with pool, pytest.raises(PreflightError) as err:
        sync(pool, [str(project)], dest=str(dest))
    assert [f.host for f in err.value.faults] == ["zz-nohost"]
    assert not dest.exists()


def test_cli_sync_defaults_to_the_current_directory(
    test_cluster_4: TestCluster, project: Path, tmp_path: Path
):
    dest = tmp_path / "cli"
    argv = [sys.executable, "-m", "poprun_py", "sync", "--hosts", test_cluster_4.hosts[1].name]
    argv += ["--ssh-config", str(test_cluster_4.ssh_config), "--dest", str(dest)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=project, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "5 file(s)" in proc.stderr
    same_tree(project, dest / "proj")


@pytest.mark.requires("rsync", "pgrep")
def test_cli_sync_timeout_stops_a_push_that_does_not_finish(
    test_cluster_4: TestCluster, project: Path, tmp_path: Path
):
    """``sync --timeout``: a push still running then fails its host (exit 3, one line naming
    it) and its rsync is gone: here an rsync on the launcher's PATH that never ends."""
    marker = f"{60 + uuid.uuid4().int % 1000 / 997:.6f}"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rsync").write_text(f"#!/bin/sh\nexec sleep {marker}\n")
    (fake / "rsync").chmod(0o755)
    host = test_cluster_4.hosts[1].name
    argv = [sys.executable, "-m", "poprun_py", "sync", "--hosts", host, "--method", "rsync"]
    argv += ["--ssh-config", str(test_cluster_4.ssh_config), "--dest", str(tmp_path / "cli")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [*argv, "--timeout", "2s"],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=60,  # without the deadline the fake rsync would hold sync for a minute
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert f"rsync to {host} did not finish in time (it was stopped)" in proc.stderr
    gone = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, check=False)
    assert gone.stdout == b""


def test_cli_sync_refuses_a_timeout_that_is_not_a_duration(project: Path) -> None:
    argv = [sys.executable, "-m", "poprun_py", "sync", "--hosts", "h1", "--timeout", "soon"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=project, env=env, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "poprun-py: error: --timeout: 'soon' is not a duration (e.g. 90s, 45m, 2h)"
    ]
