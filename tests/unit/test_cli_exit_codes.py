"""Exit codes 143 and 137 are explained where a failure is told (issue 22, smaller things)."""

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
