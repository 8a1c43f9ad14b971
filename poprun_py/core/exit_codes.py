"""What an instance's exit code says when a signal ended it: a shell reports a child killed by
signal N as exit code 128+N, so 143 is SIGTERM (stopped from outside: a scheduler, ``kill``)
and 137 is SIGKILL (often the kernel's out-of-memory killer). Pure.

Example:

    >>> explain(143), explain(137), explain(None, signal=15), explain(3), explain(300)
    ('killed by SIGTERM (143)', 'killed by SIGKILL (137)', 'killed by SIGTERM (143)', '', '')
    >>> exit_phrase(143), exit_phrase(7), exit_phrase(None, signal=9)
    ('exited with code 143, killed by SIGTERM', 'exited with code 7', 'was killed by SIGKILL (137)')
"""

from __future__ import annotations

SIGNAL_BASE = 128
"""A shell's exit code for a child killed by signal N is 128+N."""
LINUX_SIGNALS = (
    *("HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV"),
    *("USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN"),
    *("TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS"),
)
"""Signals 1 to 31 as Linux numbers them (the hosts' numbers, whatever this machine's are)."""


def signal_name(signum: int) -> str | None:
    """``SIGTERM`` for 15; None for a number that is no signal."""
    return f"SIG{LINUX_SIGNALS[signum - 1]}" if 1 <= signum <= len(LINUX_SIGNALS) else None


def killed_by(code: int | None, signal: int | None = None) -> str | None:
    """The signal that ended the process: ``signal`` itself, else the one ``code`` (128+N)
    stands for; None when neither names a signal."""
    if signal is not None:
        return signal_name(signal)
    if code is not None and code > SIGNAL_BASE:
        return signal_name(code - SIGNAL_BASE)
    return None


def explain(code: int | None, signal: int | None = None) -> str:
    """``killed by SIGTERM (143)`` when the outcome is a signal's, else ``""``."""
    name = killed_by(code, signal)
    if name is None:
        return ""
    number = SIGNAL_BASE + signal if signal is not None else code
    return f"killed by {name} ({number})"


def exit_phrase(code: int | None, signal: int | None = None) -> str:
    """How a summary line says an instance ended: ``exited with code 7``, ``exited with code
    143, killed by SIGTERM`` (a shell's report of its child), or ``was killed by SIGKILL
    (137)`` (the instance itself)."""
    if signal is not None:
        return (
            f"was {explain(None, signal)}"
            if signal_name(signal)
            else f"was killed by signal {signal}"
        )
    name = killed_by(code)
    return f"exited with code {code}" + (f", killed by {name}" if name else "")
