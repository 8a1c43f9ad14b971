"""Durations as users write them: ``90s``, ``45m``, ``2h``, ``1h30m``, or plain seconds (``90``,
``2.5``). Pure; faults are UsageError (exit 2) naming the flag.

:func:`parse_duration` takes a duration above 0; :func:`duration_seconds` checks the syntax only
(0, or below with a ``-``), for options whose own check says which range they take.

Example:

    >>> parse_duration("90s"), parse_duration("45m"), parse_duration("1h30m"), parse_duration("2.5")
    (90.0, 2700.0, 5400.0, 2.5)
    >>> parse_duration("soon", "--timeout")
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: --timeout: 'soon' is not a duration (e.g. 90s, 45m, 2h)
    >>> duration_seconds("5m", "--hang-timeout"), duration_seconds("0"), duration_seconds("-1")
    (300.0, 0.0, -1.0)
"""

from __future__ import annotations

import re

from poprun_py.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str = "duration") -> float:
    """Seconds in ``text``; UsageError unless it is one or more NUMBER[s|m|h|d] parts, above 0."""
    seconds = _seconds(text, text.strip().lower(), flag)
    if seconds <= 0:
        raise UsageError(f"{flag}: {text!r} must be more than 0")
    return seconds


def duration_seconds(text: str, flag: str = "duration") -> float:
    """Seconds in ``text``, read as :func:`parse_duration` reads them but also 0 or below (a
    leading ``-``): the option's own check says which range it takes."""
    value = text.strip().lower()
    if value.startswith("-"):
        return -_seconds(text, value[1:], flag)
    return _seconds(text, value, flag)


def _seconds(text: str, value: str, flag: str) -> float:
    parts = _PART.findall(value)
    if (
        not value
        or "".join(n + u for n, u in parts) != value
        or (len(parts) > 1 and not all(u for _, u in parts))
    ):
        where = f"{flag}: " if flag else ""  # none: the caller names where it was
        raise UsageError(f"{where}{text!r} is not a duration (e.g. 90s, 45m, 2h)")
    return sum(float(n) * _UNIT[u] for n, u in parts)
