"""``poprun-py jobs``, ``logs``, ``stop`` and ``wait``: detached jobs (``launch --detach``), from
any terminal or process; and ``supervise``, the supervisor itself (hidden: the client starts it).

A job is found through this machine's list of the jobs it launched
(:mod:`poprun_py.jobs.registry`), or -- when that list is lost, or the job was launched
elsewhere -- on the hosts of the cluster named with ``-c``/``--hosts`` (every host is asked).

Example:

    $ poprun-py jobs
    $ poprun-py jobs -c clusters/testhosts-4.yaml --format json
    $ poprun-py jobs --prune --older-than 7d
    $ poprun-py logs --follow testhosts-4-20261201-120501-3f2a --instance 3
    $ poprun-py stop testhosts-4-20261201-120501-3f2a
    $ poprun-py wait testhosts-4-20261201-120501-3f2a; echo $?
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from poprun_py.cli import options as o
from poprun_py.cli.app import app, console
from poprun_py.cli.examples import epilog
from poprun_py.core.spec import SshOptions
from poprun_py.errors import EXIT_LOST, UsageError

if TYPE_CHECKING:
    from poprun_py.jobs.place import JobHost
    from poprun_py.jobs.record import JobRecord
    from poprun_py.jobs.supervisor import Recorder

DEFAULT_GRACE = 5.0


@app.command("jobs", epilog=epilog("jobs"))
@o.takes("jobs")
def jobs_cmd(  # noqa: PLR0917 - typer maps every option to a parameter
    hosts: str | None = None,
    cluster: str | None = None,
    fmt: str = "table",
    ssh: o.Ssh = o.SSH_HERE,
    prune: bool = False,
    older_than: str | None = None,
) -> None:
    """List detached jobs: id, state, hosts, start, attempts, exit code (--prune: remove the
    ended ones)."""
    from poprun_py.jobs.finder import all_jobs

    if fmt not in ("table", "json"):
        raise UsageError(f"--format must be table or json, got {fmt!r}")
    if older_than is not None and not prune:
        raise UsageError("--older-than goes with --prune")
    if prune:
        _prune(hosts, cluster, ssh, older_than, fmt)
        return
    records, problems = all_jobs(hosts, cluster, ssh)
    for line in problems:
        sys.stderr.write(f"poprun-py: warning: {line}\n")
    if fmt == "json":
        from dataclasses import asdict

        rows = [{k: v for k, v in asdict(r).items() if k != "options"} for r in records]
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    _print_table(records)


def _prune(
    hosts: str | None,
    cluster: str | None,
    ssh: SshOptions,
    older_than: str | None,
    fmt: str,
) -> None:
    """``jobs --prune [--older-than AGE]``: one line naming what was removed."""
    from poprun_py.core.duration import parse_duration
    from poprun_py.jobs.finder import prune_jobs

    age = parse_duration(older_than, "--older-than") if older_than is not None else 0.0
    pruned, problems = prune_jobs(hosts, cluster, ssh, age)
    for line in problems:
        sys.stderr.write(f"poprun-py: warning: {line}\n")
    if fmt == "json":
        json.dump({"pruned": pruned}, sys.stdout)
        sys.stdout.write("\n")
        return
    names = f": {', '.join(pruned)}" if pruned else ""
    sys.stderr.write(f"poprun-py: pruned {len(pruned)} ended job(s){names}\n")


JOB_COLUMNS = ("job", "state", "hosts", "started", "attempts", "code")


def _print_table(records: list[JobRecord]) -> None:
    """One line per job, as wide as the output (80 columns when piped): the id comes first and
    is never cut, nor is any column but the hosts (cut short, or left out when even its header
    does not fit: ``--format json`` has them all)."""
    from poprun_py.core.views import fitted_lines
    from poprun_py.jobs.record import summary_row
    from poprun_py.ssh.fanout import nodeset

    rows = [list(summary_row(record, nodeset)) for record in records]
    lines = fitted_lines(JOB_COLUMNS, rows, console().width, shrink=JOB_COLUMNS.index("hosts"))
    sys.stdout.write("".join(f"{line}\n" for line in lines))


@app.command("logs", epilog=epilog("logs"))
@o.takes("logs")
def logs_cmd(
    job_id: str,
    follow: bool = False,
    instance: int | None = None,
    hosts: str | None = None,
    cluster: str | None = None,
) -> None:
    """Print a detached job's output, tagged as an attached launch prints it (--follow: follow it
    until the job ends; Ctrl-C stops the following, not the job)."""
    from poprun_py.jobs.record import log_locations

    if instance is None:  # one call on the host: its output, no record needed first
        from poprun_py.jobs.finder import job_host
        from poprun_py.jobs.record import check_job_id

        with job_host(check_job_id(job_id), hosts, cluster, shown=False) as (host, _):
            if not host.follow(job_id, "output.log", follow, _raw_writer()):
                raise UsageError(f"unknown job {job_id}: host {host.name} has no such job")
        return
    with _job_host(job_id, hosts, cluster) as (host, record):
        if not 0 <= instance < len(record.instances):
            raise UsageError(
                f"logs --instance {instance}: job {job_id} has {len(record.instances)} "
                f"instance(s), 0 to {len(record.instances) - 1}"
            )
        logs = log_locations(record)["instance_logs"]
        tag = f"[{record.instances[instance]}:{instance}] "
        writer = _TaggedWriter(tag)
        host.follow(job_id, f"{logs}/instance-{instance}.log", follow, writer.write)
        writer.close()


def _raw_writer() -> Any:
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        with contextlib.suppress(BrokenPipeError):
            out.write(data)
            out.flush()

    return write


class _TaggedWriter:
    """Writes whole lines, each with ``tag`` in front."""

    def __init__(self, tag: str):
        self.tag, self.rest = tag.encode(), b""
        self.out = sys.stdout.buffer

    def write(self, data: bytes) -> None:
        """Tag and write every whole line of ``data`` (the rest waits for its newline)."""
        *lines, self.rest = (self.rest + data).split(b"\n")
        if lines:
            self.out.write(b"".join(self.tag + line + b"\n" for line in lines))
            self.out.flush()

    def close(self) -> None:
        """Write what is left without a newline."""
        if self.rest:
            self.out.write(self.tag + self.rest + b"\n")
            self.out.flush()


@app.command("stop", epilog=epilog("stop"))
@o.takes("stop")
def stop_cmd(job_id: str, hosts: str | None = None, cluster: str | None = None) -> None:
    """Stop a detached job on every host (TERM, KILL after its grace period); stopping a job
    that has ended does nothing."""
    from poprun_py.jobs.finder import record_of

    with _job_host(job_id, hosts, cluster) as (host, record):
        if not record.active:
            sys.stderr.write(f"poprun-py: job {job_id} has already ended ({record.state})\n")
            return
        grace = float(record.options.get("grace_period") or DEFAULT_GRACE)
        data = host.call("stop", job_id, str(grace))
    after = record_of(data) if data else record
    sys.stderr.write(f"poprun-py: job {job_id} {after.state}\n")


@app.command("wait", epilog=epilog("wait"))
@o.takes("wait")
def wait_cmd(job_id: str, hosts: str | None = None, cluster: str | None = None) -> None:
    """Wait for a detached job to end; exit with its exit code."""
    from poprun_py.jobs.finder import job_host, record_of
    from poprun_py.jobs.record import check_job_id

    # until the supervisor is gone, not merely the job: --down's teardown comes after the job
    with job_host(check_job_id(job_id), hosts, cluster, shown=False) as (host, _):
        data = host.call("wait", job_id)
    if data is None:
        raise UsageError(f"unknown job {job_id}: host {host.name} has no such job")
    final = record_of(data)
    code = final.exit_code if final.exit_code is not None else EXIT_LOST
    detail = f": {final.reason}" if final.reason else ""
    sys.stderr.write(f"poprun-py: job {job_id} {final.state} (exit code {code}){detail}\n")
    if code:
        raise typer.Exit(code)


@contextlib.contextmanager
def _job_host(
    job_id: str, hosts: str | None, cluster: str | None
) -> Iterator[tuple[JobHost, JobRecord]]:
    """The host of ``job_id``'s supervisor, and the job's record as it stands."""
    from poprun_py.jobs.finder import job_host
    from poprun_py.jobs.record import check_job_id

    with job_host(check_job_id(job_id), hosts, cluster) as (host, record):
        assert record is not None
        yield host, record


@app.command("supervise", hidden=True)
@o.takes("supervise")
def supervise_cmd(job_id: str) -> None:
    """The supervisor of a detached job (started by ``launch --detach``; reads its record on
    stdin)."""
    from poprun_py.jobs.supervisor import detach_and_run

    code = detach_and_run(job_id, _run_job)
    if code:
        raise typer.Exit(code)


def _run_job(recorder: Recorder) -> None:
    """In the detached child: plan the job here, run it as ``launch`` does, record its end;
    with ``--down``, then remove the cluster."""
    from poprun_py.cli import report_error
    from poprun_py.cli.launch_cmd import _launch
    from poprun_py.errors import Interrupted, PoprunError
    from poprun_py.jobs.supervisor import prepared

    extra = recorder.record.options
    try:
        logs = extra.get("output_dir") or str(recorder.job_dir / "logs")
        prep, swaps = prepared(recorder, logs)  # --check with spares: the client's swaps
        cli = extra.get("cli") or {}  # the options launch_cmd passes on besides LaunchOptions
        only = cli.get("only_output_from_instance")
        keep = bool(cli.get("keep_job_dir"))
        _launch(prep, logs, only, False, on_running=recorder.running, keep=keep, before=swaps)
        recorder.ended(0, "", interrupted=False)
    except (PoprunError, KeyboardInterrupt) as exc:
        code = report_error(exc)
        reason = str(exc) if isinstance(exc, PoprunError) else "interrupted"
        recorder.ended(code, reason, interrupted=isinstance(exc, Interrupted | KeyboardInterrupt))
    finally:
        if extra.get("down"):
            _take_down(extra["down"], recorder)


def _take_down(spec_path: str, recorder: Recorder) -> None:
    """``--detach --down``: remove the cluster once the job is over."""
    from poprun_py.cli import report_error
    from poprun_py.cli.onekey import take_down
    from poprun_py.errors import PoprunError
    from poprun_py.jobs.supervisor import launch_options, spec_here
    from poprun_py.prepare.specfile import load_cluster

    try:
        spec = load_cluster(spec_here(recorder, spec_path, "down") or spec_path)
        take_down(spec, launch_options(recorder))
    except PoprunError as exc:
        report_error(exc)
