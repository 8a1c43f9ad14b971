"""The one look as a person sees it on a terminal (issue 22, items 2 and 6): under tmux at 80
columns, ``plan`` prints the topology one host a line and no line wraps; a failed launch shows
``ROOT CAUSE`` and ``error:`` in red, and nothing in colour with ``NO_COLOR`` set."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tmux import Tmux

ROOT = Path(__file__).resolve().parents[2]
RED = "\x1b[31m"  # as tmux gives it back: bold and red as two escapes
FAIL_SECOND = 'if [ "$POPDIST_INSTANCE_INDEX" = 1 ]; then echo boom >&2; exit 3; fi; exec sleep 30'


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    window = Tmux(tmp_path)
    try:
        yield window
    finally:
        window.close()


def poprun(*args: str) -> str:
    return shlex.join([sys.executable, "-m", "poprun_py", *args])


@pytest.mark.requires("tmux")
def test_under_tmux_plan_folds_the_topology_per_host_within_80_columns(tmux: Tmux) -> None:
    spec = str(ROOT / "clusters" / "pod16.yaml")
    tmux.type(f"clear; {poprun('plan', '-c', spec, 'python3', 't')}; echo plan-ended-$?")
    screen = tmux.wait_for(r"plan-ended-\d+")
    assert "plan-ended-0" in screen, screen
    lines = screen.splitlines()
    assert max(map(len, lines)) <= 80, screen  # -J: a wrapped line would come back whole
    hosts = [line for line in lines if re.match(r"node\d\d: instances ", line)]
    assert len(hosts) == 16, screen
    assert hosts[0] == "node01: instances 0  | NUMA 0-7 | CPUs 0-127 | devices 0-15 | replicas 0-3"
    assert len({line.index("|") for line in hosts}) == 1  # the fields line up


@pytest.mark.requires("tmux")
def test_under_tmux_the_root_cause_and_error_are_red_unless_no_color(tmux: Tmux) -> None:
    argv = ["launch", "-H", "localhost", "-b", "local", "-r", "2", "-n", "2", "--"]
    command = poprun(*argv, "sh", "-c", FAIL_SECOND)
    tmux.type(f"clear; {command}; echo first-ended-$?")
    tmux.wait_for(r"first-ended-\d+")
    screen = tmux.screen(escapes=True)
    assert "first-ended-3" in screen, screen
    assert re.search(r"\x1b\[31m(\x1b\[[\d;]*m)*ROOT CAUSE", screen), screen
    assert re.search(r"\x1b\[31m(\x1b\[[\d;]*m)*error:", screen), screen
    row = next(line for line in tmux.screen().splitlines() if "ROOT CAUSE" in line)
    assert row.split() == ["1", "localhost", "ROOT", "CAUSE", "3", "boom"]
    tmux.type(f"clear; NO_COLOR=1 {command}; echo second-ended-$?")
    tmux.wait_for(r"second-ended-\d+")
    screen = tmux.screen(escapes=True)
    assert "ROOT CAUSE" in screen and RED not in screen, screen
