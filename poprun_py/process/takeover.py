"""Forwarded signals that a well-known library of the instance takes over: one warning line each,
before launch, through the ``poprun_py`` logger (as preflight's warnings).

PyTorch Lightning installs a SLURM requeue handler on SIGUSR1 (Lightning-AI/pytorch-lightning
#14610); submitit used SIGUSR1 before 1.2, SIGUSR2 in 1.2 to 1.4, and SIGHUP since 1.5
(facebookincubator/submitit #1697, #1701). A signal poprun-py forwards for the program's own use
would then run the library's handler instead (requeue, exit). The check is cheap: a library
counts when the launching Python can import it (:func:`importlib.util.find_spec`, nothing
imported) or the program's command line names it.

Example:

    >>> import signal
    >>> found = {"submitit"}.__contains__
    >>> print(*takeover_warnings(("python", "train.py"), (signal.SIGUSR2,), found))
    forwarded SIGUSR2 may be taken over by submitit (its timeout handler, 1.2-1.4): choose \
another with --forward-signals HUP
    >>> takeover_warnings(("python", "train.py"), (signal.SIGUSR1,), lambda name: False)
    []
"""

from __future__ import annotations

import importlib.util
import logging
import signal
from collections.abc import Callable, Iterable, Sequence

from poprun_py.process.signals import FORWARDABLE

log = logging.getLogger("poprun_py")

TAKEOVERS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("SIGUSR1", ("lightning", "pytorch_lightning"), "PyTorch Lightning", "its SLURM requeue"),
    ("SIGUSR1", ("submitit",), "submitit", "its preemption handler, before 1.2"),
    ("SIGUSR2", ("submitit",), "submitit", "its timeout handler, 1.2-1.4"),
    ("SIGHUP", ("submitit",), "submitit", "its handler, 1.5 and later"),
)
"""(signal, module names, library, what takes the signal over)."""


def importable(name: str) -> bool:
    """Whether the launching Python finds module ``name``, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def takeover_warnings(
    program: Sequence[str], forwarded: Iterable[int], found: Callable[[str], bool] = importable
) -> list[str]:
    """One line per forwarded signal a library of :data:`TAKEOVERS` may take over, naming the
    library, the signal and how to choose another; a library counts when ``found`` says so or
    a word of ``program`` names it."""
    chosen = [signal.Signals(s).name for s in forwarded]
    words = " ".join(program).replace("-", "_")
    lines, said = [], set()
    for name, modules, library, what in TAKEOVERS:
        if name not in chosen or (name, library) in said:
            continue
        if any(m in words for m in modules) or any(found(m) for m in modules):
            said.add((name, library))
            other = _other(name, chosen)
            lines.append(
                f"forwarded {name} may be taken over by {library} ({what}): "
                f"choose another with --forward-signals {other}"
            )
    return lines


def _other(name: str, chosen: Sequence[str]) -> str:
    """What to forward instead: the other chosen signals, else another forwardable one."""
    keep = [n for n in chosen if n != name] or [n for n in reversed(FORWARDABLE) if n != name][:1]
    return ",".join(n[3:] for n in keep)


def warn_takeovers(program: Sequence[str], forwarded: Iterable[int]) -> None:
    """Log :func:`takeover_warnings` as warnings of the ``poprun_py`` logger."""
    for line in takeover_warnings(program, forwarded):
        log.warning("%s", line)
