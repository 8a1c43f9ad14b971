"""poprun_py.core.shellwords.split gives exactly shlex.split's words and errors."""

from __future__ import annotations

import random
import shlex

import pytest

from poprun_py.core.shellwords import split

ALPHABET = "ab \t\n\r'\"\\$`;#é\x0b\x0c"


def outcome(fn: object, text: str) -> tuple[object, str | None]:
    try:
        return fn(text), None  # type: ignore[operator]
    except ValueError as exc:
        return None, str(exc)


def test_matches_shlex_on_random_text() -> None:
    rng = random.Random(7)
    for _ in range(20000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 14)))
        assert outcome(split, text) == outcome(shlex.split, text), repr(text)


@pytest.mark.parametrize(
    "word", ["plain", "with space", "it's", '"dq"', "$(rm -rf x)", "`x`", "a\nb", "é", "", "\\"]
)
def test_round_trips_quoted_words(word: str) -> None:
    text = " ".join(shlex.quote(w) for w in ["cmd", word, word])
    assert split(text) == ["cmd", word, word]


@pytest.mark.parametrize("text", ["'open", '"open', "trailing\\"])
def test_bad_text_raises_shlex_error(text: str) -> None:
    with pytest.raises(ValueError) as err:
        split(text)
    assert str(err.value) == outcome(shlex.split, text)[1]
