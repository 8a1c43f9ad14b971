"""How a launch's phases (:mod:`poprun_py.process.phases`) are shown on stderr, chosen once
by :func:`showing`.

On a terminal (:class:`LiveView`): one line, redrawn in place a few times a second while a
phase lasts -- ``⠹ preflight 14/16 hosts … waiting for node07 (4 s)``, ``⠼ restart 1 of 3 in
4 s`` -- and erased when the phase ends; what poprun-py logs meanwhile (a warning, a restart
told) erases it first and is printed whole, the line coming back below it. A phase that ends
within a moment never draws anything.

Otherwise (a pipe, a file, a CI log: :class:`PlainView`): plain lines without control
characters, and only for a phase that lasts: one when it has lasted :data:`PLAIN_AFTER` seconds
(who it waits for) and one when it ends. The restart delay adds none (the restart is told on
its own line as it happens).

Example:

    >>> import io
    >>> from poprun_py.process import phases
    >>> out, now = io.StringIO(), iter([0.0, 5.0, 7.5]).__next__  # a phase of 7.5 s
    >>> with phases.tracking(PlainView(out, after=0.0), clock=now):
    ...     with phases.phase(("connecting", "preflight"), ["h1", "h2"]):
    ...         phases.done("h1", "connecting")
    ...         phases.done("h2")
    >>> print(out.getvalue(), end="")
    poprun-py: connecting, preflight: 0/2 hosts done after 5.0 s; waiting for h1 and 1 more
    poprun-py: connecting, preflight: 2/2 hosts done in 7.5 s
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import TextIO

from poprun_py.process.phases import Phase, Tracker, tracking

PLAIN_AFTER = 5.0
"""Seconds a phase lasts before a plain line tells it (shorter ones print nothing)."""

LIVE_AFTER = 0.3
"""Seconds a phase lasts before the live line is drawn (no flicker for quick ones)."""

REDRAW = 0.25
"""Seconds between two drawings of the live line."""

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
CLEAR = "\r\x1b[K"


@contextlib.contextmanager
def showing(stream: TextIO) -> Iterator[None]:
    """Show the phases begun in the block on ``stream``: live on a terminal, else plain."""
    with tracking(LiveView(stream) if is_terminal(stream) else PlainView(stream)):
        yield


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that redraws a line (not ``TERM=dumb``)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class PlainView:
    """Plain lines for a phase that lasts ``after`` seconds: then, and at its end."""

    def __init__(self, stream: TextIO, after: float = PLAIN_AFTER):
        self.stream, self.after = stream, after
        self._ended = threading.Event()
        self._told = False
        self._thread: threading.Thread | None = None

    def begin(self, tracker: Tracker) -> None:
        """Tell the phase once it has lasted ``after`` seconds (now, when that is 0)."""
        self._ended.clear()
        self._told = False
        if self.after <= 0:
            self._tell(tracker)
            return
        self._thread = threading.Thread(
            target=self._watch, args=(tracker,), daemon=True, name="poprun-status"
        )
        self._thread.start()

    def _watch(self, tracker: Tracker) -> None:
        if not self._ended.wait(self.after):
            self._tell(tracker)

    def _tell(self, tracker: Tracker) -> None:
        phase = tracker.snapshot()
        if phase is not None and phase.until is None:
            self._write(phase.lasting(tracker.clock()))
            self._told = True

    def end(self, phase: Phase, ok: bool, now: float) -> None:
        """The phase's outcome, when its start was told."""
        self._ended.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._told:
            self._write(phase.summary(now, ok))

    def _write(self, line: str) -> None:
        self.stream.write(f"poprun-py: {line.replace('…', '...')}\n")
        self.stream.flush()


class LiveView:
    """One line on a terminal, redrawn in place while a phase lasts, erased at its end."""

    def __init__(self, stream: TextIO, after: float = LIVE_AFTER, every: float = REDRAW):
        self.stream, self.after, self.every = stream, after, every
        self.lock = threading.Lock()
        self.drawn = False
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None
        self._moved: list[tuple[logging.StreamHandler[TextIO], TextIO]] = []
        self._unicode = _encodes(stream, SPINNER + "…")

    def begin(self, tracker: Tracker) -> None:
        """Draw the phase from ``after`` seconds on, every ``every`` seconds."""
        self._ended.clear()
        self._moved = _redirect(self.stream, _Erasing(self))
        self._thread = threading.Thread(
            target=self._draw_until_ended, args=(tracker,), daemon=True, name="poprun-status"
        )
        self._thread.start()

    def end(self, phase: Phase, ok: bool, now: float) -> None:
        """Erase the line; what poprun-py logs goes straight to the stream again."""
        self._ended.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved = []
        with self.lock:
            self.erase()

    def _draw_until_ended(self, tracker: Tracker) -> None:
        wait, turn = self.after, 0
        while not self._ended.wait(wait):
            phase = tracker.snapshot()
            if phase is None:
                return
            self.draw(self.line(phase.text(tracker.clock()), turn))
            wait, turn = self.every, turn + 1

    def line(self, text: str, turn: int) -> str:
        """``text`` behind a spinner, fitted to the terminal's width (a wrapped line could not
        be redrawn in place)."""
        spinner = SPINNER if self._unicode else "|/-\\"
        text = text if self._unicode else text.replace("…", "...")
        line = f"{spinner[turn % len(spinner)]} {text}"
        width = _width(self.stream) - 1
        return line if len(line) <= width else line[: max(0, width - 1)] + line[-1:]

    def draw(self, line: str) -> None:
        """Replace the line on the terminal with ``line``."""
        with self.lock:
            if self._ended.is_set():
                return
            self.stream.write(CLEAR + line)
            self.stream.flush()
            self.drawn = True

    def erase(self) -> None:
        """Erase the line, if drawn (the caller holds :attr:`lock`)."""
        if self.drawn:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.drawn = False


class _Erasing:
    """What poprun-py's log handlers write to while the live line is up: the line is erased
    first, then the text is written whole (the next drawing comes below it)."""

    def __init__(self, view: LiveView):
        self.view = view

    def write(self, text: str) -> int:
        with self.view.lock:
            self.view.erase()
            return self.view.stream.write(text)

    def flush(self) -> None:
        self.view.stream.flush()


def _redirect(stream: TextIO, into: _Erasing) -> list[tuple[logging.StreamHandler[TextIO], TextIO]]:
    """Point poprun-py's log handlers that write to ``stream`` at ``into``; what they were."""
    loggers = [logging.getLogger(), *_poprun_loggers()]
    moved = []
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                moved.append((handler, stream))
                handler.setStream(into)
    return moved


def _poprun_loggers() -> list[logging.Logger]:
    known = list(logging.Logger.manager.loggerDict.items())
    return [v for k, v in known if k.startswith("poprun_py") and isinstance(v, logging.Logger)]


def _width(stream: TextIO) -> int:
    """The terminal's columns (80 when they cannot be told)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _encodes(stream: TextIO, text: str) -> bool:
    """Whether ``stream``'s encoding can write ``text`` (not under ``LANG=C``'s ASCII)."""
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True
