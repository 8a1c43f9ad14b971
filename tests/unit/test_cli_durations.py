"""Every duration of every command, and of a cluster spec's defaults, takes one syntax (90s,
45m, 2h, or seconds), and a bad one is one line naming the flag or key (issue 22, item 4)."""

from pathlib import Path

import pytest

from poprun_py.cli import run
from poprun_py.cli.durations import DURATION, DURATION_TEXT, SLURM_TIME
from poprun_py.core.duration import duration_seconds
from poprun_py.errors import SpecError, UsageError
from poprun_py.prepare.specfile import load_cluster


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


SPEC_DURATIONS = ("grace_period", "connect_timeout", "restart_delay", "timeout", "hang_timeout")


@pytest.mark.parametrize("key", [*SPEC_DURATIONS, "host_timeout"])
def test_a_spec_duration_takes_the_same_syntax(key: str, tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    for given, seconds in (("90s", 90.0), ("2h", 7200.0), ("30", 30.0), ("1.5", 1.5)):
        spec.write_text(f"name: c\nhosts:\n  - name: localhost\ndefaults:\n  {key}: {given}\n")
        assert getattr(load_cluster(spec).defaults, key) == seconds, given


@pytest.mark.parametrize(
    ("key", "given", "fault"),
    [
        ("hang_timeout", "5x", "'5x' is not a duration (e.g. 90s, 45m, 2h)"),
        ("hang_timeout", "0", "0.0 must be more than 0"),
        ("grace_period", "-1s", "'-1s' must be 0 or more"),
        ("timeout", "soon", "'soon' is not a duration (e.g. 90s, 45m, 2h)"),
    ],
)
def test_a_bad_spec_duration_is_one_line_naming_the_key(
    key: str, given: str, fault: str, tmp_path: Path
) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(f"name: c\nhosts:\n  - name: localhost\ndefaults:\n  {key}: {given}\n")
    with pytest.raises(SpecError) as caught:
        load_cluster(spec)
    assert str(caught.value) == f"{spec}:5: defaults.{key}: {fault}"


def test_zero_is_a_duration_only_where_it_means_something(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nhosts:\n  - name: localhost\ndefaults:\n  restart_delay: 0s\n")
    assert load_cluster(spec).defaults.restart_delay == 0.0
