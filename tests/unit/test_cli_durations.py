"""Every duration of every command takes one syntax (90s, 45m, 2h, or seconds), and a bad one
is one line naming the flag (issue 22, item 4)."""

import pytest

from poprun_py.cli import run
from poprun_py.cli.durations import DURATION, DURATION_TEXT, SLURM_TIME
from poprun_py.core.duration import duration_seconds
from poprun_py.errors import UsageError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("45m", 2700.0), ("2h", 7200.0), ("1h30m", 5400.0), ("2.5", 2.5), ("0", 0.0)],
)
def test_the_type_gives_seconds(text: str, seconds: float) -> None:
    assert DURATION.convert(text, None, None) == seconds


def test_the_text_type_keeps_what_was_written() -> None:
    assert DURATION_TEXT.convert("1h30m", None, None) == "1h30m"
    assert DURATION_TEXT.convert(30.0, None, None) == "30.0"


def test_a_negative_number_is_left_to_the_options_own_range_check() -> None:
    assert duration_seconds("-1") == -1.0
    assert duration_seconds("-2m") == -120.0


@pytest.mark.parametrize("text", ["soon", "5 mins", "1h30", "", "-", "5x"])
def test_a_bad_duration_names_the_flag(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--flag: .* is not a duration \(e\.g\. 90s, 45m, 2h\)$"):
        duration_seconds(text, "--flag")


@pytest.mark.parametrize(
    ("given", "slurm"),
    [
        *[("2h", "2:00:00"), ("1h30m", "1:30:00"), ("36h", "1-12:00:00"), ("90s", "0:01:30")],
        *[("30", "30"), ("1:00:00", "1:00:00"), ("1-12", "1-12")],
    ],
)
def test_slurm_time_takes_its_own_forms_and_durations(given: str, slurm: str) -> None:
    assert SLURM_TIME.convert(given, None, None) == slurm


def test_render_passes_a_duration_to_slurm_in_its_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["render", "--backend", "slurm", "-H", "n[1-2]", "--time", "2h", "t.py"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --time=2:00:00" in script and "--time=2:00:00 --" in script
