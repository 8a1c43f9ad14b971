"""Instances on remote hosts do not inherit the launcher's environment (issue 20 A): over ssh
and Open MPI's mpirun they get the host's login session's environment plus the instance
environment, and a variable reaches them only when passed (``--env KEY=VALUE``, ``--env KEY``,
or the spec's ``env``). Local instances inherit it, and so do MPICH's (hydra's default). Tests
comparing a local run with a remote one must account for it (see test_long_run_hosts.py: the
reference run is made on the same hosts)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests.integration.test_launch_hosts_cli import spec_for

SHOW = "import os, sys; print('seen', os.environ.get(sys.argv[1], '<unset>'))"


def launch(args: list[str], tmp_path: Path, name: str, value: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "poprun_py", "launch", *args, "--", "python3", "-c", SHOW, name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, name: value},
    )
    assert done.returncode == 0, done.stderr
    return sorted(line.split("] ", 1)[1] for line in done.stdout.splitlines() if "] seen" in line)


@pytest.mark.hosts
@pytest.mark.parametrize(
    ("backend", "inherits"),
    [
        ("ssh", False),
        pytest.param("mpirun", False, marks=[pytest.mark.mpi, pytest.mark.requires("mpirun")]),
        # MPICH's hydra passes mpiexec's whole environment on by default (-genvall)
        pytest.param(
            "mpiexec", True, marks=[pytest.mark.mpi, pytest.mark.requires("mpiexec.hydra")]
        ),
    ],
)
def test_remote_instances_get_the_variables_passed_on(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str, inherits: bool
) -> None:
    name, value = f"EVERYDAY_TEST_{uuid.uuid4().hex[:8].upper()}", uuid.uuid4().hex
    args = ["-c", str(spec_for(test_cluster_4, tmp_path)), "-b", backend, "-r", "4", "-n", "4"]
    seen = value if inherits else "<unset>"
    assert launch(args, tmp_path, name, value) == [f"seen {seen}"] * 4
    passed = launch([*args, "--env", f"{name}={value}"], tmp_path, name, value)
    assert passed == [f"seen {value}"] * 4
    by_name = launch([*args, "--env", name], tmp_path, name, value)  # the caller's value
    assert by_name == [f"seen {value}"] * 4


def test_local_instances_inherit_the_launchers_environment(tmp_path: Path) -> None:
    name, value = f"EVERYDAY_TEST_{uuid.uuid4().hex[:8].upper()}", uuid.uuid4().hex
    local = ["--hosts", "localhost", "-b", "local", "-r", "2", "-n", "2"]
    assert launch(local, tmp_path, name, value) == [f"seen {value}"] * 2
