"""``--format json`` where a command prints a table and :mod:`poprun_py.core.views` or the
launcher has no JSON of its own: ``check``'s per-host report and an attached ``launch``'s
summary. Machine-readable: a missing figure is ``null`` (never the table's ``-``), names carry
the table's units (``latency_ms``, ``bandwidth_MBps`` for its MB/s), codes are numbers.

Example:

    >>> from poprun_py.core.result import InstanceResult, LaunchResult
    >>> result = LaunchResult((InstanceResult(0, "h1", exit_code=0, ended=2.0),
    ...                        InstanceResult(1, "h2", exit_code=143, ended=1.0)))
    >>> summary = launch_dict(result, "instance 1 on h2 exited with code 143", [])
    >>> summary["ok"], summary["exit_code"], summary["root_cause"]
    (False, 143, 1)
    >>> summary["instances"][0]
    ... # doctest: +NORMALIZE_WHITESPACE
    {'instance': 1, 'host': 'h2', 'state': 'exited', 'root_cause': True, 'exit_code': 143,
     'signal': None, 'code': 143, 'killed_by': 'SIGTERM', 'detail': None}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from poprun_py.core.exit_codes import killed_by

if TYPE_CHECKING:
    from poprun_py.core.result import InstanceResult, LaunchResult
    from poprun_py.launch.check import CheckReport

NOT_GIVEN = ("", "-")
"""What the tables print for a value that is missing: ``null`` in JSON."""


def _value(text: str) -> str | None:
    return None if text in NOT_GIVEN else text


def check_dict(report: CheckReport) -> dict[str, Any]:
    """``check --format json``: whether it passed, how long it took, and per host the table's
    columns (``latency_ms``; ``bandwidth_MBps``, the table's MB/s; ``gloo`` null when not
    asked) and its problems."""
    hosts = [
        {
            "host": h.host,
            "instances": h.instances,
            "latency_ms": h.latency_ms,
            "bandwidth_MBps": h.bandwidth_mbps,
            "devices": _value(h.devices),
            "gloo": _value(h.gloo),
            "ok": h.ok,
            "problems": list(h.problems),
        }
        for h in report.hosts
    ]
    return {"ok": not report.faults, "seconds": round(report.seconds, 3), "hosts": hosts}


def launch_dict(
    result: LaunchResult,
    error: str | None,
    attempts: Sequence[str],
    tail: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """An attached ``launch --format json``'s summary: the job's outcome (``error``: the line
    the CLI prints on stderr, None when it succeeded), every instance (root cause first, as the
    table; a failed one's ``detail``, when the backend gave none, its last stderr line from
    ``tail``), and the lines about its attempts."""
    root = result.root_cause
    ordered = sorted(result.instances, key=lambda r: (r is not root, not r.failed, r.index))
    return {
        "ok": result.ok,
        "exit_code": result.exit_code,
        "error": error,
        "interrupted": result.interrupted,
        "root_cause": root.index if root is not None else None,
        "instances": [_instance(r, r is root, tail or {}) for r in ordered],
        "attempts": len(result.attempts) + 1,
        "notes": list(attempts),
        "seconds": round(result.duration, 3),
    }


def _instance(r: InstanceResult, is_root: bool, tail: Mapping[int, str]) -> dict[str, Any]:
    ended = r.exit_code is not None or r.signal is not None
    detail = r.detail or (tail.get(r.index, "") if r.failed else "")
    return {
        "instance": r.index,
        "host": r.host,
        "state": str(r.state),
        "root_cause": is_root,
        "exit_code": r.exit_code,
        "signal": r.signal,
        "code": r.code if ended or r.failed else None,
        "killed_by": killed_by(r.exit_code, r.signal),
        "detail": " ".join(detail.split()) or None,
    }
