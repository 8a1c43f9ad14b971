"""Preflight inside a Slurm allocation: one step, a task per node, runs preflight's check script
(:data:`poprun_py.preflight.probes.CHECK_SCRIPT`: working directory, program, numactl, the NUMA
topology, GPUs, RDMA NICs and interfaces) and names its node (``SLURMD_NODENAME``). Each node's
answer is parsed as an SSH host's is (:func:`~poprun_py.preflight.probes.parse_check_output`), so
``--network`` picks each node's interface and every node's faults come at once (exit 3, nothing
started). The step overlaps (``--overlap``) any step already running in the allocation, so it
never waits for CPUs another step holds. When every node's topology is declared and there is no
``--network`` it checks only the working directory and the program (``discover=False``).

A discovered topology is the whole node's. The plan binds instances and gives them devices
from it only where the job holds every CPU of the node (``scontrol show job -d``'s ``CPU_IDs``
per node: an ``--exclusive`` allocation, or one asking for all of them): binding to CPUs
another job holds would fail. Elsewhere a warning says so, and srun places the tasks itself, as
without discovery.

Example:

    >>> per_node("0: host n1\\n0: wd 1\\n1: host n2\\n1: wd 0\\n")
    {'n1': 'wd 1', 'n2': 'wd 0'}
    >>> held_cpus("JobId=7 NumCPUs=6 Nodes=n[1-2] CPU_IDs=0-1 Mem=0 Nodes=n3 CPU_IDs=0,2 Mem=0")
    {'n1': 2, 'n2': 2, 'n3': 2}
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from poprun_py.backends.slurm_alloc import CLIENT_TIMEOUT, cancel_steps, client
from poprun_py.core.hosts import expand_names
from poprun_py.core.topology import TopologyError, parse_cpulist
from poprun_py.errors import BackendError, Fault, PreflightError, UsageError
from poprun_py.preflight.probes import (
    CHECK_SCRIPT,
    HostReport,
    PreflightReport,
    checks_argv,
    checks_for_plan,
    parse_check_output,
)

if TYPE_CHECKING:
    from poprun_py.core.plan import LaunchPlan

TASK = 'echo "host $SLURMD_NODENAME"; exec sh -c "$0" "$@"'
"""Each task names its node, then runs the check script (its ``$0``) with the checks' arguments."""
TIMEOUT = 60.0
_NODE_CPUS = re.compile(r"\bNodes=(\S+) CPU_IDs=(\S+)")


def needs_discovery(plan: LaunchPlan) -> bool:
    """Whether preflight must ask the nodes: a node without a declared topology, or a network."""
    return bool(plan.network) or any(h.spec.topology is None for h in plan.hosts)


def per_node(text: str) -> dict[str, str]:
    """Node name -> what its task wrote after its name, from ``srun --label`` output."""
    tasks: dict[str, list[str]] = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            tasks.setdefault(label.strip(), []).append(rest)
    return {
        lines[0].split()[1]: "\n".join(lines[1:])
        for lines in tasks.values()
        if lines and lines[0].startswith("host ") and len(lines[0].split()) > 1
    }


def held_cpus(text: str) -> dict[str, int]:
    """How many CPUs the job holds on each node, from ``scontrol show job -d -o JOB``."""
    held: dict[str, int] = {}
    for nodes, ids in _NODE_CPUS.findall(text):
        try:
            count = len(parse_cpulist(ids))
            held.update(dict.fromkeys(expand_names(nodes, "Slurm node"), count))
        except (TopologyError, UsageError):
            continue
    return held


def job_cpus(job_id: str, environ: Mapping[str, str]) -> dict[str, int]:
    """:func:`held_cpus` of job ``job_id``; {} when scontrol cannot say."""
    argv = ["scontrol", "show", "job", "-d", "-o", job_id]
    try:
        return held_cpus(client(argv, {**os.environ, **environ}, CLIENT_TIMEOUT))
    except BackendError:
        return {}


def discover_nodes(
    plan: LaunchPlan, environ: Mapping[str, str], job_id: str, *, discover: bool = True
) -> PreflightReport:
    """Every node's report from one step (topologies only of the nodes the job holds whole;
    without ``discover``, only the working directory, the program and numactl are checked);
    PreflightError with every node's faults."""
    names = [h.name for h in plan.hosts]
    checks = replace(checks_for_plan(plan), within_allowed=False)  # compared with `held`
    if not discover:
        checks = replace(checks, topology=False, hardware=False)
    step = f"poprun-preflight-{secrets.token_hex(4)}"  # this launch's alone: cancelled by name
    argv = [
        "srun", "--overlap", "--label", f"--nodes={len(names)}", f"--ntasks={len(names)}",
        "--ntasks-per-node=1", f"--nodelist={','.join(names)}", f"--job-name={step}",
        "--cpu-bind=none", "sh", "-c", TASK, CHECK_SCRIPT,
        *checks_argv(checks, bool(checks.numactl_hosts))[3:],
    ]  # fmt: skip
    code, out, err = _run_step(argv, {**os.environ, **environ}, step)
    found = per_node(out)
    if not found:
        detail = (err.strip().splitlines() or [f"exit {code}, no answer"])[-1]
        raise PreflightError([Fault("localhost", "srun", f"preflight step failed: {detail}")])
    held = job_cpus(job_id, environ) if discover else {}
    hosts, faults, warnings, shared = [], [], [], []
    for name in names:
        if name not in found:
            faults.append(Fault(name, "checks", "no answer from its preflight task"))
            hosts.append(HostReport(name))
            continue
        host_faults, report = parse_check_output(name, checks, found[name])
        faults += host_faults
        topo = report.topology
        if discover and topo is None:
            warnings.append(f"{name}: NUMA topology could not be discovered")
        elif discover and topo is not None and (held.get(name) or 0) < len(topo.cpus):
            shared.append(f"{name} ({held.get(name) or '?'} of {len(topo.cpus)})")
            report = HostReport(name, hardware=report.hardware, numactl=report.numactl)
        hosts.append(report)
    if faults:
        raise PreflightError(faults)
    if shared:
        warnings.append(
            "the allocation holds only some CPUs of node(s) " + ", ".join(shared)
            + ": their discovered NUMA binding and devices are not used (allocate whole nodes,"
            " e.g. --exclusive, or declare their topology in the spec)"
        )  # fmt: skip
    return PreflightReport(tuple(hosts), (), tuple(warnings))


def _run_step(argv: list[str], env: dict[str, str], step: str) -> tuple[int, str, str]:
    """Run the step; on timeout (or an interruption) kill srun and cancel the step by its name,
    so that nothing of it is left in the allocation, then PreflightError (or re-raise)."""
    try:
        proc = subprocess.Popen(
            argv, env=env, text=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    except OSError as exc:
        raise PreflightError([Fault("localhost", "srun", f"preflight step: {exc}")]) from None
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except BaseException as exc:
        proc.kill()
        proc.communicate()
        with contextlib.suppress(BackendError):
            cancel_steps([step], env)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        why = f"preflight step: no answer in {TIMEOUT:g} s"
        raise PreflightError([Fault("localhost", "srun", why)]) from None
    return proc.returncode, out, err
