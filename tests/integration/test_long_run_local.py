"""Long runs on this machine (local backend, real processes): a crashed example restarted from
its checkpoint ends with an uninterrupted run's weights; SIGUSR1 reaches every instance; a hang
is caught with every stack; nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_long_run_hosts import HANG, WAIT_USR1, started

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


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


def test_usr1_reaches_every_local_instance(tmp_path: Path) -> None:
    program = tmp_path / "wait_usr1.py"
    program.write_text(WAIT_USR1)
    run = started(
        ["launch", "--hosts", "localhost", "-n", "3", "-r", "3", "--", PY, str(program)],
        tmp_path,
        env=ENV,
    )
    run.wait_for(r"\] ready$", 3)
    run.proc.send_signal(signal.SIGUSR1)
    code, out, err = run.finish()
    assert code == 0, err
    assert sorted(re.findall(r"got usr1 (\d)", out)) == ["0", "1", "2"]


def test_a_local_hang_is_caught_with_stacks_and_a_timeout_is_124(tmp_path: Path) -> None:
    program = tmp_path / "hang.py"
    program.write_text(HANG)
    logs = tmp_path / "logs"
    run = started(
        [
            "launch",
            "--hosts",
            "localhost",
            "-n",
            "3",
            "-r",
            "3",
            "--hang-timeout",
            "2",
            "--grace-period",
            "1",
            "-o",
            str(logs),
            "--",
            PY,
            str(program),
        ],
        tmp_path,
        env=ENV,
    )
    since = run.wait_for(r":2\] start$", 1)
    code, _, err = run.finish()
    assert code == 124 and time.monotonic() - since <= 2 + 1 + 2
    assert "instance 2 on localhost hung (no progress for 2 s)" in err
    assert all(
        "most recent call first" in (logs / f"instance-{i}.log").read_text() for i in range(3)
    )
    timed = poprun(
        "launch", "--hosts", "localhost", "--timeout", "1s", "--", "sleep", "30", cwd=tmp_path
    )
    assert timed.returncode == 124 and "timed out after 1 s" in timed.stderr
