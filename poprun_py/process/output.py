"""Where instances' output goes, and the job's files: per-instance logs, ``--only-output-from``,
the ``[host:index]`` sink, line splitting, and the private shard and job files.

Example:

    >>> from poprun_py.backends.result import RunOptions
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
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from poprun_py.backends.result import OutputSink, RunOptions
from poprun_py.errors import UsageError
from poprun_py.process.progress import MARKERS

if TYPE_CHECKING:
    from poprun_py.render.job import RenderedJob

LAUNCHER_INDEX = -1
"""The index output lines of a whole-job launcher (mpirun, srun) carry when no rank owns them."""

_MAX_LINE = 1 << 20  # a "line" this long without a newline is shown in pieces


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
    to ``output_dir/<launcher>.log``) and to the sink. With ``only_output_from`` set, stdout of
    other instances is not shown; stderr and launcher lines always are."""

    def __init__(self, options: RunOptions, hosts: Mapping[int, str], launcher: str = "launcher"):
        self._only = options.only_output_from
        self._sink = options.sink or prefixed_sink(hosts, launcher)
        self._logs: dict[int, IO[bytes]] = {}
        self._dir = options.output_dir
        self._launcher = launcher
        self._progress = options.progress
        self._mode = "ab" if options.attempt else "wb"  # a restart's logs follow the last's
        if self._dir is not None:
            Path(self._dir).mkdir(parents=True, exist_ok=True)
            for index in hosts:
                self._logs[index] = (Path(self._dir) / f"instance-{index}.log").open(self._mode)

    def emit(self, index: int, stream: str, line: bytes) -> None:
        """One line (without its newline) from instance ``index`` on ``stream``; poprun-py's
        progress markers (:mod:`poprun_py.process.progress`) are swallowed."""
        if self._progress is not None:
            self._progress.seen(index, line)
        if line[:2] == b"\x1b[" and line.rstrip(b"\r") in MARKERS:
            return
        log = self._logs.get(index)
        if log is None and index == LAUNCHER_INDEX and self._dir is not None:
            log = self._logs[index] = (Path(self._dir) / f"{self._launcher}.log").open(self._mode)
        if log is not None:
            log.write(line + b"\n")
        if stream == "stdout" and self._only is not None and index not in (self._only, -1):
            return
        self._sink(index, stream, line.decode("utf-8", "replace"))

    def close(self) -> None:
        """Flush and close every log file."""
        for log in self._logs.values():
            log.close()
        self._logs.clear()


class LineFeed:
    """Splits a pipe's bytes into lines for one instance's stream."""

    def __init__(self, output: Output, index: int, stream: str):
        self._output, self._index, self._stream = output, index, stream
        self._pending = b""

    def feed(self, data: bytes) -> None:
        """Emit every complete line; keep the tail (emitted anyway once it grows too long)."""
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            self._output.emit(self._index, self._stream, line)
        if len(self._pending) > _MAX_LINE:
            self._output.emit(self._index, self._stream, self._pending)
            self._pending = b""

    def close(self) -> None:
        """Emit a last line that had no newline."""
        if self._pending:
            self._output.emit(self._index, self._stream, self._pending)
            self._pending = b""


def write_job_files(job: RenderedJob) -> None:
    """Write the shard files and ``job.files`` under ``job.job_dir`` (mode 0600, dirs 0700).

    UsageError (exit 2, nothing started) when the job directory cannot be written."""
    root = job.job_dir
    made: set[str] = set()
    try:
        for inst in job.instances:
            if inst.shard_file:
                _write_private(os.path.join(root, inst.shard_file), inst.shard_text, made)
        for name, text in job.files.items():
            _write_private(os.path.join(root, name), text, made)
    except OSError as exc:
        raise UsageError(f"cannot write the job files to {root}: {exc.strerror or exc}") from None


def _write_private(path: str, text: str, made: set[str]) -> None:
    parent = os.path.dirname(path)
    if parent not in made:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        made.add(parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
