"""Exit codes 143 and 137 are explained where a failure is told (issue 22, smaller things)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from poprun_py.core.exit_codes import exit_phrase, explain, killed_by
from poprun_py.core.result import InstanceResult, LaunchResult
from poprun_py.launch.restarts import why_failed


def test_a_signal_code_names_its_signal() -> None:
    assert explain(143) == "killed by SIGTERM (143)"
    assert explain(137) == "killed by SIGKILL (137)"
    assert explain(None, signal=15) == "killed by SIGTERM (143)"
    assert [explain(c) for c in (0, 1, 124, 128, 255)] == ["", "", "", "", ""]
    assert killed_by(130) == "SIGINT" and killed_by(159) == "SIGSYS" and killed_by(160) is None


def test_the_failure_line_says_which_signal() -> None:
    def line(**outcome: int) -> str:
        return why_failed(LaunchResult((InstanceResult(1, "h2", **outcome),)))

    assert line(exit_code=143) == "instance 1 on h2 exited with code 143, killed by SIGTERM"
    assert line(exit_code=137) == "instance 1 on h2 exited with code 137, killed by SIGKILL"
    assert line(signal=9) == "instance 1 on h2 was killed by SIGKILL (137)"
    assert line(exit_code=7) == "instance 1 on h2 exited with code 7"


def test_a_number_that_is_no_signal_is_said_as_a_number() -> None:
    assert exit_phrase(None, signal=99) == "was killed by signal 99"
    assert exit_phrase(250) == "exited with code 250"


def stopped_launch(tmp_path: Path, sig: int, *more: str) -> tuple[int, str, str]:
    """A local launch of two instances, sent ``sig`` once both run; its code, stdout, stderr."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = f'touch {marks}/"$RANK"; exec sleep 60'
    argv = [sys.executable, "-m", "poprun_py", "launch", "-H", "localhost", "-n", "2", "-r", "2"]
    proc = subprocess.Popen(
        [*argv, *more, "--", "sh", "-c", script],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def test_sigterm_to_poprun_py_is_named_not_merely_interrupted(tmp_path: Path) -> None:
    code, out, err = stopped_launch(tmp_path, signal.SIGTERM, "--format", "json")
    assert code == 130, err
    assert "poprun-py: error: interrupted by SIGTERM: every instance was stopped" in err
    summary = json.loads(out.splitlines()[-1])
    assert summary["interrupted"] is True
    assert summary["error"] == "interrupted by SIGTERM: every instance was stopped"


def test_ctrl_c_is_still_interrupted(tmp_path: Path) -> None:
    code, _, err = stopped_launch(tmp_path, signal.SIGINT)
    assert code == 130, err
    assert "poprun-py: error: interrupted: every instance was stopped" in err
