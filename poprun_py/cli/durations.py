"""The one duration type of every command's options: ``90s``, ``45m``, ``2h``, ``1h30m``, or
plain seconds, read by :func:`poprun_py.core.duration.duration_seconds`; a bad value is one
line naming the flag (exit 2). :data:`DURATION` gives the seconds (a float); :data:`DURATION_TEXT`
checks the text and keeps it, for options whose value is read again later (``--timeout`` of a
launch, kept as written in a detached job's record and the Slurm batch job's command).
:data:`SLURM_TIME` (``--time``) takes Slurm's own forms as they are (``30`` minutes, ``1:00:00``,
``1-12``) and a duration with units (``2h``, ``45m``, ``90s``) as ``H:MM:SS``.

Example:

    >>> DURATION.convert("5m", None, None), DURATION.convert(2.5, None, None)
    (300.0, 2.5)
    >>> DURATION_TEXT.convert("2h", None, None)
    '2h'
    >>> SLURM_TIME.convert("2h", None, None), SLURM_TIME.convert("90s", None, None)
    ('2:00:00', '0:01:30')
    >>> SLURM_TIME.convert("30", None, None), SLURM_TIME.convert("1-12", None, None)
    ('30', '1-12')
    >>> DURATION.convert("5 mins", None, None)
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: duration: '5 mins' is not a duration (e.g. 90s, 45m, 2h)
"""

from __future__ import annotations

import math
from typing import Any

from typer._click.types import ParamType

from poprun_py.core.duration import duration_seconds, parse_duration


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


class SlurmTime(ParamType):
    """Slurm's ``--time``: its own forms unchanged, a duration with units as ``[D-]H:MM:SS``."""

    name = "time"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        """The value as Slurm takes it; UsageError naming the option for a bad duration."""
        text = str(value).strip()
        if not text or text[-1].lower() not in "smhd" or text[0] == "-":
            return text  # Slurm's minutes, [D-]H:M:S: Slurm checks them
        seconds = math.ceil(parse_duration(text, _flag(param)))
        days, rest = divmod(seconds, 86400)
        clock = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
        return f"{days}-{clock}" if days else clock


def _flag(param: Any) -> str:
    """The option's long name (``--timeout``), else ``duration``."""
    names = [n for n in getattr(param, "opts", ()) if n.startswith("--")]
    return max(names, key=len) if names else "duration"


DURATION = Duration()
DURATION_TEXT = Duration(text=True)
SLURM_TIME = SlurmTime()
