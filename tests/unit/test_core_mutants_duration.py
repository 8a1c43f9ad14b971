"""Durations: the default flag name in faults, a unitless part after another, and the lower
bound (anything above 0 seconds).

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2).
"""

import pytest

from poprun_py.core.duration import parse_duration
from poprun_py.errors import UsageError


def refusal(*args: str) -> str:
    with pytest.raises(UsageError) as caught:
        parse_duration(*args)
    return str(caught.value)


def test_a_fault_names_the_flag_or_says_duration() -> None:
    assert refusal("soon") == "duration: 'soon' is not a duration (e.g. 90s, 45m, 2h)"
    assert refusal("0s", "--timeout") == "--timeout: '0s' must be more than 0"


def test_a_number_without_unit_is_seconds_only_alone() -> None:
    assert parse_duration("30") == 30.0
    assert refusal("1h30") == "duration: '1h30' is not a duration (e.g. 90s, 45m, 2h)"
    assert refusal("1h30m5") == "duration: '1h30m5' is not a duration (e.g. 90s, 45m, 2h)"


def test_a_second_or_less_is_a_duration() -> None:
    assert parse_duration("1") == 1.0
    assert parse_duration("0.5s") == 0.5
