"""``--network`` inside a Slurm allocation: one step, a task per node, runs the hardware
discovery snippet (:data:`poprun_py.core.hardware.DISCOVERY_SCRIPT`) and names its node
(``SLURMD_NODENAME``); each node's interface in the network is then the plan's, and a node with
no address in it is a preflight fault (exit 3).

Example:

    >>> text = ("0: host n1\\n0: 2: eth0    inet 198.18.0.11/24 scope global eth0\\n"
    ...         "1: host n2\\n1: 2: eth0    inet 198.18.0.12/24 scope global eth0\\n")
    >>> found = per_node(text)
    >>> sorted(found), found["n2"].interface_in("198.18.0.0/24")
    (['n1', 'n2'], ('eth0', '198.18.0.12'))
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING

from poprun_py.core.hardware import DISCOVERY_SCRIPT, Hardware, parse_discovery
from poprun_py.errors import Fault, PreflightError

if TYPE_CHECKING:
    from poprun_py.prepare.job import Prepared

SCRIPT = 'echo "host $SLURMD_NODENAME"; poprun_discover "" 1'
TIMEOUT = 60.0


def per_node(text: str) -> dict[str, Hardware]:
    """Node name -> what its task found, from ``srun --label`` output."""
    tasks: dict[str, list[str]] = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            tasks.setdefault(label.strip(), []).append(rest)
    found = {}
    for lines in tasks.values():
        if lines and lines[0].startswith("host "):
            found[lines[0][5:].strip()] = parse_discovery("\n".join(lines[1:]))
    return found


def node_interfaces(prep: Prepared, environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Each node's (interface, address) in ``--network``; PreflightError for nodes with none."""
    plan, network = prep.plan, prep.plan.network
    assert network is not None
    names = [h.name for h in plan.hosts]
    argv = [
        "srun", "--label", f"--nodes={len(names)}", f"--ntasks={len(names)}",
        "--ntasks-per-node=1", f"--nodelist={','.join(names)}", "--job-name=poprun-discover",
        "sh", "-c", "poprun_discover() {" + DISCOVERY_SCRIPT + "}\n" + SCRIPT,
    ]  # fmt: skip
    try:
        out = subprocess.run(
            argv, env={**os.environ, **environ}, capture_output=True, text=True,
            timeout=TIMEOUT, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError([Fault("localhost", "network", f"srun discovery: {exc}")]) from None
    found = per_node(out.stdout)
    interfaces, faults = {}, []
    for name in names:
        hw = found.get(name)
        iface = hw.interface_in(network) if hw is not None else None
        if iface is not None:
            interfaces[name] = iface
        elif hw is None:
            detail = (out.stderr.strip().splitlines() or ["no answer"])[-1]
            faults.append(Fault(name, "network", f"discovery step gave nothing: {detail}"))
        else:
            has = hw.describe_addresses()
            faults.append(Fault(name, "network", f"no address in {network} (has: {has})"))
    if faults:
        raise PreflightError(faults)
    return interfaces
