"""``poprun-py plan``, ``render`` and ``launch``: one option set, three depths of the same flow.

``plan`` stops at the plan (table or JSON), ``render`` at the commands, ``launch`` runs them
(``launch --dry-run`` prints plan and commands and starts nothing).

Example:

    $ poprun-py plan --hosts h1,h2 --replicas 8 --instances 4 train.py
    $ poprun-py plan -c clusters/pod16.yaml --format json train.py | jq .instances[0]
    $ poprun-py launch -c clusters/local-2.yaml python examples/train.py --steps 20
"""

import contextlib
import functools
import gc
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import typer

from poprun_py.cli import long_run as lr
from poprun_py.cli import onekey, option_model
from poprun_py.cli import options as o
from poprun_py.cli.app import PROGRAM_CONTEXT, app
from poprun_py.cli.examples import epilog
from poprun_py.core.backends import capabilities
from poprun_py.errors import UsageError
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend
    from poprun_py.core.plan import LaunchPlan
    from poprun_py.core.result import LaunchResult
    from poprun_py.jobs.record import JobRecord
    from poprun_py.launch.check import CheckReport, Swapped


_RETAINED: list[object] = []
"""Plans kept until the process ends: main() exits with os._exit, so a plan of a million input
files is released with the process instead of one object at a time."""


_OUTPUT = ("fmt", "dry_run", "output_dir", "only_output_from_instance")


def _command(mode: str) -> Callable[..., None]:
    """Build the command function for ``mode`` (plan | render | launch); same options for all."""

    @o.takes(mode)
    def command(ctx: typer.Context, **given: Any) -> None:  # every option of o.OPTIONS
        fmt, dry_run, output_dir, only = (given[k] for k in _OUTPUT)
        opts = option_model.launch_options(ctx.params)  # every field, by its name
        if fmt not in ("table", "json"):
            raise UsageError(f"--format must be table or json, got {fmt!r}")
        if mode == "launch" and not opts.program:
            raise UsageError("launch needs a PROGRAM to run")
        if only is not None and only < 0:
            raise UsageError("--only-output-from-instance must be 0 or more")
        one_key = onekey.OneKey(given["up"], given["down"], given["yes"], given["detach"])
        _only_rendered(mode, opts.backend)
        with onekey.cycle(opts, one_key, mode, dry_run) as opts:
            prep = prepare(opts)
            _RETAINED.append(prep)  # freed with the process, not object by object
            gc.freeze()  # the plan lives as long as the process: keep the collector off it
            if mode == "plan":
                show_plan(prep.plan, fmt)
                return
            _only_rendered(mode, prep.backend)
            values = option_model.option_values(ctx.params, opts)
            if mode == "render" or dry_run:
                batch = functools.partial(option_model.batch_argv, values)
                _show_rendered(prep, fmt, output_dir, mode == "launch", batch=batch, values=values)
                return
            checked = None
            if mode == "check" or given["check"]:
                checked = _check_first(mode, prep, given, one_key, fmt)
            if mode == "check":
                return
            prep, swaps, choices, checking = checked or (prep, [], None, None)
            if given["print_topology"]:
                show_plan(prep.plan, "table")
            sync = given["sync"] or one_key.up
            if one_key.detach:
                down = given["cluster"] if one_key.down else None
                cli = option_model.detached_cli(values)
                _detach(prep, fmt, output_dir, sync, down, cli=cli, check=choices)
                return
            keep = given["keep_job_dir"]
            _launch(
                prep, output_dir, only, sync, keep=keep, before=swaps, fmt=fmt, pre_check=checking
            )

    command.__name__ = mode
    command.__doc__ = {
        "plan": "Show the launch plan (hosts, instances, replicas, NUMA, devices, shards).",
        "render": "Show the launch commands the backend would run (secrets masked).",
        "launch": "Launch PROGRAM on every instance of the plan and wait for all of them.",
        "check": "Check the planned instances: MASTER_ADDR reached, an all-reduce, devices, "
        "latency and bandwidth per host (exit 3 naming slow or broken hosts). PROGRAM is not run.",
    }[mode]
    return command


def _only_rendered(mode: str, backend: str | None) -> None:
    """Refuse ``launch``/``check`` of a backend that is only rendered (k8s), in one line."""
    if mode not in ("plan", "render") and capabilities(backend).renders_manifest:
        from poprun_py.render.k8s import not_launched

        raise UsageError(not_launched(str(backend)))


def _show_manifest(prep: Prepared, values: "Mapping[str, Any]", fmt: str) -> None:
    """``render --backend k8s``: the manifest whose pods run ``launch --per-node`` (YAML; the
    same objects as one ``v1`` List for ``--format json``)."""
    from poprun_py.render import k8s

    request = k8s.Request(values["k8s_image"], values["k8s_kind"], values["k8s_name"])
    args = option_model.passed_on(k8s.pod_values(values, prep.plan), tuple(k8s.NOT_IN_THE_POD))
    restarts = prep.long_run.max_restarts
    text = k8s.render_manifest(prep.plan, request, args, restarts, prep.templates)
    if fmt == "json":
        items = k8s.manifest_objects(text)
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1) + "\n"
    sys.stdout.write(text)


def _per_node_wanted(opts: LaunchOptions) -> bool:
    """Per-node mode: ``--node-rank``, ``--nnodes``, ``--coordinator`` or ``--per-node``."""
    from poprun_py.pernode.identity import wanted

    return wanted(opts.node_rank, opts.nnodes, opts.coordinator, opts.per_node)


def _check_first(
    mode: str, prep: Prepared, given: Mapping[str, Any], one_key: onekey.OneKey, fmt: str
) -> "tuple[Prepared, list[str], Mapping[str, object] | None, tuple[float, bool] | None]":
    """``check``, or ``launch --check`` before the job: the job to run (with spares: on the
    hosts that passed), the swaps' lines, the choices a detached job's supervisor makes again
    (:func:`~poprun_py.launch.check.replay`), and in per-node mode the check that node 0 runs
    on the joined nodes before the job (:func:`_per_node_check`)."""
    stream = sys.stdout if mode == "check" else sys.stderr
    timeout, torch = given["check_timeout"], given["check_torch"]
    if mode == "launch" and _per_node_wanted(prep.options):
        sync = given["sync"] or one_key.up
        return prep, [], None, _per_node_check(prep, timeout, torch, one_key.detach, sync)
    if mode == "launch" and prep.long_run.spares:
        swapped = _check_and_swap(prep, timeout, torch)
        keep = [] if one_key.detach else swapped.keep(given["output_dir"])
        return swapped.prep, keep, swapped.choices(), None
    _check(prep, timeout, torch, stream, fmt if mode == "check" else "table")
    return prep, [], None, None


def _per_node_check(
    prep: Prepared, timeout: float, torch: bool, detach: bool, sync: bool
) -> tuple[float, bool] | None:
    """``launch --check`` in per-node mode. What it cannot do is refused first, on every node
    (exit 2: ``--sync``, spare hosts -- a failing check fails -- a bad identity or secret, a
    timeout of 0). Attached: the check's settings, for :func:`_launch` to check the joined
    nodes before the job, in the same round (one join). Detached: the check runs now, in a
    round of its own (its table on stderr), and None; the supervisors join again."""
    from poprun_py.pernode.node import checked_node

    if timeout <= 0:
        raise UsageError(f"--check-timeout must be more than 0, got {timeout}")
    checked_node(prep, sync=sync)
    if not detach:
        return timeout, torch
    _check(prep, timeout, torch, sys.stderr, "table")
    return None


def _check(
    prep: Prepared,
    timeout: float,
    torch: bool,
    stream: "TextIO",
    fmt: str,
    *,
    backend: "Backend | None" = None,
) -> None:
    """Run the check; print its table (or JSON); PreflightError (exit 3) naming every bad
    host. In per-node mode node 0 checks the joined nodes (``backend``) and prints the table;
    the other nodes serve it."""
    from poprun_py.cli.machine import check_dict
    from poprun_py.errors import PreflightError
    from poprun_py.launch.check import report_lines, run_check

    if timeout <= 0:
        raise UsageError(f"--check-timeout must be more than 0, got {timeout}")
    if backend is None and _per_node_wanted(prep.options):
        from poprun_py.pernode.node import launch_per_node

        def run(p: Prepared, joined: "Backend") -> None:
            _check(p, timeout, torch, stream, fmt, backend=joined)

        launch_per_node(prep, run)
        return
    with _warnings_to_stderr():
        report = run_check(prep, timeout, torch, backend)
    if fmt == "json":
        stream.write(json.dumps(check_dict(report), separators=(",", ":")) + "\n")
    else:
        stream.write("\n".join(report_lines(report)) + "\n")
    stream.flush()
    if report.faults:
        raise PreflightError(report.faults)


def _check_and_swap(prep: Prepared, timeout: float, torch: bool) -> "Swapped":
    """``launch --check`` with spares, attached or detached (:func:`check_and_swap`): every
    host that fails the check is swapped for a spare until the check passes (each check's
    table on stderr); the job, told to check a spare before a restart uses it, and the swaps.
    PreflightError (exit 3) when no spare is left."""
    from poprun_py.launch.check import check_and_swap, report_lines

    if timeout <= 0:
        raise UsageError(f"--check-timeout must be more than 0, got {timeout}")

    def show(report: "CheckReport") -> None:
        sys.stderr.write("\n".join(report_lines(report)) + "\n")
        sys.stderr.flush()

    with _warnings_to_stderr():
        return check_and_swap(prep, timeout, torch, show=show)


for _mode in ("plan", "render", "launch", "check"):
    app.command(_mode, context_settings=PROGRAM_CONTEXT, epilog=epilog(_mode))(_command(_mode))


def show_plan(plan: "LaunchPlan", fmt: str) -> None:
    """Print the plan: PopRun's topology table, a summary and the per-instance table, or JSON."""
    from poprun_py.core import views as display

    if fmt == "json":
        json.dump(display.plan_dict(plan), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
        return
    from poprun_py.core import look

    width, colour = look.output_width(sys.stdout), look.use_colour(sys.stdout)
    look.write_lines(sys.stdout, display.plan_lines(plan, width, colour))


def _show_rendered(
    prep: Prepared,
    fmt: str,
    output_dir: str | None,
    with_plan: bool,
    *,
    batch: "Callable[[bool], list[str]] | None" = None,
    values: "Mapping[str, Any] | None" = None,
) -> None:
    if capabilities(prep.backend).renders_manifest:  # launch --dry-run was refused before
        _show_manifest(prep, values or {}, fmt)
        return
    from poprun_py.backends import get_backend
    from poprun_py.launch import launcher
    from poprun_py.render.display import format_job, job_dict

    if not with_plan and fmt == "table":
        backend = get_backend(prep.backend)
        script = backend.batch_script(prep, batch) if batch is not None else None
        if script is not None:
            sys.stdout.write(script)
            return
    job = launcher.render_for_show(prep, output_dir)
    if fmt == "json":
        json.dump(job_dict(job), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if with_plan:
        show_plan(prep.plan, "table")
    sys.stdout.write(format_job(job, masked=True))
    if with_plan:
        sys.stderr.write("dry run: nothing was started\n")


def _detach(
    prep: Prepared,
    fmt: str,
    output_dir: str | None,
    sync: bool,
    down: str | None,
    *,
    cli: "Mapping[str, object] | None" = None,
    check: "Mapping[str, object] | None" = None,
) -> None:
    """``launch --detach``: the job goes to its supervisor; its id is the last line on stdout
    (``--format json``: an object with the id, hosts and where the logs are). ``cli``: the
    options that are not LaunchOptions fields and that the supervisor applies
    (:func:`option_model.detached_cli`); ``check``: the choices of ``--check`` with spares
    (:meth:`~poprun_py.launch.check.Swapped.choices`), made again by the supervisor."""
    from poprun_py.jobs.detach import DetachOptions, detach

    here = False
    if down is not None:
        from poprun_py.prepare.specfile import load_cluster

        provider = load_cluster(down).provider
        here = provider is not None and provider.kind == "local"
    with _warnings_to_stderr():
        options = DetachOptions(output_dir, sync, down, here, dict(cli or {}), check)
        record = detach(prep, options)
    sys.stderr.write(f"poprun-py: job {record.id}: {_detached_line(record)}\n")
    if fmt == "json":
        from poprun_py.jobs.record import log_locations

        info = {"id": record.id, "hosts": list(record.hosts), "supervisor": record.supervisor}
        json.dump({**info, **log_locations(record)}, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"{record.id}\n")
    sys.stdout.flush()


def _detached_line(record: "JobRecord") -> str:
    """What ``launch --detach`` says of the job it handed over (in per-node mode: of this
    node's part of it)."""
    node = record.options.get("per_node")
    follow = f"poprun-py logs --follow {record.id}"
    if node is not None and node["rank"]:
        return (
            f"node {node['rank']} of {node['nnodes']} joined the coordinator at "
            f"{node['coordinator']}, its part supervised on this machine; {follow} "
            "(node 0's job has every instance's output)"
        )
    where = "this machine" if record.supervisor == "localhost" else f"host {record.supervisor}"
    coordinating = "" if node is None else f", node 0 of {node['nnodes']} coordinating"
    return (
        f"{len(record.instances)} instance(s) running, supervised on {where}{coordinating}; "
        f"{follow}"
    )


def _launch(
    prep: Prepared,
    output_dir: str | None,
    only_from: int | None,
    sync: bool,
    on_running: "Callable[[int], None] | None" = None,
    *,
    keep: bool = False,
    before: "list[str] | None" = None,
    fmt: str = "table",
    backend: "Backend | None" = None,
    pre_check: tuple[float, bool] | None = None,
) -> None:
    """Run the job; the summary: ``before`` (the check's swaps), then each attempt (``fmt``
    json: one JSON object, the last line on stdout, in place of the table). In per-node mode
    (:mod:`poprun_py.pernode.node`), node 0 runs it on ``backend``, the joined nodes -- after
    the check (``pre_check``: its timeout and ``--check-torch``; its table on stderr, a failure
    every node's exit 3) -- the other nodes serve node 0 and exit with the job's code."""
    if backend is None and _per_node_wanted(prep.options):
        from poprun_py.pernode.node import launch_per_node

        def run(p: Prepared, joined: "Backend") -> None:
            if pre_check is not None:
                _check(p, *pre_check, sys.stderr, "table", backend=joined)
            _launch(p, output_dir, only_from, False, on_running, keep=keep, fmt=fmt, backend=joined)

        launch_per_node(prep, run, sync=sync, on_running=on_running)
        return
    from poprun_py.cli.machine import launch_dict
    from poprun_py.core.result import LastWords
    from poprun_py.errors import Interrupted, LaunchFailed
    from poprun_py.launch import launcher

    if only_from is not None and only_from >= prep.plan.num_instances:
        raise UsageError(
            f"--only-output-from-instance {only_from}: the plan has "
            f"{prep.plan.num_instances} instance(s)"
        )
    settings = launcher.RunSettings(
        output_dir=output_dir,
        only_output_from=only_from,
        sync=sync,
        on_running=on_running,
        keep_job_dir=keep,
        last_words=LastWords(),
    )
    from poprun_py.launch.check import spare_check

    check = spare_check(prep.long_run)  # --check: a spare passes it before a restart uses it
    with _warnings_to_stderr(), lr.announcing(sys.stderr):
        result = launcher.launch(prep, settings, backend, check=check)  # restarts told as they come
    tail = settings.last_words.lines if settings.last_words else {}
    attempts = [*(before or ()), *lr.attempt_lines(result)]
    if result.job_dir and not output_dir and os.path.isdir(result.job_dir):
        attempts.append(f"the job's files are kept in {result.job_dir}")  # else removed
    error = None if result.ok else lr.describe(result)
    if result.interrupted:
        from poprun_py.cli import interrupted_by

        error = interrupted_by("interrupted: every instance was stopped")
    if fmt == "json":
        _print_json(launch_dict(result, error, attempts, tail))
    elif error is not None or attempts:
        _print_summary(result if error is not None else None, attempts, tail)
    if result.interrupted:
        raise Interrupted(error or "interrupted", result)
    if error is not None:
        raise LaunchFailed(error, result.exit_code, result)


def _print_json(data: Mapping[str, object]) -> None:
    sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Print what the library logs as warnings (preflight's slow names, undiscovered
    topologies) on stderr, one line each, as they come: before the launch starts. The
    logging set-up is undone afterwards (the CLI also runs in-process, in tests)."""
    import logging

    logger = logging.getLogger("poprun_py")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("poprun-py: warning: %(message)s"))
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _print_summary(
    result: "LaunchResult | None", attempts: list[str], tail: "Mapping[int, str] | None" = None
) -> None:
    """The attempts, then the instance table (:func:`poprun_py.launch.summary.print_summary`;
    ``tail``: each instance's last stderr line, the detail of a failure the backend left
    without one)."""
    for line in attempts:
        sys.stderr.write(f"poprun-py: {line}\n")
    if result is None:
        return
    from poprun_py.launch.summary import print_summary

    print_summary(result, tail or {}, sys.stderr)
