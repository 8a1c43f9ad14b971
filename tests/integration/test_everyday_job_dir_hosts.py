"""Issue 20, item 15, on the test hosts: a successful job's directory goes from every host
(each host's agent, lingering after its job, removes its copy: no second login session), a
failed job's stays on them and is named, and ``--keep-job-dir`` keeps it.

The test hosts share this machine's file system, so these tests show the directory gone
wherever it was; that the hosts' removal is asked for at all is shown on the fakes
(tests/unit/test_launcher_fakes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.helpers import sessions_started
from tests.integration.test_launch_hosts_cli import only_sshd, poprun, spec_for

pytestmark = pytest.mark.hosts

SHOW = 'echo "shard $POPRUN_SHARD_FILE"; exit ${CODE:-0}'


def shard_files(stdout: str) -> list[Path]:
    return [Path(line.split()[-1]) for line in stdout.splitlines() if " shard " in f" {line}"]


def jobs_in(root: Path) -> list[Path]:
    jobs = root / "jobs"
    return sorted(jobs.iterdir()) if jobs.exists() else []


@pytest.mark.parametrize(
    "backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.requires("mpirun"))]
)
def test_a_successful_jobs_directory_goes_from_every_host_a_failed_ones_stays(
    backend: str, test_cluster_4: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("POPRUN_PY_JOB_ROOT", str(root))
    spec = spec_for(test_cluster_4, tmp_path)
    argv = ["launch", "-c", str(spec), "-b", backend, "-n", "4"]
    before = sessions_started(test_cluster_4)
    ok = poprun(*argv, "--", "sh", "-c", SHOW, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    # the removal goes through the job's agent, lingering after its job: no second login
    after = sessions_started(test_cluster_4)
    assert {h: after[h] - before.get(h, 0) for h in after} == {h: 1 for h in after}
    shards = shard_files(ok.stdout)
    assert len(shards) == 4, ok.stdout
    assert not any(s.exists() for s in shards) and jobs_in(root) == []
    assert "kept" not in ok.stderr
    failed = poprun(*argv, "--env", "CODE=3", "--", "sh", "-c", SHOW, cwd=tmp_path)
    assert failed.returncode == 3, failed.stderr
    (kept,) = jobs_in(root)
    assert f"poprun-py: the job's files are kept in {kept}\n" in failed.stderr
    assert all(s.exists() and s.parent == kept for s in shard_files(failed.stdout))
    only_sshd(test_cluster_4)


def test_keep_job_dir_keeps_it_on_the_hosts(
    test_cluster_4: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("POPRUN_PY_JOB_ROOT", str(root))
    spec = spec_for(test_cluster_4, tmp_path)
    argv = ["launch", "-c", str(spec), "-b", "ssh", "-n", "4", "--keep-job-dir"]
    kept = poprun(*argv, "--", "sh", "-c", SHOW, cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    shards = shard_files(kept.stdout)
    assert len(shards) == 4 and all(s.exists() for s in shards), kept.stdout
    only_sshd(test_cluster_4)
