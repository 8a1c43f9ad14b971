"""The mpiexec backend's pure parts: options, hydra's tags, failure reports, the shim's one-path
executable, and a missing ``mpiexec.hydra`` as a preflight fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.agent.relay import Relay
from poprun_py.backends.mpiexec import (
    MPIEXEC_MISSING,
    HydraDemux,
    HydraReport,
    MpiexecBackend,
    mpiexec_args,
)
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.result import RunOptions
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.errors import EXIT_PREFLIGHT, PreflightError
from poprun_py.hostside import rsh_shim
from poprun_py.process.output import LAUNCHER_INDEX, Output
from poprun_py.process.signals import Control
from poprun_py.render.job import render_job


def test_remote_launch_gets_the_shim_and_the_address_hosts_connect_back_to() -> None:
    args = mpiexec_args(("-verbose",), local_address="198.18.0.1", environ={})
    assert args == (
        "-verbose", "-launcher", "ssh", "-launcher-exec", rsh_shim.exec_script_path(),
        "-localhost", "198.18.0.1",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("user", "environ", "expected"),
    [
        (("-launcher", "ssh"), {}, ("-launcher", "ssh", "-localhost", "10.0.0.1")),
        (("-bootstrap-exec", "/x"), {}, ("-bootstrap-exec", "/x", "-localhost", "10.0.0.1")),
        (("-iface", "eth1"), {"HYDRA_LAUNCHER": "rsh"}, ("-iface", "eth1")),
    ],
)
def test_the_users_own_launcher_or_address_wins(
    user: tuple[str, ...], environ: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert mpiexec_args(user, local_address="10.0.0.1", environ=environ) == expected


def test_uses_relay_knows_the_hydra_form() -> None:
    path = rsh_shim.exec_script_path()
    assert rsh_shim.uses_relay(("mpiexec.hydra", "-launcher-exec", path, "prog"))
    assert not rsh_shim.uses_relay(("mpiexec.hydra", "prog", path))


def test_launcher_exec_is_one_executable_that_runs_the_shim(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    path = rsh_shim.launcher_exec(sys.executable, environ)
    assert path == rsh_shim.exec_script_path(sys.executable, environ)
    assert path.startswith(str(tmp_path)) and os.access(path, os.X_OK)
    assert oct(os.stat(path).st_mode & 0o777) == "0o700"
    # as hydra runs it: -x HOST COMMAND...; without the relay's socket it fails as ssh would
    env = {k: v for k, v in os.environ.items() if k != rsh_shim.SOCKET_VAR}
    argv = [path, "-x", "h1", "true"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env)
    assert done.returncode == 255 and "POPRUN_RSH_SOCKET is not set" in done.stderr
    assert rsh_shim.launcher_exec(sys.executable, environ) == path  # written once


class StopCounter(Relay):
    def __init__(self) -> None:
        super().__init__()
        self.stops = 0

    def stop_daemons(self) -> None:
        self.stops += 1


def demux(
    chunks: list[bytes], stream: str = "stdout", control: Control | None = None
) -> tuple[list[tuple[int, str, str]], HydraReport, int]:
    lines: list[tuple[int, str, str]] = []
    out = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {})
    report, relay = HydraReport(), StopCounter()
    feed = HydraDemux(out, stream, report, relay, control or Control())
    for chunk in chunks:
        feed.feed(chunk)
    feed.close()
    return lines, report, relay.stops


def test_hydra_tags_are_rejoined_into_lines_per_rank() -> None:
    # as hydra 4.0 writes a rank's line written in two pieces, between other ranks' lines
    stream = b"[0]<poprun>:zero\n[2]<poprun>:part[1]<poprun>:one\n[2]<poprun>: two\nhydra says\n"
    lines, _, _ = demux([stream[:17], stream[17:30], stream[30:]])
    assert lines == [
        (0, "stdout", "zero"),
        (1, "stdout", "one"),
        (2, "stdout", "part two"),
        (LAUNCHER_INDEX, "stdout", "hydra says"),
    ]


def test_the_first_failure_report_is_the_root_cause_and_stops_the_launch() -> None:
    stream = (
        b"[1]<poprun>:oops\n"
        b"[3]<poprun>:poprun-py: rank exited with code 7\n"
        b"[0]<poprun>:poprun-py: rank exited with code 143\n"
    )
    control = Control()
    lines, report, stops = demux([stream], stream="stderr", control=control)
    assert (report.rank, report.exit_code, stops) == (3, 7, 1)
    assert control.stop_reason == "instance 3 failed"  # hydra itself is stopped too
    assert lines == [(1, "stderr", "oops")]  # the reports are poprun-py's, not the program's


def test_a_missing_mpiexec_is_a_one_line_preflight_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("localhost")), JobSpec(("true",)))
    job = render_job(plan, "mpiexec", job_dir=str(tmp_path / "job"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PreflightError) as caught:
        MpiexecBackend().run(job, RunOptions())
    assert caught.value.exit_code == EXIT_PREFLIGHT
    assert MPIEXEC_MISSING in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "job").exists()  # nothing written, nothing started
