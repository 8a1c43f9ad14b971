"""Text views of a plan: the topology one host a line (:func:`host_lines`), the summary, the
per-instance table, all within a width (:func:`plan_lines`, what ``plan`` prints), PopRun's
pipe-drawn topology picture (:func:`topology_lines`, kept for callers of the library), and the
plan JSON of docs/running.md ("Plan JSON"). Pure functions returning strings and dicts; the CLI
prints them.

Example:

    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.hosts import parse_hosts
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("t",), 4, 2))
    >>> print("\\n".join(topology_lines(plan)))
    | hosts     |       h1      |
    | instances |   0   |   1   |
    | replicas  | 0 | 1 | 2 | 3 |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from poprun_py.core import look
from poprun_py.core.env import hardware_env
from poprun_py.core.look import table_lines
from poprun_py.core.plan import HostPlan, InstancePlan, LaunchPlan, network_choice
from poprun_py.core.topology import format_cpulist

MAX_CELLS = 32
HOST_LIMIT = 64
"""Hosts shown one a line by :func:`host_lines`; the rest are counted (the JSON has them all)."""

__all__ = [
    "INSTANCE_COLUMNS",
    "fitted_lines",
    "folded_ints",
    "hardware_lines",
    "host_lines",
    "instance_lines",
    "instance_row",
    "plan_dict",
    "plan_lines",
    "summary_lines",
    "table_lines",
    "topology_lines",
]


def _span(cells: list[tuple[str, int]]) -> str:
    """Render cells given as (text, width) centred in their widths, separated by ``|``."""
    return "|".join(text.center(width) for text, width in cells)


def _ranges(first: int, count: int) -> str:
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def folded_ints(values: Sequence[int]) -> str:
    """``values`` in their order, each run of three or more consecutive ones as a range.

    >>> folded_ints([0, 1, 2, 3, 4, 5, 6, 7]), folded_ints([0, 1]), folded_ints([5, 1, 2, 3, 9])
    ('0-7', '0,1', '5,1-3,9')
    """
    parts: list[str] = []
    start = 0
    for k in range(1, len(values) + 1):
        if k < len(values) and values[k] == values[k - 1] + 1:
            continue
        run = values[start:k]
        parts += [f"{run[0]}-{run[-1]}"] if len(run) > 2 else [str(v) for v in run]
        start = k
    return ",".join(parts)


def topology_lines(plan: LaunchPlan) -> list[str]:
    """PopRun's ``--print-topology`` table: hosts / instances / replicas, each cell spanning its
    children. Large plans fold replicas into ranges per instance, then instances per host."""
    per_instance = plan.replicas_per_instance
    fold_replicas = plan.num_replicas > MAX_CELLS
    fold_instances = plan.num_instances > MAX_CELLS
    if fold_instances:
        leaves = [
            (
                _ranges(h.instances[0], len(h.instances)),
                _ranges(h.instances[0] * per_instance, len(h.instances) * per_instance),
            )
            for h in plan.hosts
        ]
        rows = {"instances": [[a] for a, _ in leaves], "replicas": [[b] for _, b in leaves]}
    else:
        rows = {
            "instances": [[str(i) for i in h.instances] for h in plan.hosts],
            "replicas": [
                _replica_cells(plan.instances[i], fold_replicas)
                for h in plan.hosts
                for i in h.instances
            ],
        }
    return _layout(plan, rows, fold_instances)


def _replica_cells(inst: InstancePlan, fold: bool) -> list[str]:
    if fold:
        return [_ranges(inst.replica_offset, inst.num_local_replicas)]
    return [str(inst.replica_offset + k) for k in range(inst.num_local_replicas)]


def _layout(plan: LaunchPlan, rows: dict[str, list[list[str]]], folded: bool) -> list[str]:
    leaves = [cell for group in rows["replicas"] for cell in group]
    widths = [len(c) + 2 for c in leaves]
    if folded:
        inst_widths = widths
    else:
        inst_widths, k = [], 0
        for group in rows["replicas"]:
            inst_widths.append(sum(widths[k : k + len(group)]) + len(group) - 1)
            k += len(group)
    inst_cells = [c for group in rows["instances"] for c in group]
    inst_widths = [max(w, len(c) + 2) for w, c in zip(inst_widths, inst_cells, strict=True)]
    host_widths, stretched, k = [], [], 0
    for h, group in zip(plan.hosts, rows["instances"], strict=True):
        mine = inst_widths[k : k + len(group)]
        k += len(group)
        width = max(sum(mine) + len(mine) - 1, len(h.name) + 2)  # a long name widens its cells
        host_widths.append(width)
        stretched += _stretch(mine, width)
    inst_widths = stretched
    hosts = [(h.name, w) for h, w in zip(plan.hosts, host_widths, strict=True)]
    label = "{:<9}".format
    leaf_widths = _leaf_widths(widths, inst_widths, rows, folded)
    return [
        f"| {label('hosts')} |{_span(hosts)}|",
        f"| {label('instances')} |{_span(list(zip(inst_cells, inst_widths, strict=True)))}|",
        f"| {label('replicas')} |{_span(list(zip(leaves, leaf_widths, strict=True)))}|",
    ]


def _leaf_widths(
    widths: list[int], inst_widths: list[int], rows: dict[str, list[list[str]]], folded: bool
) -> list[int]:
    """Stretch the replica cells so they fill their instance cell exactly."""
    if folded:
        return inst_widths
    result: list[int] = []
    k = 0
    for group, total in zip(rows["replicas"], inst_widths, strict=True):
        result += _stretch(widths[k : k + len(group)], total)
        k += len(group)
    return result


def _stretch(widths: list[int], total: int) -> list[int]:
    """Cells of ``widths`` (joined by ``|``) widened to fill ``total`` exactly, the first ones
    taking the remainder."""
    extra = total - (sum(widths) + len(widths) - 1)
    return [w + extra // len(widths) + (j < extra % len(widths)) for j, w in enumerate(widths)]


def plan_lines(plan: LaunchPlan, width: int = look.PIPED_WIDTH, colour: bool = False) -> list[str]:
    """What ``plan`` (and ``--dry-run``, ``--print-topology``) prints, no line wider than
    ``width``: the topology one host a line, the summary, the instance and hardware tables
    (their headers bold with ``colour``)."""
    head = ["poprun-py topology", *host_lines(plan, width), *wrapped(summary_lines(plan), width)]
    hardware = hardware_lines(plan, width=width)[1:]  # after its blank line
    tables = [instance_lines(plan, width=width), *([hardware] if hardware else [])]
    lines = [look.clip(line, width) for line in head]  # even where the headers alone are wider
    for k, table in enumerate(tables):
        cut = [look.clip(line, width) for line in table]
        lines += [*([""] if k else []), *look.bold_header(cut, colour)]
    return lines


def host_lines(
    plan: LaunchPlan, width: int = look.PIPED_WIDTH, limit: int = HOST_LIMIT
) -> list[str]:
    """The topology folded per host, ranges throughout, fields aligned from host to host::

        h1: instances 0-7 | NUMA 0-1 | CPUs 0-63 | GPUs 0-3 | replicas 0-31

    At most ``limit`` hosts (then "… N more hosts"); where aligned fields would be wider than
    ``width`` each line stands alone, and is cut to ``width`` (ending in "…") as a last resort.

    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.core.hosts import parse_hosts
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1,h2")), JobSpec(("t",), 8, 4))
    >>> print("\\n".join(host_lines(plan, limit=1)))
    h1: instances 0-1 | NUMA - | CPUs - | devices - | replicas 0-3
    … 1 more hosts (--format json)
    """
    rows = [_host_fields(plan, h) for h in plan.hosts[:limit]]
    names = [f"{h.name}:" for h in plan.hosts[:limit]]
    lines = _aligned(names, rows)
    if max(map(len, lines), default=0) > width:  # unaligned, then cut, rather than too wide
        lines = [f"{name} {' | '.join(row)}" for name, row in zip(names, rows, strict=True)]
    lines = [look.clip(line, width) for line in lines]
    if len(plan.hosts) > limit:
        lines.append(look.more_line(len(plan.hosts) - limit, "hosts", "--format json"))
    return lines


def _aligned(names: list[str], rows: list[list[str]]) -> list[str]:
    """Host lines whose fields line up from host to host."""
    name_width = max(map(len, names), default=0)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))] if rows else []
    return [
        f"{name.ljust(name_width)} "
        + " | ".join(f.ljust(w) for f, w in zip(row, widths, strict=True)).rstrip()
        for name, row in zip(names, rows, strict=True)
    ]


def _host_fields(plan: LaunchPlan, host: HostPlan) -> list[str]:
    insts = [plan.instances[i] for i in host.instances]
    kind = host.topology.device_kind if host.topology else None
    devices = "GPUs" if kind in ("nvidia", "amd") else "devices"
    replicas = [
        r for i in insts for r in range(i.replica_offset, i.replica_offset + i.num_local_replicas)
    ]
    return [
        f"instances {_folded(host.instances)}",
        f"NUMA {_folded([n for i in insts for n in i.numa_nodes])}",
        f"CPUs {_folded([c for i in insts for c in i.cpus])}",
        f"{devices} {_folded([d for i in insts for d in i.devices])}",
        f"replicas {_folded(replicas)}",
    ]


def _folded(values: Sequence[int]) -> str:
    """``values`` as ranges (``0-7,16``), ``-`` when none; one run is told at once."""
    if not values:
        return "-"
    ordered = sorted(set(values))
    if ordered[-1] - ordered[0] + 1 == len(ordered):  # the usual case: one run
        return _ranges(ordered[0], len(ordered))
    return format_cpulist(ordered)


def wrapped(lines: Sequence[str], width: int) -> list[str]:
    """Prose lines wrapped to ``width`` at spaces, continuations indented by two.

    >>> wrapped(["note: binding would change nothing on node01"], 24)
    ['note: binding would', '  change nothing on', '  node01']
    """
    import textwrap

    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        out += textwrap.wrap(
            line, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=True
        ) or [""]
    return out


def instance_row(plan: LaunchPlan, inst: InstancePlan) -> list[str]:
    """One row of the per-instance table."""
    shard = inst.shard
    real = len(shard.files) - shard.padding  # as the bytes beside it, padding excluded
    files = f"{real} + {shard.padding} pad" if shard.padding else str(real)
    return [
        str(inst.index),
        inst.host,
        str(inst.local_index),
        _ranges(inst.replica_offset, inst.num_local_replicas),
        format_cpulist(inst.numa_nodes) or "-",
        format_cpulist(inst.cpus) or "-",
        format_cpulist(inst.devices) or "-",
        folded_ints(inst.groups) or "-",
        files,
        _human(shard.bytes),
    ]


def fitted_lines(
    columns: tuple[str, ...], rows: list[list[str]], width: int, shrink: int
) -> list[str]:
    """:func:`table_lines` at most ``width`` wide where it can be: only column ``shrink`` gives
    way -- its cells are cut (ending in "…") down to its header's width, and it is left out
    when even that is too wide. The other columns stay whole, so a line is wider than
    ``width`` when they alone are.

    >>> fitted_lines(("id", "hosts"), [["job-1", "node[01-16]"]], 13, shrink=1)
    ['id     hosts', 'job-1  node[…']
    >>> fitted_lines(("id", "hosts"), [["job-1", "node[01-16]"]], 8, shrink=1)
    ['id', 'job-1']
    """
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over <= 0:
        return table_lines(columns, rows)
    if widths[shrink] - over < len(columns[shrink]):
        drop = [*columns[:shrink], *columns[shrink + 1 :]]
        return table_lines(tuple(drop), [[*r[:shrink], *r[shrink + 1 :]] for r in rows])
    room = widths[shrink] - over
    return table_lines(
        columns, [[*r[:shrink], _cut(r[shrink], room), *r[shrink + 1 :]] for r in rows]
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def instance_lines(plan: LaunchPlan, limit: int = 64, width: int | None = None) -> list[str]:
    """The per-instance table, at most ``limit`` rows (the JSON has them all), fitted to
    ``width`` when given (instance and host stay whole)."""
    rows = [instance_row(plan, inst) for inst in plan.instances[:limit]]
    if width is None:
        lines = table_lines(INSTANCE_COLUMNS, rows)
    else:
        lines = look.fit_table(INSTANCE_COLUMNS, rows, width, keep=2)
    if len(plan.instances) > limit:
        lines.append(f"... and {len(plan.instances) - limit} more instances (--format json)")
    return lines


def hardware_lines(plan: LaunchPlan, limit: int = 64, width: int | None = None) -> list[str]:
    """Each instance's device, NIC and network variables (none: no lines), fitted to
    ``width`` when given."""
    envs = [hardware_env(plan, inst) for inst in plan.instances[:limit]]
    names = list(dict.fromkeys(n for env in envs for n in env))
    if not names:
        return []
    rows = [
        [str(inst.index), inst.host, *(env.get(n, "-") or "''" for n in names)]
        for inst, env in zip(plan.instances, envs, strict=False)
    ]
    columns = ("instance", "host", *names)
    if width is None:
        return ["", *table_lines(columns, rows)]
    return ["", *look.fit_table(columns, rows, width, keep=2)]


INSTANCE_COLUMNS = (
    "instance",
    "host",
    "local",
    "replicas",
    "NUMA",
    "CPUs",
    "devices",
    "groups",
    "files",
    "bytes",
)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def summary_lines(plan: LaunchPlan) -> list[str]:
    """A few lines stating the sizes and where the defaults came from."""
    lines = [
        f"{plan.num_replicas} replicas on {plan.num_instances} instances "
        f"({plan.instances_source}) on {len(plan.hosts)} host(s); "
        f"{plan.replicas_per_instance} replica(s) per instance, "
        f"{plan.devices_per_replica} device(s) per replica",
    ]
    sources = sorted({h.topology_source for h in plan.hosts})
    lines.append(
        f"topology: {', '.join(sources)}; NUMA-aware: {'yes' if plan.numa_aware else 'no'}"
    )
    if plan.group_size:
        where = "cross hosts" if plan.groups_cross_hosts else "stay within hosts"
        lines.append(f"replica groups of {plan.group_size}: {where}")
    lines.append(f"network: {network_choice(plan)}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines


def plan_dict(plan: LaunchPlan) -> dict[str, Any]:
    """The plan JSON (docs/running.md, "Plan JSON")."""
    return {
        "num_replicas": plan.num_replicas,
        "num_instances": plan.num_instances,
        "instances_source": plan.instances_source,
        "devices_per_replica": plan.devices_per_replica,
        "numa_aware": plan.numa_aware,
        "group_size": plan.group_size,
        "groups_cross_hosts": plan.groups_cross_hosts,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "program": list(plan.program),
        "notes": list(plan.notes),
        "network": plan.network,
        "network_choice": network_choice(plan),
        "device_env": plan.device_env,
        "nic_affinity": plan.nic_affinity,
        "hosts": [
            {
                "index": h.index,
                "name": h.name,
                "address": h.spec.target,
                "slots": h.spec.slots,
                "topology_source": h.topology_source,
                "device_kind": h.topology.device_kind if h.topology else None,
                "interface": list(plan.interfaces[h.name]) if h.name in plan.interfaces else None,
                "numa_nodes": [
                    {
                        "id": n.id,
                        "cpus": list(n.cpus),
                        "devices": list(n.devices),
                        "nics": list(n.nics),
                        **({"memory": n.memory} if n.memory is not None else {}),
                    }
                    for n in (h.topology.numa_nodes if h.topology else ())
                ],
                "instances": list(h.instances),
            }
            for h in plan.hosts
        ],
        "instances": [_instance_dict(plan, i) for i in plan.instances],
    }


def _instance_dict(plan: LaunchPlan, inst: InstancePlan) -> dict[str, Any]:
    return {
        "hardware_env": hardware_env(plan, inst),
        "index": inst.index,
        "host": inst.host,
        "host_index": inst.host_index,
        "local_index": inst.local_index,
        "num_local_instances": inst.num_local_instances,
        "replica_offset": inst.replica_offset,
        "num_local_replicas": inst.num_local_replicas,
        "numa_nodes": list(inst.numa_nodes),
        "cpus": list(inst.cpus),
        "devices": list(inst.devices),
        "groups": list(inst.groups),
        "shard": {
            "files": list(inst.shard.files),
            "bytes": inst.shard.bytes,
            "padding": inst.shard.padding,
        },
    }
