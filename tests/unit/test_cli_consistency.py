"""Options agree between commands (issue 22, item 4): one meaning per short flag, one duration
type, each default shown once, and an ``Examples:`` section in every command's help."""

import re
from collections import defaultdict
from typing import Any

import pytest

from poprun_py.cli import COMMANDS, run
from poprun_py.cli.durations import Duration
from poprun_py.cli.reference import _commands

DURATION_NAMES = re.compile(r"timeout|delay|grace_period|older_than")
"""Parameter names that hold a duration (``--time`` is Slurm's own syntax, passed to Slurm)."""


def options() -> list[tuple[str, Any]]:
    return [
        (name, p)
        for name, command in _commands().items()
        for p in command.params
        if p.param_type_name == "option"
    ]


def test_a_short_flag_means_one_option_in_every_command() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for _, param in options():
        long = max([*param.opts, *param.secondary_opts], key=len)
        for short in (n for n in [*param.opts, *param.secondary_opts] if len(n) == 2):
            meanings[short].add(long)
    twice = {short: sorted(longs) for short, longs in meanings.items() if len(longs) > 1}
    assert twice == {}
    assert meanings["-f"] == {"--format"} and meanings["-b"] == {"--backend"}


def test_every_format_option_has_its_short_flag() -> None:
    formats = [(name, p.opts) for name, p in options() if "--format" in p.opts]
    assert {name for name, _ in formats} >= {"plan", "render", "launch", "check", "jobs", "status"}
    assert all("-f" in opts for _, opts in formats), formats


def test_every_duration_takes_the_one_duration_type() -> None:
    durations = [(name, p) for name, p in options() if DURATION_NAMES.search(p.name)]
    assert len(durations) > 20
    wrong = [(name, p.name) for name, p in durations if not isinstance(p.type, Duration)]
    assert wrong == []


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "-H", "localhost", "--hang-timeout", "{}", "t.py"],
        ["plan", "-H", "localhost", "--restart-delay", "{}", "t.py"],
        ["plan", "-H", "localhost", "--check-timeout", "{}", "t.py"],
        ["exec", "-H", "localhost", "-t", "{}", "--", "true"],
        ["sync", "-H", "localhost", "--timeout", "{}"],
        ["up", "--wait-timeout", "{}", "no-such.yaml"],
        ["jobs", "--prune", "--older-than", "{}"],
    ],
)
def test_a_bad_duration_is_one_line_naming_the_flag(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    flag = next(a for a in argv if a.startswith("-") and a not in ("-H", "--prune"))
    assert run([a.format("5 min") for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    flag = "--timeout" if flag == "-t" else flag
    assert err == [f"poprun-py: error: {flag}: '5 min' is not a duration (e.g. 90s, 45m, 2h)"]


def test_minutes_are_taken_where_seconds_were(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "-H", "localhost", "--hang-timeout", "5m", "--restart-delay", "1m"]
    assert run([*argv, "--grace-period", "2s", "--check-timeout", "1m", "t.py"]) == 0
    assert "poprun-py topology" in capsys.readouterr().out


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert run([command, "--help"] if command else ["--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_the_help_shows_no_default_twice_and_ends_with_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_of(command, capsys)
    assert "[default:" not in text
    examples = text[text.index("Examples:") :].splitlines()[1:]
    lines = [line.strip() for line in examples if line.strip()]
    assert 2 <= len(lines) <= 4 and all(line.startswith("poprun-py ") for line in lines)
    assert all(len(line) <= 80 for line in text.splitlines())


def test_an_option_with_a_default_says_it_once_in_its_help() -> None:
    missing, twice = [], []
    for name, p in options():
        count = (p.help or "").lower().count("default")
        if p.default not in (None, False, (), []) and count == 0:
            missing.append((name, p.name))
        if count > 1:
            twice.append((name, p.name))
    assert missing == [] and twice == []
    assert all(p.show_default is False for _, p in options() if p.default not in (None, False))
