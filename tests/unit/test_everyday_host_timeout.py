"""``--host-timeout`` / ``defaults.host_timeout`` (issue 20, item 2): a duration like every
duration, refused in one line with exit 2 before anything starts, carried to every place a
launch is made again (the Slurm batch job's argv, the detach record) and into the run's
options, from which the backends' agent timings are made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.agent.client import LIVENESS, AgentLink, pausing
from poprun_py.core.result import HOST_TIMEOUT
from poprun_py.errors import SpecError, UsageError
from poprun_py.jobs.detach import DetachOptions, supervisor_record
from poprun_py.jobs.record import JobRecord, from_json, to_json
from poprun_py.jobs.supervisor import Recorder, launch_options
from poprun_py.launch.launcher import RunSettings, run_options
from poprun_py.prepare.job import LaunchOptions, prepare

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, "-m", "poprun_py", "launch", "--hosts", "localhost"]


def prepared(tmp_path: Path, spec: str | None = None, **options: object) -> float:
    cluster = None
    if spec is not None:
        cluster = tmp_path / "c.yaml"
        cluster.write_text(f"name: c\nhosts: [{{name: h1}}]\ndefaults:\n  {spec}\n")
    opts = LaunchOptions(
        hosts=None if cluster else "h1",
        cluster=str(cluster) if cluster else None,
        program=("t",),
        backend="ssh",
        **options,  # type: ignore[arg-type]
    )
    prep = prepare(opts, environ={})
    assert run_options(prep, RunSettings()).host_timeout == prep.host_timeout
    return prep.host_timeout


@pytest.mark.parametrize(
    ("given", "seconds"), [("90s", 90.0), ("45m", 2700.0), ("2h", 7200.0), ("2.5", 2.5)]
)
def test_host_timeout_takes_durations(tmp_path: Path, given: str, seconds: float) -> None:
    assert prepared(tmp_path, host_timeout=given) == seconds
    assert prepared(tmp_path, f"host_timeout: {given}") == seconds  # the spec's, too


def test_the_flag_beats_the_spec_which_beats_the_default(tmp_path: Path) -> None:
    assert prepared(tmp_path, "host_timeout: 90", host_timeout="2m") == 120.0
    assert prepared(tmp_path, "host_timeout: 90") == 90.0
    assert prepared(tmp_path) == HOST_TIMEOUT == LIVENESS == 180.0


def test_a_host_timeout_that_is_not_a_duration_is_one_line_naming_it(tmp_path: Path) -> None:
    for bad in ("soon", "0", "-3", "5x"):
        with pytest.raises(UsageError, match="--host-timeout") as caught:
            prepared(tmp_path, host_timeout=bad)
        assert "\n" not in str(caught.value)
    with pytest.raises(SpecError, match="host_timeout"):
        prepared(tmp_path, "host_timeout: soon")
    with pytest.raises(SpecError, match="host_timeout"):
        prepared(tmp_path, "host_timeout: 0")


def test_the_cli_refuses_a_bad_host_timeout_with_exit_2_and_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    proc = subprocess.run(
        [*LAUNCH, "--host-timeout", "soon", "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--host-timeout" in proc.stderr
    assert "'soon' is not a duration" in proc.stderr
    assert not marker.exists()


def test_the_slurm_batch_job_launches_again_with_the_host_timeout() -> None:
    render = [sys.executable, "-m", "poprun_py", "render", "--hosts", "h1,h2", "-b", "slurm"]
    proc = subprocess.run(
        [*render, "--host-timeout", "45m", "--", "t"], capture_output=True, text=True, check=True
    )
    assert re.search(r" --host-timeout[= ]45m ", proc.stdout.splitlines()[-1]), proc.stdout


def test_the_detach_record_carries_the_host_timeout_to_the_supervisor(tmp_path: Path) -> None:
    opts = LaunchOptions(hosts="h1,h2", program=("t",), backend="ssh", host_timeout="45m")
    record = supervisor_record(prepare(opts, environ={}), DetachOptions(), "h1")
    record = from_json(to_json(record))  # as it travels
    assert record.options["launch"]["host_timeout"] == "45m"
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    there = JobRecord(record.id, record.hosts, record.backend, 1.0, options=record.options)
    again = launch_options(Recorder(tmp_path, there, write_fd))
    assert prepare(again, environ={}).host_timeout == 2700.0
    os.close(write_fd)
    json.dumps(record.options)  # nothing in it that JSON cannot carry


def test_a_late_look_gives_the_host_back_the_time_nobody_listened() -> None:
    """The launcher stopped (SIGSTOP) or held up: its own silence is not the host's."""
    link = AgentLink("h1", (0,))
    link.heard = link.looked = 100.0
    assert link.silence(100.4) == pytest.approx(0.4)  # looked at on time: silence counts
    assert link.silence(160.4) == pytest.approx(0.4)  # a minute without looking: credited
    assert link.silence(161.0) == pytest.approx(1.0)


def test_pausing_handles_sigtstp_only_while_active_and_restores_it() -> None:
    import signal

    before = signal.getsignal(signal.SIGTSTP)
    with pausing():
        with pausing():
            assert signal.getsignal(signal.SIGTSTP) not in (before, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGTSTP) not in (before, signal.SIG_DFL)
    assert signal.getsignal(signal.SIGTSTP) == before
