"""One typed error tree for poprun-py; only the CLI turns these into messages and exit codes.

Exit codes (documented in the README and docs/command-line.md):

    0    success
    2    bad input: spec, flags, host expressions, impossible plans (nothing launched)
    3    preflight failed (nothing started)
    N    the failing instance's own exit code (root cause first in the summary; when N is one
         of poprun-py's own codes the message says it was the instance's)
    124  ``exec --timeout``: a host's command outlived the timeout
    130  interrupted (Ctrl-C / SIGTERM / SIGHUP); every instance was stopped
    255  a host was lost (stopped answering: dead, or off the network) or unreachable

Example:

    >>> from poprun_py.errors import PlanError
    >>> err = PlanError("--replicas 6 is not a multiple of --instances 4")
    >>> err.exit_code, str(err)
    (2, '--replicas 6 is not a multiple of --instances 4')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
EXIT_LOST = 255
OWN_CODES = frozenset(
    (EXIT_FAILURE, EXIT_USAGE, EXIT_PREFLIGHT, EXIT_TIMEOUT, EXIT_INTERRUPTED, EXIT_LOST)
)
"""poprun-py's own exit codes: an instance exiting with one of them is named as the cause."""


class PoprunError(Exception):
    """Base of every error poprun-py raises on purpose."""

    exit_code: int = EXIT_FAILURE


class UsageError(PoprunError):
    """Bad input of any kind: nothing was launched."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A fault in a cluster spec, naming the file, line and key."""

    def __init__(self, message: str, source: str = "", line: int | None = None, key: str = ""):
        self.source = source
        self.line = line
        self.key = key
        where = source
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        prefix = f"{where}: " if where else ""
        keypart = f"{key}: " if key else ""
        super().__init__(f"{prefix}{keypart}{message}")


class HostExprError(UsageError):
    """A host expression (list, range, @hostfile, Slurm nodelist) that cannot be used."""


class PlanError(UsageError):
    """A request that no plan can satisfy."""


class InputError(UsageError):
    """Input files or manifests that are missing or malformed."""


class RenderError(UsageError):
    """A template that cannot be rendered (missing template, undefined variable, bad syntax)."""


class UnknownNameError(UsageError):
    """An unknown backend or provider name; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: Sequence[str]):
        self.kind, self.name, self.valid = kind, name, tuple(valid)
        super().__init__(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(valid))}")


@dataclass(frozen=True)
class Fault:
    """One preflight fault on one host."""

    host: str
    check: str
    detail: str


class PreflightError(PoprunError):
    """One or more hosts failed preflight; nothing was started."""

    exit_code = EXIT_PREFLIGHT

    def __init__(self, faults: Sequence[Fault]):
        self.faults = tuple(faults)
        first = self.faults[0] if self.faults else Fault("?", "?", "unknown")
        more = f" (and {len(self.faults) - 1} more)" if len(self.faults) > 1 else ""
        super().__init__(
            f"preflight failed on {first.host}: {first.check}: {first.detail}{more}; "
            "nothing was started"
        )


class BackendError(PoprunError):
    """A backend could not start or supervise the job (e.g. mpirun or srun missing)."""


class ProvisionError(PoprunError):
    """A provider could not create, find or remove nodes."""


class Interrupted(PoprunError):
    """The user interrupted the run (Ctrl-C or SIGTERM); every instance was stopped."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str = "interrupted", result: object = None):
        self.result = result
        super().__init__(message)


class LaunchFailed(PoprunError):
    """An instance failed; every other instance was stopped. ``result`` is the LaunchResult."""

    def __init__(self, message: str, exit_code: int, result: object = None):
        self.exit_code = exit_code
        self.result = result
        super().__init__(message)
