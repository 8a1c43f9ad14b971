"""What one host lacks, found by preflight for that host: the agent runs on any python3 from 3.7
(``MIN_PYTHON``), and a host whose python3 is older is refused in preflight with one line naming
it, exit 3, nothing started; a tool missing on one of several hosts is a row of the preflight
table for that host alone.

Real old interpreters (pyenv's 3.7 and 3.6 builds, where this machine has them) are put in place
of ``/usr/bin/python3`` on one test host only: a bind mount inside that host's own mount
namespace (its sshd runs under ``ip netns exec``, which gives it one), so that host's login
sessions -- and so the agent poprun-py starts there -- get that Python, and nothing else does.
A tool is taken away from one host the same way (a non-executable file mounted over it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.hostside.agent import MIN_PYTHON
from poprun_py.providers.netns import TestCluster, TestHost
from tests.hostfixtures import MakeCluster
from tests.integration.helpers import settled

pytestmark = pytest.mark.hosts


PYENV = Path("/root/.pyenv/versions")


def old_python(version: str) -> Path:
    try:
        found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    except OSError:  # not root: /root cannot be read
        found = []
    if not found:
        pytest.skip(f"no python{version} build here (pyenv) to stand in for a host's python3")
    return found[-1]


def mount_over(host: TestHost, source: Path, target: Path) -> None:
    """Bind-mount ``source`` over ``target`` in ``host``'s mount namespace only."""
    subprocess.run(
        ["nsenter", f"--target={host.sshd_pid}", "--mount", "--root", "--",
         "mount", "--bind", str(source), str(target)],
        check=True,
    )  # fmt: skip


def give_python(host: TestHost, python: Path, tmp_path: Path) -> None:
    """Make ``/usr/bin/python3`` run ``python`` in ``host``'s mount namespace only."""
    wrapper = tmp_path / f"python3-{host.name}"
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    mount_over(host, wrapper, Path("/usr/bin/python3"))


def launch(
    cluster: TestCluster, hosts: list[TestHost], cwd: Path, program: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "poprun_py", "launch", "-b", "ssh", "--ssh-config",
            str(cluster.ssh_config), "--hosts", ",".join(h.name for h in hosts),
            "--", *(program or ("sh", "-c", 'echo "ran on $(hostname)"'))]  # fmt: skip
    # the preflight table is wrapped to COLUMNS (rich): wide, so that a row is one line to
    # parse whatever the terminal the tests run in (launch has no JSON form of its faults)
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.old_pythons
def test_agent_runs_on_the_oldest_python_and_refuses_an_older_one(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    assert MIN_PYTHON == (3, 7)
    cluster = make_test_cluster(2, "y")
    oldest, too_old = cluster.hosts
    give_python(oldest, old_python("3.7"), tmp_path)
    give_python(too_old, old_python("3.6"), tmp_path)

    refused = launch(cluster, [oldest, too_old], tmp_path)
    assert refused.returncode == 3, refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("poprun-py: error")]
    assert len(error) == 1, refused.stderr
    assert f"preflight failed on {too_old.name}" in error[0]
    assert "python3 here is 3.6; poprun-py needs 3.7 or later on every host" in error[0]
    assert "ran on" not in refused.stdout  # nothing started, not even on the fit host
    assert oldest.name not in error[0]

    ran = launch(cluster, [oldest], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert f"ran on {oldest.name}" in ran.stdout
    assert settled(cluster) == {}


def test_a_tool_missing_on_one_of_several_hosts_is_reported_for_that_host(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(3, "z")
    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\necho "ran on $(hostname)"\n')
    tool.chmod(0o755)
    gone = tmp_path / "not-a-tool"
    gone.write_text("")
    gone.chmod(0o644)
    lacking = cluster.hosts[1]
    mount_over(lacking, gone, tool)  # on that host, tool is no executable file

    alone = launch(cluster, list(cluster.hosts), tmp_path, (str(tool),))
    assert alone.returncode == 3, alone.stderr
    assert "ran on" not in alone.stdout  # nothing started on the hosts that have it
    line = f"preflight failed on {lacking.name}: program: {tool}: not an executable file"
    assert alone.stderr.splitlines() == [f"poprun-py: error: {line}; nothing was started"]

    also = cluster.hosts[2]
    mount_over(also, gone, tool)  # two faults: the preflight table, one row a host
    both = launch(cluster, list(cluster.hosts), tmp_path, (str(tool),))
    assert both.returncode == 3, both.stderr
    err = both.stderr.splitlines()
    table = err[err.index(next(x for x in err if x.split() == ["host", "check", "problem"])) + 1 :]
    cells = [x.split()[:2] for x in table if x[:1] not in ("", " ") and not x.startswith("poprun")]
    rows = [(host, check) for host, check in cells]  # a folded problem's lines start blank
    assert rows == [(lacking.name, "program"), (also.name, "program")], both.stderr
    assert cluster.hosts[0].name not in both.stderr
    assert "ran on" not in both.stdout
    assert settled(cluster) == {}


@pytest.mark.parametrize(
    ("backend", "tool", "install"),
    [("mpirun", "mpirun", "Open MPI (Debian: openmpi-bin)"),
     ("mpiexec", "mpiexec.hydra", "MPICH (Debian: mpich)")],
)  # fmt: skip
def test_a_launcher_missing_here_is_a_preflight_fault_before_any_host_is_contacted(
    make_test_cluster: MakeCluster, tmp_path: Path, backend: str, tool: str, install: str
) -> None:
    from tests.integration.helpers import sessions_started

    cluster = make_test_cluster(2, "m")
    bare_path = tmp_path / "bin"  # python, and nothing else: no mpirun, no mpiexec.hydra
    bare_path.mkdir()
    (bare_path / "python3").symlink_to(sys.executable)
    before = sessions_started(cluster)
    argv = [sys.executable, "-m", "poprun_py", "launch", "-b", backend, "--ssh-config",
            str(cluster.ssh_config), "--hosts", ",".join(cluster.host_names),
            "--", "true"]  # fmt: skip
    env = {"PATH": str(bare_path), "HOME": str(tmp_path)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 3, proc.stderr
    line = f"preflight failed on localhost: {tool}: {tool} not found on PATH; install {install}"
    assert proc.stderr.splitlines() == [f"poprun-py: error: {line}; nothing was started"]
    assert sessions_started(cluster) == before  # no login session on any host
