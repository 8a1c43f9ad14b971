"""``poprun-py exec`` and ``poprun-py sync``: a command, or files, on every host in parallel.

``exec`` prints ``host: line`` as lines arrive, or with ``--gather`` folds hosts with identical
output under one header (like ``clush -b``); it exits with the worst host's code (255 for a host
that cannot be reached, 124 for one that hit ``--timeout``). ``sync`` pushes paths (default: the
current directory) to every host at the same absolute path, or under ``--dest``, with a progress
bar; a host that cannot be reached or written fails it with exit code 3, and one still
pushing at ``--timeout`` (90s, 45m, 2h, or seconds) fails too: nothing outlives the command.

Example:

    $ poprun-py exec --hosts node[01-16] --gather -- uname -r
    $ poprun-py exec -c clusters/pod16.yaml --timeout 30 -- python3 -c 'import torch'
    $ poprun-py sync --hosts node[01-04] --timeout 10m ~/job
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import typer

from poprun_py.cli import options as o
from poprun_py.cli.app import PROGRAM_CONTEXT, app, console
from poprun_py.cli.examples import epilog
from poprun_py.core.spec import SshOptions
from poprun_py.errors import UsageError
from poprun_py.process.signals import interrupting

if TYPE_CHECKING:
    from poprun_py.ssh.fanout import LineFn
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.sync import SyncReport


@app.command("exec", context_settings=PROGRAM_CONTEXT, epilog=epilog("exec"))
@o.takes("exec")
def exec_cmd(
    command: list[str],
    *,
    hosts: str | None = None,
    cluster: str | None = None,
    gather: bool = False,
    timeout: float | None = None,
    ssh: o.Ssh = o.SSH_HERE,
) -> None:
    """Run a command on every host in parallel; exit with the worst host's code."""
    from poprun_py.ssh.fanout import gathered, problems, run_everywhere, worst_exit_code

    if not command:
        raise UsageError("exec needs a command: poprun-py exec --hosts H -- CMD [ARGS]...")
    if timeout is not None and timeout <= 0:
        raise UsageError("--timeout must be more than 0")
    with _connected(hosts, cluster, ssh) as pool:
        on_line = None if gather else _tagged_printer()
        outcomes = run_everywhere(pool, command, timeout=timeout, on_line=on_line)
    if gather:
        sys.stdout.write(gathered(outcomes, "stdout"))
        sys.stdout.flush()
        sys.stderr.write(gathered(outcomes, "stderr"))
    for line in problems(outcomes):
        sys.stderr.write(f"poprun-py: {line}\n")
    sys.stderr.flush()
    code = worst_exit_code(outcomes)
    if code:
        raise typer.Exit(code)


def _tagged_printer() -> LineFn:
    """``on_line`` writing ``host: line`` to stdout or stderr, one whole line at a time."""
    lock = threading.Lock()

    def emit(host: str, stream: str, line: str) -> None:
        out = sys.stdout if stream == "stdout" else sys.stderr
        with lock, contextlib.suppress(BrokenPipeError):  # e.g. `| head`: keep the hosts going
            out.write(f"{host}: {line}\n")
            out.flush()

    return emit


@app.command("sync", epilog=epilog("sync"))
@o.takes("sync")
def sync_cmd(
    paths: list[str] | None = None,
    *,
    hosts: str | None = None,
    cluster: str | None = None,
    dest: str | None = None,
    method: str = "auto",
    timeout: str | None = None,
    ssh: o.Ssh = o.SSH_HERE,
) -> None:
    """Push files to every host at the same path (rsync where possible, else SFTP)."""
    from poprun_py.core.duration import parse_duration
    from poprun_py.ssh.sync import METHODS

    seconds = None if timeout is None else parse_duration(timeout, "--timeout")
    if method not in METHODS:
        raise UsageError(f"--method must be one of {', '.join(METHODS)}, not {method!r}")
    if dest is not None and not dest.startswith("/"):
        raise UsageError(f"--dest must be an absolute path, not {dest!r}")
    with _connected(hosts, cluster, ssh) as pool:
        report = _sync_with_progress(pool, paths or ["."], dest, method, seconds)
    _print_sync_summary(report)


def _sync_with_progress(
    pool: ConnectionPool, paths: list[str], dest: str | None, method: str, timeout: float | None
) -> SyncReport:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from poprun_py.ssh.sync import sync

    done: dict[str, int] = {}
    lock = threading.Lock()
    columns = (TextColumn("sync"), BarColumn(), DownloadColumn(), TextColumn("{task.description}"))
    err = console(stderr=True)
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(f"{len(pool.hosts)} host(s)", total=None)

        def progress(host: str, sent: int, total: int) -> None:
            with lock:
                done[host] = sent
                bar.update(task, completed=sum(done.values()), total=total * len(pool.hosts))

        with interrupting():
            return sync(pool, paths, dest, progress, method=method, timeout=timeout)


def _print_sync_summary(report: SyncReport) -> None:
    methods = sorted({h.method for h in report.hosts})
    sent = sum(h.bytes_sent for h in report.hosts)
    sys.stderr.write(
        f"poprun-py: synced {report.files_total} file(s) to {len(report.hosts)} host(s) "
        f"({'/'.join(methods)}): {report.files_sent} file(s), {sent} bytes sent\n"
    )


@contextlib.contextmanager
def _connected(hosts: str | None, cluster: str | None, ssh: SshOptions) -> Iterator[ConnectionPool]:
    """A connection pool to the target hosts (``--hosts``/``--cluster``), SSH flags applied."""
    from poprun_py.prepare.specfile import target_cluster
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import settings_for

    spec = target_cluster(hosts, cluster)
    with ConnectionPool(spec.hosts, settings_for(spec, ssh)) as pool:
        yield pool
