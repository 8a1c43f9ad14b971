"""Before anything starts, on real test hosts (issue 20, items 16-17): the design's own
``launch ... train.py`` (a script without its execute bit) runs under each host's ``python3``
through the ssh and mpirun backends; a program or working directory missing on the hosts is
exit 3 naming every host, in the agents' preflight, and nothing starts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.test_launch_hosts_cli import only_sshd, poprun, spec_for

pytestmark = pytest.mark.hosts

TRAIN = "import os, socket\nprint('hi', os.environ['RANK'], socket.gethostname())\n"


@pytest.mark.parametrize("backend", ["ssh", pytest.param("mpirun", marks=pytest.mark.mpi)])
def test_train_py_runs_under_python3_on_every_host(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)  # mode 0644: not executable
    spec = spec_for(test_cluster_4, tmp_path)
    args = ["launch", "-c", str(spec), "-b", backend, "--workdir", str(tmp_path)]
    proc = poprun(*args, "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    names = [h.name for h in test_cluster_4.hosts]
    assert sorted(line for line in proc.stdout.splitlines() if " hi " in line) == [
        f"[{name}:{i}] hi {i} {name}" for i, name in enumerate(names)
    ]
    only_sshd(test_cluster_4)


def test_a_program_missing_on_the_hosts_is_exit_3_naming_every_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    name = f"no-such-program-{uuid.uuid4().hex[:8]}"
    proc = poprun("launch", "-c", str(spec), "-b", "ssh", "--", name, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    names = [h.name for h in test_cluster_4.hosts]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"poprun-py: error: preflight failed on {names[0]}: program: {name}: not found on PATH "
        "(and 3 more); nothing was started"
    )
    assert all(n in proc.stderr for n in names)
    only_sshd(test_cluster_4)


def test_a_workdir_missing_on_the_hosts_is_exit_3_and_nothing_starts(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    spec = spec_for(test_cluster_4, tmp_path)
    marker, absent = tmp_path / "ran", tmp_path / "nonexist"
    proc = poprun(
        "launch", "-c", str(spec), "-b", "ssh", "--workdir", str(absent), "--",
        "sh", "-c", f"touch {marker}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    first = test_cluster_4.hosts[0].name
    assert proc.stderr.strip().splitlines()[-1] == (
        f"poprun-py: error: preflight failed on {first}: workdir: working directory {absent} is "
        "missing (and 3 more); nothing was started"
    )
    assert not marker.exists()
    only_sshd(test_cluster_4)
