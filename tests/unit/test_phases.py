"""The launch's live status (issue 22, item 1): the phase model (hosts done out of the total,
the slowest host named after a few seconds), the tracker the SSH pool tells, and its two views:
a live line on a terminal, plain lines without control characters otherwise."""

from __future__ import annotations

import io
import logging
import re
import threading
import time
from typing import Any

import pytest

from poprun_py.cli import status
from poprun_py.cli.status import LiveView, PlainView, showing
from poprun_py.process import phases
from poprun_py.process.phases import SLOW_AFTER, Phase

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n


def test_a_phase_counts_hosts_done_step_by_step() -> None:
    p = Phase.of(("connecting", "preflight"), [f"n{i:02d}" for i in range(1, 17)], 0.0)
    for i in range(1, 15):
        p = p.reached(f"n{i:02d}", 1)
    assert p.text(now=1.0) == "connecting 14/16 hosts"
    assert p.text(now=4.9) == "connecting 14/16 hosts … waiting for n15 and 1 more (4 s)"
    p = p.reached("n15", 1).reached("n16", 1).reached("n03", 2)
    assert p.text(now=2.0) == "preflight 1/16 hosts"


def test_the_slowest_host_is_named_only_after_a_few_seconds() -> None:
    p = Phase.of(("sync",), ["a", "b"], 10.0).reached("a", 1)
    assert "waiting" not in p.text(now=10.0 + SLOW_AFTER - 0.01)
    assert p.text(now=10.0 + SLOW_AFTER) == f"sync 1/2 hosts … waiting for b ({int(SLOW_AFTER)} s)"


def test_a_host_of_another_phase_or_a_step_done_again_changes_nothing() -> None:
    p = Phase.of(("sync",), ["a"], 0.0)
    assert p.reached("spare", 1) is p
    done = p.reached("a", 1)
    assert done.reached("a", 1) is done and done.reached("a", 5).progress == {"a": 1}


def test_the_summaries_say_how_a_phase_ended() -> None:
    p = Phase.of(("staging",), ["a", "b", "c"], 0.0).reached("a", 1)
    assert p.summary(2.04, ok=True) == "staging: 3/3 hosts done in 2.0 s"
    assert (
        p.summary(2.0, ok=False) == "staging: 1/3 hosts done after 2.0 s; waiting for b and 1 more"
    )
    wait = Phase.waiting("restart 1 of 3", 5.0, 0.0)
    assert [wait.text(t) for t in (0.0, 0.2, 4.1, 6.0)] == [
        "restart 1 of 3 in 5 s", "restart 1 of 3 in 5 s", "restart 1 of 3 in 1 s",
        "restart 1 of 3 in 0 s",
    ]  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def begin(self, tracker: phases.Tracker) -> None:
        shown = tracker.snapshot()
        assert shown is not None
        self.events.append(("begin", shown.label))

    def end(self, phase: Phase, ok: bool, now: float) -> None:
        self.events.append(("end", f"{phase.label} {ok} {sorted(phase.progress.items())}"))


def test_without_a_tracker_the_phases_do_nothing() -> None:
    with phases.phase("sync", ["a"]):
        phases.done("a")
    with phases.countdown("restart 1 of 1", 1.0):
        pass


def test_the_tracker_takes_steps_from_any_thread_and_ends_a_phase_that_raised() -> None:
    view = Recorder()
    with phases.tracking(view):
        with phases.phase(("connecting", "preflight"), ["a", "b"]):
            worker = threading.Thread(target=phases.done, args=("a",))
            worker.start()
            worker.join()
            phases.done("b", phases.CONNECTING)
            phases.done("b", "no such step")
            phases.done("elsewhere")
        with pytest.raises(KeyError), phases.phase("sync", ["a"]):
            raise KeyError("x")
    phases.done("a")  # after the block: told to nobody
    assert view.events == [
        ("begin", "connecting, preflight"),
        ("end", "connecting, preflight True [('a', 2), ('b', 1)]"),
        ("begin", "sync"),
        ("end", "sync False [('a', 0)]"),
    ]


def test_phases_begun_on_another_thread_or_inside_a_phase_are_not_shown() -> None:
    view = Recorder()
    with phases.tracking(view):
        spares = threading.Thread(target=lambda: phases.phase("spares", ["s"]).__enter__())
        spares.start()
        spares.join()
        with phases.phase("outer", ["a"]), phases.phase("inner", ["a"]):
            pass
    assert view.events == [("begin", "outer"), ("end", "outer True [('a', 0)]")]


def test_plain_lines_only_for_a_phase_that_lasts_and_without_control_characters() -> None:
    out = io.StringIO()
    with phases.tracking(PlainView(out, after=0.2)):
        with phases.phase("sync", ["a", "b"]):
            phases.done("a")  # quick: nothing printed
        with phases.phase("staging", ["a", "b"]):
            phases.done("a")
            deadline = time.monotonic() + 10  # a phase longer than the view's threshold
            while "waiting for b" not in out.getvalue():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            phases.done("b")
        with phases.countdown("restart 1 of 2", 0.3):  # told on the restart's own line
            time.sleep(0.35)
    lines = out.getvalue().splitlines()
    assert [re.sub(r"\d+\.\d s", "T", x) for x in lines] == [
        "poprun-py: staging: 1/2 hosts done after T; waiting for b",
        "poprun-py: staging: 2/2 hosts done in T",
    ]
    assert not CONTROL.search(out.getvalue())


class Terminal(io.StringIO):
    """A terminal's stream: says it is one, and keeps what was written."""

    encoding = "utf-8"

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_drawn_in_place_and_erased_at_the_end() -> None:
    term = Terminal()
    view = LiveView(term, after=0.0, every=0.02)
    with phases.tracking(view), phases.phase("sync", ["a", "b"]):
        phases.done("a")
        deadline = time.monotonic() + 10
        while "sync 1/2 hosts" not in term.getvalue():
            assert time.monotonic() < deadline, term.getvalue()
            time.sleep(0.01)
    text = term.getvalue()
    assert text.startswith(status.CLEAR) and text.endswith(status.CLEAR)
    assert not view.drawn


def test_a_log_line_meanwhile_erases_the_live_line_first_and_is_printed_whole() -> None:
    term = Terminal()
    handler = logging.StreamHandler(term)
    logger = logging.getLogger("poprun_py.test_phases")
    logger.addHandler(handler)
    try:
        view = LiveView(term, after=0.0, every=0.02)
        with phases.tracking(view), phases.phase("sync", ["a"]):
            deadline = time.monotonic() + 10
            while not view.drawn:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            logger.warning("a warning")
        assert handler.stream is term  # given back
    finally:
        logger.removeHandler(handler)
    assert f"{status.CLEAR}a warning\n" in term.getvalue()


def test_the_live_line_fits_the_width_and_falls_back_to_ascii() -> None:
    ascii_term = Terminal()
    ascii_term.encoding = "ascii"
    view = LiveView(ascii_term)
    line = view.line("sync 1/2 hosts … waiting for b (4 s)", 1)
    assert line == "/ sync 1/2 hosts ... waiting for b (4 s)"
    assert len(view.line("x" * 500, 0)) == 79  # not a terminal's fd: 80 columns


def test_showing_chooses_the_view_once_by_the_stream() -> None:
    for stream, kind in ((io.StringIO(), PlainView), (Terminal(), LiveView)):
        with showing(stream), phases.phase("sync", ["a"]):
            tracker = phases._current()
            assert tracker is not None and isinstance(tracker.view, kind)


def test_a_wait_on_no_host_in_particular_shows_its_time_after_a_few_seconds() -> None:
    p = Phase.of(("allocation",), (), 0.0)
    later = SLOW_AFTER + 4.2
    assert [p.text(t) for t in (0.5, later)] == ["allocation", f"allocation ({int(later)} s)"]
    assert p.lasting(5.0) == "allocation: under way for 5.0 s"
    assert p.summary(9.0, ok=True) == "allocation: done in 9.0 s"
    assert p.summary(9.0, ok=False) == "allocation: stopped after 9.0 s"


def test_the_ssh_pool_tells_each_hosts_steps_whether_its_work_succeeded_or_failed() -> None:
    from poprun_py.core.spec import HostSpec
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import SshSettings

    class Conn:
        def __init__(self, name: str):
            self.name = name

        def close(self) -> None:
            pass

    def work(conn: Any) -> str:  # a fake connection
        if conn.name == "bad":
            raise ValueError("bad")
        return str(conn.name)

    pool = ConnectionPool([HostSpec(n) for n in ("ok", "bad", "other")], SshSettings())
    pool.connections.update({n: Conn(n) for n in ("ok", "bad", "other")})  # type: ignore[misc]
    view = Recorder()
    with pool, phases.tracking(view):
        with phases.phase((phases.CONNECTING, "preflight"), ["ok", "bad", "late"]):
            pool.each(work, ["ok", "bad"])
        with phases.phase("sync", ["ok"]):
            pool.each(work, ["other"])  # a host of no phase: nothing
    assert view.events == [
        ("begin", "connecting, preflight"),
        ("end", "connecting, preflight True [('bad', 2), ('late', 0), ('ok', 2)]"),
        ("begin", "sync"),
        ("end", "sync True [('ok', 0)]"),
    ]
