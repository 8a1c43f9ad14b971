"""``poprun-py check``: the planned instances, with their binding and environment, run a short
real check (:mod:`poprun_py.hostside.check_instance`) through the launch's own backend; their
reports become one line per host and a fault for every host that is broken or slow (exit 3).

A host is broken when one of its instances could not reach ``MASTER_ADDR:MASTER_PORT``, did not
complete the all-reduce, does not see its planned devices, or gave no report. It is slow when its
latency is over ``SLOW_FACTOR`` times the hosts' median (and over ``SLOW_LATENCY_MS``), or its
bandwidth under the median divided by ``SLOW_FACTOR`` (and under ``SLOW_BANDWIDTH_MBPS``).
When every instance but rank 0's failed to reach it, rank 0's host is named.

Example:

    >>> from poprun_py.prepare.job import LaunchOptions, prepare
    >>> prep = prepare(LaunchOptions(hosts="localhost", instances=2, program=("x",)), environ={})
    >>> report = run_check(prep)
    >>> [(h.host, h.ok) for h in report.hosts], report.faults
    ([('localhost', True)], [])

With spares, every host that fails is swapped for one, until the check passes:

    >>> opts = LaunchOptions(hosts="h1,h2", spare_hosts="s1,s2", program=("x",))
    >>> prep = prepare(opts, environ={})
    >>> bad = {"h2": "instance 1: cannot reach MASTER_ADDR", "s1": "instance 1: no report"}
    >>> swapped = swap_failing(prep, lambda p: {h.name: bad[h.name] for h in p.plan.hosts
    ...                                         if h.name in bad})
    >>> swapped.lines()
    ['check: spare host s2 in place of h2 (instance 1: cannot reach MASTER_ADDR)', \
'check: spare host s1 failed the check (instance 1: no report): not used']
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.errors import Fault, PreflightError
from poprun_py.hostside.bundle import from_env, payload

if TYPE_CHECKING:
    from poprun_py.backends.base import Backend
    from poprun_py.core.plan import LaunchPlan
    from poprun_py.core.result import LaunchResult
    from poprun_py.prepare.job import LongRun, Prepared

log = logging.getLogger("poprun_py.launch")
CheckHosts = Callable[["Prepared"], Mapping[str, str]]
"""Runs the check on a prepared job: every host that failed it and why, in plan order."""
Show = Callable[["CheckReport"], None] | None
"""Gets each check's report (the CLI prints its table)."""
MARK = "POPRUN-CHECK"
CHECK_VAR = "POPRUN_CHECK_PROGRAM"
"""Where :mod:`poprun_py.hostside.check_instance` ships (``bundle.from_env``): a secret's way,
never in an argv or a printed command; a host needs only a Python, nothing of poprun-py."""
DEFAULT_TIMEOUT = 5.0
SLOW_FACTOR = 10.0
SLOW_LATENCY_MS = 1.0
SLOW_BANDWIDTH_MBPS = 100.0


@dataclass(frozen=True)
class HostCheck:
    """One host's figures (the worst of its instances) and what went wrong there."""

    host: str
    instances: int
    latency_ms: float | None
    bandwidth_mbps: float | None
    devices: str
    problems: tuple[str, ...] = ()
    gloo: str = "-"  # torch Gloo all-reduce: ok, failed, n/a (no torch), - (not asked)

    @property
    def ok(self) -> bool:
        """No problem found on this host."""
        return not self.problems


@dataclass(frozen=True)
class CheckReport:
    """Every host's check, in plan order, and how long the check took."""

    hosts: tuple[HostCheck, ...]
    seconds: float = 0.0

    @property
    def faults(self) -> list[Fault]:
        """One fault per problem, naming its host."""
        return [Fault(h.host, "check", p) for h in self.hosts for p in h.problems]


def check_argv(prep: Prepared, timeout: float, torch: bool = False) -> tuple[str, ...]:
    """The check program: the spec's ``defaults.python``, else this interpreter (the same path on
    every host, as for Slurm's batch step; preflight says where it is missing), running
    :mod:`poprun_py.hostside.check_instance`."""
    python = prep.plan.cluster.defaults.python or sys.executable
    torch_args = ("--torch", "1") if torch else ()
    return from_env(python, CHECK_VAR, "--timeout", f"{timeout:g}", *torch_args)


def check_prep(prep: Prepared, timeout: float = DEFAULT_TIMEOUT, torch: bool = False) -> Prepared:
    """The prepared job with the check program in place of the user's, its source in the
    instances' environment (:data:`CHECK_VAR`)."""
    from poprun_py.core.spec import EnvVar
    from poprun_py.prepare.job import LongRun

    env = (*prep.plan.env, EnvVar(CHECK_VAR, payload("check_instance").text, secret=True))
    plan = replace(prep.plan, program=check_argv(prep, timeout, torch), env=env)
    return replace(prep, plan=plan, long_run=LongRun())  # once, no spares, no clocks


def run_check(
    prep: Prepared,
    timeout: float = DEFAULT_TIMEOUT,
    torch: bool = False,
    backend: Backend | None = None,
) -> CheckReport:
    """Launch the check on every planned instance (through ``backend``, default the plan's)
    and judge the reports."""
    from poprun_py.launch import launcher
    from poprun_py.process.output import remove_job_dir

    lines: list[str] = []
    lock = threading.Lock()

    def sink(index: int, stream: str, line: str) -> None:
        if line.startswith(MARK + " "):
            with lock:
                lines.append(line)
        elif stream == "stderr":
            sys.stderr.write(f"[check:{index}] {line.rstrip()}\n")

    started = time.monotonic()
    checked = check_prep(prep, timeout, torch)
    result = launcher.launch(checked, launcher.RunSettings(sink=sink), backend=backend)
    if result.job_dir:  # a failed check's files (the report says what failed): not kept
        remove_job_dir(result.job_dir)
    report = judge(checked.plan, parse_lines(lines), result)
    return replace(report, seconds=time.monotonic() - started)


def parse_lines(lines: list[str]) -> dict[int, dict[str, Any]]:
    """Rank -> report, from ``POPRUN-CHECK {json}`` lines (others ignored)."""
    reports: dict[int, dict[str, Any]] = {}
    for line in lines:
        _, _, text = line.partition(" ")
        try:
            report = json.loads(text)
            reports[int(report["rank"])] = report
        except (ValueError, KeyError, TypeError):
            continue
    return reports


def judge(
    plan: LaunchPlan, reports: dict[int, dict[str, Any]], result: LaunchResult | None = None
) -> CheckReport:
    """Per host: the worst figures of its instances, and its problems (see the module)."""
    outcome = {r.index: r for r in result.instances} if result is not None else {}
    problems: dict[str, list[str]] = {h.name: [] for h in plan.hosts}
    culprits = {i for i in range(plan.num_instances) if _own_fault(reports.get(i))}
    for inst in plan.instances:
        rep = reports.get(inst.index)
        if rep is None:
            end = outcome.get(inst.index)
            why = f" (exit code {end.code}{': ' + end.detail if end.detail else ''})" if end else ""
            problems[inst.host].append(f"instance {inst.index} gave no report{why}")
        elif inst.index in culprits or not set(rep.get("missing", ())) <= culprits:
            problems[inst.host].append(f"instance {inst.index}: {rep.get('error', 'failed')}")
    _blame_master(plan, reports, problems)
    hosts = [_host(plan, h.name, h.instances, reports, problems[h.name]) for h in plan.hosts]
    _mark_slow(hosts)
    return CheckReport(tuple(hosts))


def _own_fault(rep: dict[str, Any] | None) -> bool:
    """No report, or a failure of its own (not only others missing from the all-reduce)."""
    return rep is None or (not rep.get("ok") and not rep.get("missing"))


def _blame_master(
    plan: LaunchPlan, reports: dict[int, dict[str, Any]], problems: dict[str, list[str]]
) -> None:
    """When no instance but rank 0's reached MASTER_ADDR, the fault is likely rank 0's host."""
    others = [r for i, r in reports.items() if i != 0]
    if len(plan.hosts) > 2 and others and all("cannot reach" in r.get("error", "") for r in others):
        first = plan.hosts[0].name
        problems[first].append(f"no other host reaches MASTER_ADDR {plan.master_addr} on {first}")


def _host(
    plan: LaunchPlan,
    name: str,
    ids: tuple[int, ...],
    reports: dict[int, dict[str, Any]],
    problems: list[str],
) -> HostCheck:
    mine = [reports[i] for i in ids if i in reports]
    latency = [float(r["latency_ms"]) for r in mine if "latency_ms" in r]
    bandwidth = [float(r["bandwidth_MBps"]) for r in mine if "bandwidth_MBps" in r]
    devices = ";".join(str(r.get("devices", "")) for r in mine if r.get("devices"))
    gloo = {r.get("gloo") for r in mine if "gloo" in r}
    return HostCheck(
        name,
        len(ids),
        max(latency) if latency else None,
        min(bandwidth) if bandwidth else None,
        devices or "-",
        tuple(problems),
        gloo="-" if not gloo else "n/a" if gloo == {None} else "ok" if gloo == {True} else "failed",
    )


def _mark_slow(hosts: list[HostCheck]) -> None:
    lat = [h.latency_ms for h in hosts if h.latency_ms is not None]
    bw = [h.bandwidth_mbps for h in hosts if h.bandwidth_mbps is not None]
    if len(lat) < 2:
        return
    mid_lat, mid_bw = statistics.median(lat), statistics.median(bw) if bw else None
    for k, h in enumerate(hosts):
        slow = []
        if h.latency_ms is not None and h.latency_ms > max(SLOW_FACTOR * mid_lat, SLOW_LATENCY_MS):
            slow.append(f"slow: latency {h.latency_ms:.3f} ms (median {mid_lat:.3f} ms)")
        bw_floor = min(mid_bw / SLOW_FACTOR, SLOW_BANDWIDTH_MBPS) if mid_bw else 0.0
        if h.bandwidth_mbps is not None and h.bandwidth_mbps < bw_floor:
            slow.append(f"slow: bandwidth {h.bandwidth_mbps:.0f} MB/s (median {mid_bw:.0f} MB/s)")
        if slow:
            hosts[k] = replace(h, problems=(*h.problems, *slow))


def report_dict(report: CheckReport) -> dict[str, Any]:
    """The report as ``check --format json`` prints it: every host's figures and problems."""
    hosts = [
        {
            "host": h.host,
            "instances": h.instances,
            "latency_ms": h.latency_ms,
            "bandwidth_mbps": h.bandwidth_mbps,
            "devices": h.devices,
            "gloo": h.gloo,
            "ok": h.ok,
            "problems": list(h.problems),
        }
        for h in report.hosts
    ]
    return {"ok": not report.faults, "seconds": round(report.seconds, 3), "hosts": hosts}


def report_lines(report: CheckReport) -> list[str]:
    """The per-host table the CLI prints."""
    from poprun_py.core.views import table_lines

    rows = [
        [
            h.host,
            str(h.instances),
            f"{h.latency_ms:.3f}" if h.latency_ms is not None else "-",
            f"{h.bandwidth_mbps:.0f}" if h.bandwidth_mbps is not None else "-",
            h.devices,
            h.gloo,
            "ok" if h.ok else "; ".join(h.problems),
        ]
        for h in report.hosts
    ]
    columns = ("host", "instances", "latency ms", "MB/s", "devices", "gloo", "check")
    bad = sum(not h.ok for h in report.hosts)
    summary = f"check: {len(report.hosts) - bad}/{len(report.hosts)} host(s) ok in "
    return [*table_lines(columns, rows), summary + f"{report.seconds:.2f} s"]


def failing_hosts(
    prep: Prepared,
    timeout: float = DEFAULT_TIMEOUT,
    torch: bool = False,
    backend: Backend | None = None,
    show: Show = None,
) -> dict[str, str]:
    """Run the check (``show`` gets its report); every planned host that failed it and why: its
    problems, or its preflight fault when the check could not start there."""
    try:
        report = run_check(prep, timeout, torch, backend)
    except PreflightError as exc:
        faults = {f.host: f"{f.check}: {f.detail}" for f in reversed(exc.faults)}
        failed = {h.name: faults[h.name] for h in prep.plan.hosts if h.name in faults}
        if not failed:
            raise
        return failed
    if show is not None:
        show(report)
    return {h.host: "; ".join(h.problems) for h in report.hosts if not h.ok}


@dataclass(frozen=True)
class Swap:
    """A planned host that failed the check, the spare in its place, and the check's problem."""

    host: str
    spare: str
    why: str


@dataclass(frozen=True)
class Swapped:
    """The job on hosts that passed the check, the swaps made, and the spares that failed."""

    prep: Prepared
    swaps: tuple[Swap, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()  # (spare, why): not used

    def lines(self) -> list[str]:
        """One line per swap and per spare not used (the launch's summary)."""
        return [
            f"check: spare host {s.spare} in place of {s.host} ({s.why})" for s in self.swaps
        ] + [
            f"check: spare host {h} failed the check ({why}): not used" for h, why in self.rejected
        ]

    def record(self) -> dict[str, Any]:
        """The plan the launch starts with, saying which host replaced which and why."""
        from poprun_py.core.views import plan_dict

        return {
            "replaced": {s.host: s.spare for s in self.swaps},
            "why": {s.host: s.why for s in self.swaps},
            "spares_failed": dict(self.rejected),
            "plan": plan_dict(self.prep.plan),
        }

    def write(self, output_dir: str) -> Path:
        """``plan-check.json`` in ``output_dir`` (:meth:`record`)."""
        path = Path(output_dir) / "plan-check.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.record(), indent=1) + "\n", encoding="utf-8")
        return path

    def keep(self, output_dir: str | None) -> list[str]:
        """:meth:`write` when a host was swapped or a spare failed (and ``output_dir`` is
        given); the summary's :meth:`lines`."""
        if output_dir and (self.swaps or self.rejected):
            self.write(output_dir)
        return self.lines()

    def choices(self) -> dict[str, Any]:
        """What the check decided, as JSON (a detached job's record): :func:`replay` makes
        the same job of the same options again."""
        long_run = self.prep.long_run
        return {
            "replaced": {s.host: s.spare for s in self.swaps},
            "why": {s.host: s.why for s in self.swaps},
            "spares_failed": dict(self.rejected),
            "check_timeout": long_run.check_timeout,
            "check_torch": long_run.check_torch,
        }


def check_and_swap(
    prep: Prepared, timeout: float, torch: bool = False, show: Show = None
) -> Swapped:
    """``launch --check`` with spares, attached or detached: :func:`swap_failing` with the
    check (``show`` gets each check's report), and the job made of its choices
    (:func:`replay`), told to check a spare before a restart uses it."""
    check = functools.partial(failing_hosts, timeout=timeout, torch=torch, show=show)
    choices = swap_failing(prep, check).choices()
    return replay(prep, {**choices, "check_timeout": timeout, "check_torch": torch})


def replay(prep: Prepared, choices: Mapping[str, Any]) -> Swapped:
    """``prep`` as the check left it (:meth:`Swapped.choices`): each spare in the place of the
    host it replaced, the spares that failed dropped, and a spare checked before a restart uses
    it. The one way both an attached launch and a detached job's supervisor (which plans the
    job again from its options) make the job they run."""
    from poprun_py.prepare.job import with_hosts_replaced

    replaced, why = dict(choices["replaced"]), dict(choices["why"])
    rejected = dict(choices["spares_failed"])
    prep = with_hosts_replaced(prep, replaced)
    long_run = replace(
        prep.long_run,
        spares=tuple(s for s in prep.long_run.spares if s.name not in rejected),
        check_timeout=choices["check_timeout"],
        check_torch=bool(choices["check_torch"]),
    )
    swaps = tuple(Swap(host, spare, why[host]) for host, spare in replaced.items())
    return Swapped(replace(prep, long_run=long_run), swaps, tuple(rejected.items()))


def spare_check(long_run: LongRun) -> CheckHosts | None:
    """The check a spare passes before it replaces a lost host in a restart (with ``--check``:
    ``long_run.check_timeout`` set), else None."""
    if long_run.check_timeout is None:
        return None
    timeout, torch = long_run.check_timeout, long_run.check_torch
    return functools.partial(failing_hosts, timeout=timeout, torch=torch)


def swap_failing(prep: Prepared, check: CheckHosts) -> Swapped:
    """Check; put a spare (in order) in the place of every host that failed (in plan order);
    check again, until the check passes. A spare that fails is not used: the next one takes
    its place. PreflightError (exit 3) naming the hosts that failed when no spare is left."""
    from poprun_py.prepare.job import with_hosts_replaced

    origin: dict[str, str] = {}  # a spare in place -> the planned host it stands for
    why: dict[str, str] = {}
    rejected: dict[str, str] = {}
    while failed := check(prep):
        bad = [h.name for h in prep.plan.hosts if h.name in failed]
        spares = [s.name for s in prep.long_run.spares]
        for host in bad:
            if host in origin:
                rejected[host] = failed[host]
                log.warning(
                    "check: spare host %s failed the check (%s): not used", host, failed[host]
                )
            else:
                why[host] = failed[host]
        if not bad or len(bad) > len(spares):
            raise _no_spare_left(failed, bad, len(spares), origin, why)
        replaced = dict(zip(bad, spares, strict=False))
        for host, spare in replaced.items():
            origin[spare] = first = origin.pop(host, host)
            log.warning(
                "check: spare host %s takes the place of host %s (%s)", spare, first, why[first]
            )
        prep = with_hosts_replaced(prep, replaced)
    placed = [h.name for h in prep.plan.hosts if h.name in origin]  # in plan order
    swaps = tuple(Swap(origin[s], s, why[origin[s]]) for s in placed)
    return Swapped(prep, swaps, tuple(rejected.items()))


def _no_spare_left(
    failed: Mapping[str, str],
    bad: list[str],
    spares: int,
    origin: Mapping[str, str],
    why: Mapping[str, str],
) -> PreflightError:
    """The planned hosts that failed the check (with the spares that failed in their place),
    and that no spare is left for them."""
    if not bad:
        return PreflightError([Fault(h, "check", w) for h, w in failed.items()])
    left = f"{spares} spare host(s) left for {len(bad)}" if spares else "no spare host left"
    faults = []
    for host in bad:
        first = origin.get(host, host)
        tried = f"; spare host {host} failed too: {failed[host]}" if host in origin else ""
        faults.append(Fault(first, "check", f"{why[first]}{tried} ({left})"))
    return PreflightError(faults)
