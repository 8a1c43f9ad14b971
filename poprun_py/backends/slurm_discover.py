"""Preflight inside a Slurm allocation: one step, a task per node, runs preflight's check script
(:data:`poprun_py.launch.preflight.CHECK_SCRIPT`: working directory, program, numactl, the NUMA
topology, GPUs, RDMA NICs and interfaces) and names its node (``SLURMD_NODENAME``). Each node's
answer is parsed as an SSH host's is (:func:`~poprun_py.launch.preflight.parse_check_output`), so
the plan binds discovered topologies and devices, ``--network`` picks each node's interface, and
every node's faults come at once (exit 3, nothing started). The step is skipped when every node's
topology is declared and there is no ``--network``.

Example:

    >>> text = ("0: host n1\\n0: wd 1\\n1: host n2\\n1: wd 0\\n")
    >>> {name: lines for name, lines in per_node(text).items()}
    {'n1': 'wd 1', 'n2': 'wd 0'}
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING

from poprun_py.errors import Fault, PreflightError
from poprun_py.launch.preflight import (
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


def needs_discovery(plan: LaunchPlan) -> bool:
    """Whether preflight must ask the nodes: a node without a declared topology, or a network."""
    return bool(plan.network) or any(h.topology is None for h in plan.cluster.hosts)


def per_node(text: str) -> dict[str, str]:
    """Node name -> what its task wrote after its name, from ``srun --label`` output."""
    tasks: dict[str, list[str]] = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            tasks.setdefault(label.strip(), []).append(rest)
    return {
        lines[0][5:].strip(): "\n".join(lines[1:])
        for lines in tasks.values()
        if lines and lines[0].startswith("host ")
    }


def discover_nodes(plan: LaunchPlan, environ: Mapping[str, str]) -> PreflightReport:
    """Every node's report from one step; PreflightError with every node's faults."""
    names = [h.name for h in plan.hosts]
    checks = checks_for_plan(plan)
    argv = [
        "srun", "--label", f"--nodes={len(names)}", f"--ntasks={len(names)}",
        "--ntasks-per-node=1", f"--nodelist={','.join(names)}", "--job-name=poprun-preflight",
        "--cpu-bind=none", "sh", "-c", TASK, CHECK_SCRIPT,
        *checks_argv(checks, bool(checks.numactl_hosts))[3:],
    ]  # fmt: skip
    try:
        out = subprocess.run(
            argv, env={**os.environ, **environ}, capture_output=True, text=True,
            timeout=TIMEOUT, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError([Fault("localhost", "srun", f"preflight step: {exc}")]) from None
    found = per_node(out.stdout)
    hosts, faults, warnings = [], [], []
    for name in names:
        if name not in found:
            detail = (out.stderr.strip().splitlines() or ["no answer"])[-1]
            faults.append(Fault(name, "checks", f"preflight step gave nothing: {detail}"))
            hosts.append(HostReport(name))
            continue
        host_faults, report = parse_check_output(name, checks, found[name])
        faults += host_faults
        hosts.append(report)
        if report.topology is None:
            warnings.append(f"{name}: NUMA topology could not be discovered")
    if faults:
        raise PreflightError(faults)
    return PreflightReport(tuple(hosts), (), tuple(warnings))
