"""--forward-signals: parsing (one clear line, exit 2, nothing launched), what poprun-py does with
a forwarded and an unforwarded signal, the checkpoint signal an instance learns (env and
poprun_py.dist), the rank wrappers' traps, and the warning when a library may take a forwarded
signal over."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun_py import dist
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.errors import UsageError
from poprun_py.process.signals import (
    FORWARD_SIGNALS,
    Control,
    forward_signals,
    handling_signals,
    parse_forward_signals,
)
from poprun_py.process.takeover import takeover_warnings, warn_takeovers
from poprun_py.render.job import render_job
from tests.unit.in_child import in_child

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("USR1,USR2,HUP", (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)),
        ("sighup", (signal.SIGHUP,)),
        ("SigUsr2, usr1", (signal.SIGUSR2, signal.SIGUSR1)),
        ("HUP,SIGHUP,hup", (signal.SIGHUP,)),
    ],
)
def test_names_with_or_without_sig_in_any_case(text: str, expected: tuple[int, ...]) -> None:
    assert parse_forward_signals(text) == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("KILL", "--forward-signals KILL: cannot be forwarded; choose among USR1, USR2, HUP"),
        ("usr1,sigstop", "--forward-signals sigstop: cannot be forwarded"),
        ("INT", "--forward-signals INT: cannot be forwarded"),
        ("TERM", "--forward-signals TERM: cannot be forwarded"),
        ("CHLD", "--forward-signals CHLD: cannot be forwarded"),
        ("USR3", "--forward-signals USR3: unknown"),
        ("", "--forward-signals (empty): unknown"),
        ("USR1,", "--forward-signals (empty): unknown"),
    ],
)
def test_a_bad_or_unforwardable_name_is_a_usage_error(text: str, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_forward_signals(text)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_the_default_and_what_a_backend_cannot_forward() -> None:
    assert forward_signals(None, "ssh") == FORWARD_SIGNALS == (signal.SIGUSR1, signal.SIGUSR2)
    assert forward_signals("HUP", "local") == forward_signals("HUP", "mpiexec") == (signal.SIGHUP,)
    for backend in ("mpirun", "slurm"):
        assert forward_signals("usr2", backend) == (signal.SIGUSR2,)
        with pytest.raises(UsageError, match=f"HUP: not with --backend {backend}"):
            forward_signals("USR1,HUP", backend)


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--forward-signals", "KILL"), "KILL: cannot be forwarded"),
        (("--forward-signals", "HUP", "--backend", "mpirun"), "HUP: not with --backend mpirun"),
    ],
)
def test_the_cli_says_one_line_exits_2_and_launches_nothing(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    marker = tmp_path / "ran"
    proc = poprun("launch", "-H", "localhost", *args, "--", "touch", str(marker), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], proc.stderr
    assert not marker.exists()


def test_the_spec_key_is_read(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\nhosts:\n  - name: localhost\ndefaults:\n  forward_signals: hup,usr2\n"
    )
    proc = poprun("launch", "-c", str(spec), "--dry-run", "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "POPRUN_CHECKPOINT_SIGNAL=SIGHUP" in proc.stdout, proc.stdout


def hup_and_usr2_while_armed(forwarding: tuple[int, ...]) -> tuple[list[int], int, bool]:
    """In a forked child: SIGUSR2 then SIGHUP to itself while a job runs; what was forwarded,
    how many interrupts, whether it is still alive (it is: we are returning)."""
    control = Control(forwarding=forwarding)
    try:
        with handling_signals(control):
            control.arm()
            for signum in (signal.SIGUSR2, signal.SIGHUP):
                os.kill(os.getpid(), signum)
            deadline = time.monotonic() + 5
            while not (control._forwards or control.interrupts) and time.monotonic() < deadline:
                time.sleep(0.01)
            return control.take_forwards(), control.interrupts, True
    finally:
        control.close()


def test_a_forwarded_hup_is_passed_on_and_an_unforwarded_usr2_is_ignored() -> None:
    forwarded, interrupts, alive = in_child(lambda: hup_and_usr2_while_armed((signal.SIGHUP,)))
    assert (forwarded, interrupts, alive) == ([signal.SIGHUP], 0, True)


def test_by_default_hup_still_stops_the_job() -> None:
    forwarded, interrupts, alive = in_child(lambda: hup_and_usr2_while_armed(FORWARD_SIGNALS))
    assert (forwarded, interrupts, alive) == ([signal.SIGUSR2], 1, True)


def test_the_instance_learns_the_first_forwarded_signal_as_its_checkpoint_signal() -> None:
    plan = make_plan(cluster_from_hosts(parse_hosts("h1,h2")), JobSpec(("t.py",), replicas=2))
    default = render_job(plan, "mpirun", job_dir="/tmp/j")
    chosen = render_job(plan, "mpirun", job_dir="/tmp/j", forward_signals=("SIGHUP", "SIGUSR2"))
    assert {c.env["POPRUN_CHECKPOINT_SIGNAL"] for c in default.instances} == {"SIGUSR1"}
    assert {c.env["POPRUN_CHECKPOINT_SIGNAL"] for c in chosen.instances} == {"SIGHUP"}
    assert "trap : USR1 USR2\n" in default.files["rank"]
    assert "trap : USR1 USR2 HUP\n" in chosen.files["rank"]
    for backend in ("mpiexec", "slurm"):
        job = render_job(plan, backend, job_dir="/tmp/j", forward_signals=("SIGHUP",))
        text = "\n".join([" ".join(job.launcher or ()), *job.files.values()])
        assert "trap : USR1 USR2 HUP" in text, (backend, text)


def test_dist_reads_the_checkpoint_signal_and_installs_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POPRUN_CHECKPOINT_SIGNAL", raising=False)
    assert dist.checkpoint_signal() is None and dist.on_checkpoint(print) is None
    assert dist.CHECKPOINT_SIGNAL in dist.NAMES
    monkeypatch.setenv("POPRUN_CHECKPOINT_SIGNAL", "SIGNOPE")
    assert dist.checkpoint_signal() is None

    def child() -> list[int]:
        os.environ["POPRUN_CHECKPOINT_SIGNAL"] = "SIGHUP"
        got: list[int] = []
        assert dist.on_checkpoint(lambda signum, frame: got.append(signum)) == signal.SIGHUP
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        return got

    assert in_child(child) == [signal.SIGHUP]


def test_on_checkpoint_for_sigusr1_keeps_the_stack_dump(tmp_path: Path) -> None:
    code = (
        "import os, signal, time\n"
        "import poprun_py.dist as dist\n"
        "got = []\n"
        "dist.on_checkpoint(lambda s, f: got.append(s))\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "deadline = time.monotonic() + 5\n"
        "while not got and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('got', got)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "POPRUN_RESTART_COUNT": "0",
        "POPRUN_CHECKPOINT_SIGNAL": "SIGUSR1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert proc.stdout.strip() == f"got [{int(signal.SIGUSR1)}]", proc.stderr
    assert "most recent call first" in proc.stderr  # faulthandler dumped, then chained


def found(*names: str) -> object:
    return frozenset(names).__contains__


def test_a_forwarded_usr1_with_lightning_importable_is_one_line() -> None:
    lines = takeover_warnings(("python", "train.py"), FORWARD_SIGNALS, found("lightning"))
    assert lines == [
        "forwarded SIGUSR1 may be taken over by PyTorch Lightning (its SLURM requeue): "
        "choose another with --forward-signals USR2"
    ]


def test_a_library_named_in_the_argv_counts_too() -> None:
    argv = ("python", "-m", "submitit.local", "train.py")
    lines = takeover_warnings(argv, (signal.SIGUSR2,), found())
    assert lines == [
        "forwarded SIGUSR2 may be taken over by submitit (its timeout handler, 1.2-1.4): "
        "choose another with --forward-signals HUP"
    ]
    hup = takeover_warnings(("pytorch-lightning-run",), (signal.SIGHUP,), found("submitit"))
    assert len(hup) == 1 and "SIGHUP may be taken over by submitit" in hup[0]


def test_nothing_said_without_a_library_or_for_a_signal_not_forwarded() -> None:
    assert takeover_warnings(("python", "train.py"), FORWARD_SIGNALS, found()) == []
    assert takeover_warnings(("python", "t.py"), (signal.SIGUSR2,), found("lightning")) == []


def test_the_warning_goes_through_the_poprun_py_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="poprun_py"):
        warn_takeovers(("python", "-m", "lightning", "fit"), (signal.SIGUSR1,))
    assert [r.name for r in caplog.records] == ["poprun_py"]
    assert "SIGUSR1 may be taken over by PyTorch Lightning" in caplog.records[0].getMessage()
