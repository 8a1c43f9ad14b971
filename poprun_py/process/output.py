"""Where instances' output goes, and the job's files: per-instance logs, ``--only-output-from``,
the ``[host:index]`` sink, line splitting, and the private shard and job files.

Every line reaches its log (mode 0600) as it arrives, unbuffered: a log is complete up to the
last line even when the launcher is killed. Job files go through
:mod:`poprun_py.hostside.private` (the job root's owner is checked, nothing follows a symlink).

Example:

    >>> from poprun_py.core.result import RunOptions
    >>> lines = []
    >>> out = Output(RunOptions(sink=lambda i, s, line: lines.append((i, s, line))), {0: "h1"})
    >>> feed = LineFeed(out, 0, "stdout")
    >>> feed.feed(b"one\\ntw"); feed.feed(b"o\\n"); feed.close()
    >>> lines
    [(0, 'stdout', 'one'), (0, 'stdout', 'two')]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from poprun_py.core.result import OutputSink, RunOptions
from poprun_py.errors import Fault, PreflightError, UsageError
from poprun_py.hostside import private, supervision
from poprun_py.process.progress import is_marker

if TYPE_CHECKING:
    from poprun_py.render.job import RenderedJob

LAUNCHER_INDEX = -1
"""The index output lines of a whole-job launcher (mpirun, srun) carry when no rank owns them."""


def prefixed_sink(hosts: Mapping[int, str], launcher: str = "launcher") -> OutputSink:
    """The default sink: ``[host:index] line`` to sys.stdout or sys.stderr, by stream.

    Lines of the launcher itself (index ``LAUNCHER_INDEX``) are prefixed ``[launcher]``.
    """

    def sink(index: int, stream: str, line: str) -> None:
        tag = launcher if index == LAUNCHER_INDEX else f"{hosts.get(index, '?')}:{index}"
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(f"[{tag}] {line}\n")
        out.flush()

    return sink


class Output:
    """Routes output lines: to ``output_dir/instance-<N>.log`` (raw, unprefixed; launcher lines
    to ``output_dir/<launcher>.log``), written as they come, and to the sink. With
    ``only_output_from`` set, stdout of other instances is not shown; stderr and launcher lines
    always are."""

    def __init__(self, options: RunOptions, hosts: Mapping[int, str], launcher: str = "launcher"):
        self._only = options.only_output_from
        self._sink = options.sink or prefixed_sink(hosts, launcher)
        self._logs: dict[int, int] = {}  # index -> the log's file descriptor
        self._dir = options.output_dir
        self._launcher = launcher
        self._progress = options.progress
        self._last_words = options.last_words
        self._append = bool(options.attempt)  # a restart's logs follow the last's
        if self._dir is not None:
            _logs_dir(str(self._dir))
            for index in hosts:
                self._logs[index] = self._open(f"instance-{index}.log")

    def _open(self, name: str) -> int:
        path = os.path.join(str(self._dir), name)
        try:
            return private.open_private(path, append=self._append)
        except OSError as exc:
            self.close()
            raise UsageError(f"cannot write the log {path}: {exc.strerror or exc}") from None

    def emit(self, index: int, stream: str, line: bytes) -> None:
        """One line (without its newline) from instance ``index`` on ``stream``; poprun-py's
        progress markers (:mod:`poprun_py.process.progress`) are swallowed."""
        self.emit_lines(index, stream, (line,))

    def emit_lines(self, index: int, stream: str, lines: Sequence[bytes]) -> None:
        """Several lines of one stream: one write to the log, then each to the sink."""
        if self._progress is not None:
            for line in lines:
                self._progress.seen(index, line)
        kept = [x for x in lines if not is_marker(x)]
        if not kept:
            return
        if self._last_words is not None:
            for line in kept:
                self._last_words.note(index, stream, line)
        log = self._logs.get(index)
        if log is None and index == LAUNCHER_INDEX and self._dir is not None:
            log = self._logs[index] = self._open(f"{self._launcher}.log")
        if log is not None:
            _write_all(log, b"".join(x + b"\n" for x in kept))
        if stream == "stdout" and self._only is not None and index not in (self._only, -1):
            return
        for line in kept:
            self._sink(index, stream, line.decode("utf-8", "replace"))

    def close(self) -> None:
        """Close every log file (each is complete already)."""
        for log in self._logs.values():
            os.close(log)
        self._logs.clear()


def _logs_dir(path: str) -> None:
    """Make (or check) the logs' directory; its faults are bad input or preflight's."""
    try:
        private.private_dir(path)
    except private.UnsafePath as exc:
        raise PreflightError([Fault("localhost", "logs directory", str(exc))]) from None
    except OSError as exc:
        raise UsageError(f"cannot write the logs to {path}: {exc.strerror or exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class LineFeed(supervision.LineFeed):
    """Splits a pipe's bytes into lines for one instance's stream (the supervision core's rule:
    a longer "line" than :data:`~poprun_py.hostside.supervision.MAX_LINE` is shown in pieces)."""

    def __init__(self, output: Output, index: int, stream: str):
        super().__init__(lambda lines: output.emit_lines(index, stream, lines))


def write_job_files(job: RenderedJob) -> None:
    """Write the shard files and ``job.files`` under ``job.job_dir`` (mode 0600, dirs 0700).

    PreflightError (exit 3, nothing started) when another user could tamper with the job
    directory (e.g. owns the job root, see :mod:`poprun_py.hostside.private`); UsageError
    (exit 2) when it cannot be written."""
    root = job.job_dir
    made: set[str] = set()
    try:
        for inst in job.instances:
            if inst.shard_file:
                _write_private(os.path.join(root, inst.shard_file), inst.shard_text, made)
        for name, text in job.files.items():
            _write_private(os.path.join(root, name), text, made)
    except private.UnsafePath as exc:
        raise PreflightError([Fault("localhost", "job directory", str(exc))]) from None
    except OSError as exc:
        raise UsageError(f"cannot write the job files to {root}: {exc.strerror or exc}") from None


def _write_private(path: str, text: str, made: set[str]) -> None:
    parent = os.path.dirname(path)
    if parent not in made:
        private.private_dir(parent)
        made.add(parent)
    private.write_private(path, text, durable=False)  # rewritten by every launch


def remove_job_dir(path: str) -> bool:
    """Remove a job's directory (a successful job's, not given with ``--output-dir``); True
    once it is gone. Never follows a symlink out of it."""
    import shutil

    try:
        if os.path.islink(path) or not os.path.isdir(path):
            return False
        shutil.rmtree(path)
    except OSError:
        return False
    return True
