"""Long runs on this machine (local backend, real processes): a crashed example restarted from
its checkpoint ends with an uninterrupted run's weights; SIGUSR1 reaches every instance; a hang
is caught with every stack; nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from poprun_py.backends.external import LauncherRun
from poprun_py.core.result import RunOptions
from poprun_py.process.output import LAUNCHER_INDEX, Output
from poprun_py.process.signals import Control, DumpRequest
from poprun_py.process.supervise import Child, Supervision
from tests.integration.helpers import PYSPY_THREAD
from tests.integration.test_long_run_hosts import (
    HANG,
    HANG_IN_A_FUNCTION,
    WAIT_SIGNALS,
    started,
    stopped_at_the_end,
)

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
WITH_PYSPY = ENV  # py-spy on PATH (the tests that use it require it)
WITHOUT_PYSPY = {
    **ENV,
    "PATH": os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()
    ),
}


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "poprun_py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=ENV,
    )


def weights(out: str) -> set[str]:
    return set(re.findall(r"final loss .* weights (\w+)", out))


def test_a_crashed_example_resumes_from_its_checkpoint_with_the_same_final_weights(
    tmp_path: Path,
) -> None:
    data, ck = tmp_path / "data", tmp_path / "ck"
    subprocess.run(
        [PY, str(ROOT / "examples/make_data.py"), "--out", str(data)],
        check=True,
        capture_output=True,
    )
    base = [
        "launch",
        "--hosts",
        "localhost",
        "-n",
        "4",
        "-r",
        "4",
        "--input",
        f"{data}/*.npz",
        "--",
        PY,
        str(ROOT / "examples/train.py"),
        "--steps",
        "20",
    ]
    plain = poprun(*base, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    more = [
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "3",
        "--crash-instance",
        "2",
        "--crash-step",
        "8",
    ]
    args = [*base[:1], "--max-restarts", "1", *base[1:], *more]
    restarted = poprun(*args, cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    assert "attempt 0: instance 2 on localhost exited with code 3" in restarted.stderr
    assert len(re.findall(r"resumed from step [36] \(restart 1\)", restarted.stdout)) == 4
    assert weights(restarted.stdout) == weights(plain.stdout) and len(weights(plain.stdout)) == 1


def test_restarts_running_out_give_the_instances_code(tmp_path: Path) -> None:
    proc = poprun(
        "launch",
        "--hosts",
        "localhost",
        "--max-restarts",
        "2",
        "--",
        "sh",
        "-c",
        'echo "try $POPRUN_RESTART_COUNT"; exit 6',
        cwd=tmp_path,
    )
    assert proc.returncode == 6
    assert [f"[localhost:0] try {k}" in proc.stdout for k in range(3)] == [True] * 3
    assert proc.stderr.count("; restarted") == 2


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        pytest.param("mpirun", marks=pytest.mark.requires("mpirun")),
        pytest.param("mpiexec", marks=pytest.mark.requires("mpiexec.hydra")),
    ],
)
def test_usr1_and_usr2_reach_every_local_instance(tmp_path: Path, backend: str) -> None:
    program = tmp_path / "wait_signals.py"
    program.write_text(WAIT_SIGNALS)
    args = ["launch", "--hosts", "localhost", "-n", "3", "-r", "3", "--backend", backend]
    with stopped_at_the_end(started([*args, "--", PY, str(program)], tmp_path, env=ENV)) as run:
        run.wait_for(r"\] ready$", 3)
        run.proc.send_signal(signal.SIGUSR1)
        run.proc.send_signal(signal.SIGUSR2)
        code, out, err = run.finish()
    assert code == 0, err
    assert sorted(re.findall(r"got usr1 usr2 (\d)", out)) == ["0", "1", "2"]


def hang_locally(
    tmp_path: Path, program: str, env: dict[str, str], backend: str = "local"
) -> tuple[int, str, Path]:
    """A 3-instance job on this machine whose instance 2 hangs (--hang-timeout 2, grace 1): its
    exit code, stderr and log directory, after checking it ended within S + grace + 15 s and
    that nothing it started (py-spy included) is left running."""
    (tmp_path / "hang.py").write_text(program)
    logs = tmp_path / "logs"
    argv = ["launch", "--hosts", "localhost", "-b", backend, "-n", "3", "-r", "3"]
    argv += ["--hang-timeout", "2"]
    argv += ["--grace-period", "1", "-o", str(logs), "--", PY, str(tmp_path / "hang.py")]
    with stopped_at_the_end(started(argv, tmp_path, env=env)) as run:
        since = run.wait_for(r":2\] start$", 1)
        code, _, err = run.finish()
    # caught at the hang timeout (2 s) and stopped within the grace period (1 s), not at the
    # program's 300 s: 15 s of slack for a loaded 2-core machine (py-spy dumping 3 instances)
    assert time.monotonic() - since <= 2 + 1 + 15
    assert "instance 2 on localhost hung (no progress for 2 s)" in err
    assert strays(str(tmp_path / "hang.py")) == [] and strays("py-spy dump") == []
    return code, err, logs


def strays(mark: str) -> list[str]:
    """Command lines of live processes that contain ``mark`` (this test's only)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if mark in cmdline and int(pid) != os.getpid():
            found.append(cmdline)
    return found


@pytest.mark.parametrize(
    "backend",
    [
        "local",
        pytest.param("mpirun", marks=[pytest.mark.mpi, pytest.mark.requires("mpirun")]),
        pytest.param("mpiexec", marks=[pytest.mark.mpi, pytest.mark.requires("mpiexec.hydra")]),
    ],
)
@pytest.mark.requires("py-spy", "ptrace")  # poprun-py's py-spy reads what it did not start
def test_a_local_hang_is_dumped_by_py_spy_into_the_hung_instances_log_and_stderr(
    tmp_path: Path, backend: str
) -> None:
    """Local supervision dumps its instances; a local mpirun/mpiexec, its ranks found by their
    rank variables in the launcher's process tree."""
    code, err, logs = hang_locally(tmp_path, HANG_IN_A_FUNCTION, WITH_PYSPY, backend)
    assert code == 124
    hung = (logs / "instance-2.log").read_text()
    assert re.search(r"^Process \d+: .*hang\.py$", hung, re.M), hung  # py-spy's header
    assert re.search(PYSPY_THREAD, hung, re.M), hung
    assert re.search(r"^ +wait_for_the_loader \(hang\.py:6\)$", hung, re.M), hung
    assert re.search(r":2\] +wait_for_the_loader \(", err), err  # on the terminal, tagged
    for i in range(3):
        log = (logs / f"instance-{i}.log").read_text()
        assert "Thread " in log and "most recent call first" not in log, (i, log)  # no SIGUSR1


def test_without_py_spy_a_local_hang_falls_back_to_faulthandler(tmp_path: Path) -> None:
    code, _, logs = hang_locally(tmp_path, HANG, WITHOUT_PYSPY)
    assert code == 124
    assert all(
        "most recent call first" in (logs / f"instance-{i}.log").read_text() for i in range(3)
    )
    assert (
        'File "' + str(tmp_path / "hang.py") + '", line 6' in (logs / "instance-2.log").read_text()
    )


def test_a_timeout_is_124(tmp_path: Path) -> None:
    timed = poprun(
        "launch", "--hosts", "localhost", "--timeout", "1s", "--", "sleep", "30", cwd=tmp_path
    )
    assert timed.returncode == 124 and "timed out after 1 s" in timed.stderr


def started_launcher(output: Output, control: Control, child: Child) -> Supervision:
    run = Supervision(output, 1.0, None, None, control)
    run.start([child])
    return run


def test_under_a_launcher_a_dump_is_sigusr1_only_when_every_instance_registered_faulthandler(
    tmp_path: Path,
) -> None:
    """srun (a LauncherRun without a relay): the tasks run under Slurm's daemons, out of
    py-spy's reach from here; the launcher gets SIGUSR1 (it passes it on) only when no task
    would die of it."""
    lines: list[str] = []
    control = Control()
    output = Output(RunOptions(sink=lambda i, s, line: lines.append(line)), {})
    script = "trap 'echo usr1' USR1; echo ready; while :; do sleep 0.05; done"
    child = Child(LAUNCHER_INDEX, "localhost", ("sh", "-c", script), signal_group=False)
    run = LauncherRun(
        started_launcher(output, control, child), ExitStack(), lambda s: s.launch_result()
    )
    answers: list[bool] = []

    def ask() -> None:
        deadline = time.monotonic() + 30
        while "ready" not in lines and time.monotonic() < deadline:
            control.wait_dumped(0.01)
        for every in (False, True):
            control.dump(DumpRequest(frozenset({0}), every=every))
            answers.append(control.wait_dumped(10) and control.dump_signalled)
        while "usr1" not in lines and time.monotonic() < deadline:
            control.wait_dumped(0.01)
        control.stop("done")

    asker = threading.Thread(target=ask)
    asker.start()
    run.wait()
    asker.join()
    control.close()
    assert answers == [False, True] and lines.count("usr1") == 1
