"""Durations as users write them: ``90s``, ``45m``, ``2h``, ``1h30m``, or plain seconds (``90``,
``2.5``). Pure; faults are UsageError (exit 2) naming the flag.

Example:

    >>> parse_duration("90s"), parse_duration("45m"), parse_duration("1h30m"), parse_duration("2.5")
    (90.0, 2700.0, 5400.0, 2.5)
    >>> parse_duration("soon", "--timeout")
    Traceback (most recent call last):
    ...
    poprun_py.errors.UsageError: --timeout: 'soon' is not a duration (e.g. 90s, 45m, 2h)
"""

from __future__ import annotations

import re

from poprun_py.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, flag: str = "duration") -> float:
    """Seconds in ``text``; UsageError unless it is one or more NUMBER[s|m|h|d] parts, above 0."""
    value = text.strip().lower()
    parts = _PART.findall(value)
    if (
        not value
        or "".join(n + u for n, u in parts) != value
        or (len(parts) > 1 and not all(u for _, u in parts))
    ):
        raise UsageError(f"{flag}: {text!r} is not a duration (e.g. 90s, 45m, 2h)")
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"{flag}: {text!r} must be more than 0")
    return seconds
