"""The one duration type of every command's options: ``90s``, ``45m``, ``2h``, ``1h30m``, or
plain seconds, read by :func:`poprun_py.core.duration.duration_seconds`; a bad value is one
line naming the flag (exit 2). :data:`DURATION` gives the seconds (a float); :data:`DURATION_TEXT`
checks the text and keeps it, for options whose value is read again later (``--timeout`` of a
launch, kept as written in a detached job's record and the Slurm batch job's command).

Example:

    >>> DURATION.convert("5m", None, None), DURATION.convert(2.5, None, None)
    (300.0, 2.5)
    >>> DURATION_TEXT.convert("2h", None, None)
    '2h'
    >>> DURATION.convert("5 mins", None, None)
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: duration: '5 mins' is not a duration (e.g. 90s, 45m, 2h)
"""

from __future__ import annotations

from typing import Any

from typer._click.types import ParamType

from poprun_py.core.duration import duration_seconds


class Duration(ParamType):
    """A click parameter type for durations (``<duration>`` in the help); ``text``: keep it."""

    name = "duration"

    def __init__(self, text: bool = False) -> None:
        self.text = text

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        """Seconds (or the checked text); UsageError naming the option otherwise."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value) if self.text else float(value)
        seconds = duration_seconds(str(value), _flag(param))
        return str(value) if self.text else seconds


def _flag(param: Any) -> str:
    """The option's long name (``--timeout``), else ``duration``."""
    names = [n for n in getattr(param, "opts", ()) if n.startswith("--")]
    return max(names, key=len) if names else "duration"


DURATION = Duration()
DURATION_TEXT = Duration(text=True)
