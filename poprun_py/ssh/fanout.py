"""Run one command on many hosts in parallel, as ``clush``/``pdsh`` do, over the pool's connections.

Output is either tagged (``host: line`` as each line arrives, through ``on_line``) or gathered:
hosts with identical output are folded under one header naming them as a node set (like
``clush -b``). The exit code is the worst host's: the largest, with 255 for a host that could not
be reached (as ssh does) and 124 for one that outlived ``--timeout``.

Example:

    >>> outcomes = [HostOutcome("n1", 0, "ok\\n"), HostOutcome("n2", 0, "ok\\n"),
    ...             HostOutcome("n3", 2, "no\\n")]
    >>> print(gathered(outcomes, "stdout"), end="")
    ---------------
    n[1-2] (2)
    ---------------
    ok
    ---------------
    n3
    ---------------
    no
    >>> worst_exit_code(outcomes)
    2
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poprun_py.errors import EXIT_INTERRUPTED, Interrupted
from poprun_py.process.signals import interrupting

if TYPE_CHECKING:
    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.hostresult import HostResult
    from poprun_py.ssh.pool import ConnectionPool

EXIT_UNREACHABLE = 255
EXIT_TIMEOUT = 124
RULE = "-" * 15

LineFn = Callable[[str, str, str], None]
"""``on_line(host, stream, line)``: one complete line (no newline) of ``stdout`` or ``stderr``."""


@dataclass(frozen=True)
class HostOutcome:
    """How the command went on one host; ``error`` says why it could not run to the end."""

    host: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    duration: float = 0.0


class LineSplitter:
    """Turns one host's output chunks into complete lines for ``on_line``."""

    def __init__(self, host: str, on_line: LineFn):
        self.host = host
        self.on_line = on_line
        self._partial = {"stdout": b"", "stderr": b""}
        self._lock = threading.Lock()

    def feed(self, stream: str, data: bytes) -> None:
        """Add a chunk; emit every line it completes."""
        with self._lock:
            *lines, self._partial[stream] = (self._partial[stream] + data).split(b"\n")
        for line in lines:
            self.on_line(self.host, stream, line.decode(errors="replace"))

    def flush(self) -> None:
        """Emit what is left after the last newline."""
        for stream, rest in self._partial.items():
            if rest:
                self.on_line(self.host, stream, rest.decode(errors="replace"))
        self._partial = {"stdout": b"", "stderr": b""}


def run_everywhere(
    pool: ConnectionPool,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    on_line: LineFn | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list[HostOutcome]:
    """Run ``argv`` on every host of ``pool`` (connecting as needed); one outcome per host.
    Each host's connection is closed as soon as its command is done.

    On Ctrl-C (or SIGTERM, SIGHUP: :func:`poprun_py.process.signals.interrupting`) the
    command's process group is stopped on every host, then Interrupted is raised.
    """
    cancel, done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["outcomes"] = _run_all(
                pool, argv, timeout=timeout, on_line=on_line, env=env, cwd=cwd, cancel=cancel
            )
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    # Wait on an Event, not Thread.join: a join interrupted by Ctrl-C marks a live thread as
    # finished (CPython's bpo-45274 handling), and the process would exit mid-cleanup.
    threading.Thread(target=work, name="poprun-exec", daemon=True).start()
    try:
        with interrupting():
            while not done.wait(0.2):
                pass
    except KeyboardInterrupt:
        cancel.set()
        done.wait()
        raise Interrupted("interrupted: the command was stopped on every host") from None
    if "error" in box:
        raise box["error"]
    outcomes: list[HostOutcome] = box["outcomes"]
    return outcomes


def _run_all(
    pool: ConnectionPool,
    argv: Sequence[str],
    *,
    timeout: float | None,
    on_line: LineFn | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    cancel: threading.Event,
) -> list[HostOutcome]:
    def one(conn: Connection) -> HostOutcome:
        splitter = LineSplitter(conn.name, on_line) if on_line else None
        feed = splitter.feed if splitter else None
        try:
            result = conn.run(
                argv, env=env, cwd=cwd, timeout=timeout, on_output=feed, cancel=cancel
            )
        finally:
            if splitter:
                splitter.flush()
            pool.release(conn.name)  # one command per host: its connection is done
        return HostOutcome(
            conn.name, result.exit_code, result.stdout, result.stderr, None, result.duration
        )

    results = pool.each(one, connect=True)  # each host starts as soon as it is connected
    return [_outcome(host.name, results.get(host.name)) for host in pool.hosts]


def _outcome(host: str, got: HostResult[HostOutcome] | None) -> HostOutcome:
    from poprun_py.ssh.errors import Cancelled, RemoteTimeout, TransportError

    if got is None:
        return HostOutcome(host, EXIT_UNREACHABLE, error=f"{host}: not run")
    match got.fault:
        case None:
            return got.value
        case RemoteTimeout(detail=detail):
            return HostOutcome(host, EXIT_TIMEOUT, error=detail)
        case Cancelled(detail=detail):
            return HostOutcome(host, EXIT_INTERRUPTED, error=detail)
        case TransportError(detail=detail):
            return HostOutcome(host, EXIT_UNREACHABLE, error=detail)
        case Exception() as exc:  # keep every host's outcome, whatever went wrong
            return HostOutcome(host, EXIT_UNREACHABLE, error=f"{host}: {type(exc).__name__}: {exc}")
        case fault:
            raise fault


def worst_exit_code(outcomes: Sequence[HostOutcome]) -> int:
    """The largest exit code of any host (0 when every host succeeded)."""
    return max((o.exit_code for o in outcomes), default=0)


def fold(outcomes: Sequence[HostOutcome], stream: str) -> list[tuple[list[str], str]]:
    """Group hosts by identical output of ``stream``, in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for outcome in outcomes:
        text = outcome.stdout if stream == "stdout" else outcome.stderr
        if text and outcome.error is None:
            groups.setdefault(text, []).append(outcome.host)
    return [(hosts, text) for text, hosts in groups.items()]


def nodeset(hosts: Sequence[str]) -> str:
    """Host names folded as a node set: ``n[1-3],gpu7``."""
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(hosts)))


def gathered(outcomes: Sequence[HostOutcome], stream: str) -> str:
    """``clush -b`` style: a header naming the hosts (and their count), then the output once."""
    blocks = []
    for hosts, text in fold(outcomes, stream):
        count = f" ({len(hosts)})" if len(hosts) > 1 else ""
        header = f"{RULE}\n{nodeset(hosts)}{count}\n{RULE}\n"
        blocks.append(header + (text if text.endswith("\n") else text + "\n"))
    return "".join(blocks)


def problems(outcomes: Sequence[HostOutcome]) -> list[str]:
    """One line per host that failed: why it could not run, or its non-zero exit code."""
    lines = []
    for outcome in outcomes:
        if outcome.error is not None:
            lines.append(outcome.error)
        elif outcome.exit_code != 0:
            lines.append(f"{outcome.host}: exited with exit code {outcome.exit_code}")
    return lines
