"""The failure summary of an attached launch (issue 22): the one table style, the root cause
first, and the ``detail`` of a failed instance naming its last stderr line."""

from __future__ import annotations

import io

import pytest

from poprun_py.cli import run
from poprun_py.core.result import InstanceResult, LastWords, LaunchResult, RunOptions
from poprun_py.launch.summary import ROW_LIMIT, print_summary, summary_lines
from poprun_py.process.output import LAUNCHER_INDEX, Output

FAIL_SECOND = (
    'if [ "$POPDIST_INSTANCE_INDEX" = 1 ]; then echo starting >&2; echo boom >&2; exit 3; fi; '
    "exec sleep 30"
)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_failed_launch_shows_the_last_stderr_line_as_its_detail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["launch", "-H", "localhost", "-b", "local", "-r", "2", "-n", "2"]
    assert run([*argv, "--", "sh", "-c", FAIL_SECOND]) == 3
    err = capsys.readouterr().err
    table = err[err.index("instances\n") :].splitlines()
    assert table[1].split() == ["instance", "host", "state", "code", "detail"]
    assert table[2].split() == ["1", "localhost", "ROOT", "CAUSE", "3", "boom"]
    assert table[3].split()[:3] == ["0", "localhost", "stopped"]
    assert "[localhost:1] boom" in err  # the output itself is shown as before


def test_output_keeps_each_instances_last_stderr_line_on_every_route() -> None:
    words = LastWords()
    shown: list[tuple[int, str, str]] = []
    options = RunOptions(sink=lambda i, s, line: shown.append((i, s, line)), last_words=words)
    out = Output(options, {0: "h1", 12: "node-2"})
    out.emit_lines(0, "stderr", (b"one",))
    out.emit_lines(12, "stderr", (b"Traceback", b"boom", b"   "))
    out.emit_lines(0, "stdout", (b"not stderr",))
    out.emit_lines(LAUNCHER_INDEX, "stderr", (b"the launcher's own",))
    out.close()
    assert words.lines == {0: "one", 12: "boom"}
    assert len(shown) == 6  # everything is still shown


def test_root_cause_is_red_on_a_terminal_and_plain_when_piped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    result = LaunchResult((InstanceResult(0, "h1", exit_code=3, ended=1.0),))
    tty, pipe = Tty(), io.StringIO()
    print_summary(result, {0: "boom"}, tty)
    print_summary(result, {0: "boom"}, pipe)
    assert "\x1b[1;31mROOT CAUSE\x1b[0m" in tty.getvalue()
    assert "\x1b" not in pipe.getvalue()
    assert pipe.getvalue().splitlines()[2].split() == ["0", "h1", "ROOT", "CAUSE", "3", "boom"]


def test_a_detail_of_its_own_wins_and_past_the_limit_the_rest_are_counted() -> None:
    ok = [InstanceResult(k, "h1", exit_code=0, ended=1.0) for k in range(1, ROW_LIMIT + 5)]
    lost = InstanceResult(0, "h0", exit_code=None, state="lost", detail="no report", ended=0.5)
    lines = summary_lines(LaunchResult((lost, *ok)), {0: "last words", 1: "not failed"})
    assert lines[2].split() == ["0", "h0", "ROOT", "CAUSE", "no", "report"]
    assert lines[3].split() == ["1", "h1", "exited", "0"]
    assert lines[-1] == "… 5 more instances"
    assert len(lines) == 2 + ROW_LIMIT + 1
