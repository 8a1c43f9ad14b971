"""Who this node is in per-node mode: its rank, the number of nodes, and the coordinator
(node 0) to join, from the flags or the environment a scheduler set.

Each value is taken from the first source that has it, in this order (docs/per-node.md):

1. the flags ``--node-rank``, ``--nnodes``, ``--coordinator HOST[:PORT]``;
2. ``POPRUN_NODE_RANK``, ``POPRUN_NNODES``, ``POPRUN_COORDINATOR``;
3. ``PET_NODE_RANK``, ``PET_NNODES``, ``PET_MASTER_ADDR`` (+ ``PET_MASTER_PORT``): Kubeflow;
4. ``JOB_COMPLETION_INDEX`` (a rank only): an Indexed Job or JobSet;
5. ``SLURM_NODEID``, ``SLURM_NNODES``, the first host of ``SLURM_JOB_NODELIST``;
6. ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``: one process per node of ``mpirun``.

Two sources that give different ranks (or node counts) are a conflict: one line, exit 2, as
is a value missing from every source, a rank out of range and a bad port. Pure: the
environment is a parameter.

Example:

    >>> env = {"SLURM_NODEID": "2", "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    >>> resolve_identity(None, None, None, env)
    NodeIdentity(rank=2, nnodes=4, coordinator='gpu07', port=29400, source='SLURM_NODEID')
    >>> split_address("[fd00::1]:7000"), split_address("10.0.0.5")
    (('fd00::1', 7000), ('10.0.0.5', 29400))
    >>> try:
    ...     resolve_identity(1, 2, "h1", {"PET_NODE_RANK": "0"})
    ... except UsageError as err:
    ...     print(err.exit_code, err)
    2 per-node: conflicting node ranks: 1 (--node-rank) and 0 (PET_NODE_RANK)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poprun_py.core.hosts import expand_names
from poprun_py.errors import HostExprError, UsageError

if TYPE_CHECKING:
    from poprun_py.core.plan import LaunchPlan

DEFAULT_PORT = 29400
"""The coordinator's TCP port when ``--coordinator`` names none (not MASTER_PORT's 29500)."""
JOIN_TIMEOUT = 120.0
"""``--join-timeout``'s default, in seconds."""

RANK_VARS = (
    "POPRUN_NODE_RANK",
    "PET_NODE_RANK",
    "JOB_COMPLETION_INDEX",
    "SLURM_NODEID",
    "OMPI_COMM_WORLD_RANK",
)
"""The variables a node rank is read from, in order (after ``--node-rank``)."""
NNODES_VARS = ("POPRUN_NNODES", "PET_NNODES", "SLURM_NNODES", "OMPI_COMM_WORLD_SIZE")
"""The variables the node count is read from, in order (after ``--nnodes``)."""
COORDINATOR_VARS = ("POPRUN_COORDINATOR", "PET_MASTER_ADDR", "SLURM_JOB_NODELIST")
"""The variables the coordinator is read from, in order (after ``--coordinator``);
``SLURM_JOB_NODELIST`` (or ``SLURM_NODELIST``) gives its first host."""


@dataclass(frozen=True)
class NodeIdentity:
    """This node's rank among ``nnodes``, the coordinator's host and port, and where the rank
    came from (a flag or a variable: ``--node-rank``, ``PET_NODE_RANK``...)."""

    rank: int
    nnodes: int
    coordinator: str
    port: int
    source: str
    nnodes_source: str = field(default="", compare=False, repr=False)
    coordinator_source: str = field(default="", compare=False, repr=False)

    @property
    def is_coordinator(self) -> bool:
        """Node 0 runs the coordinator as well as its own share."""
        return self.rank == 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` to dial (an IPv6 address in brackets)."""
        host = f"[{self.coordinator}]" if ":" in self.coordinator else self.coordinator
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class _Found:
    """One value and the flag or variable that gave it."""

    value: str
    source: str


def wanted(
    node_rank: int | None, nnodes: int | None, coordinator: str | None, per_node: bool
) -> bool:
    """Per-node mode is on when any of its flags is given (``--per-node``: all from the
    environment)."""
    return per_node or any(v is not None for v in (node_rank, nnodes, coordinator))


def resolve_identity(
    node_rank: int | None,
    nnodes: int | None,
    coordinator: str | None,
    environ: Mapping[str, str],
) -> NodeIdentity:
    """This node's identity from the flags (None: not given) and ``environ``, in the order of
    the module's docstring. UsageError (one line, exit 2): a value missing from every source
    (naming the variables tried), two sources with different ranks or node counts, a rank
    out of range, fewer than one node, a bad coordinator or port."""
    rank = _one("node rank", _flag("--node-rank", node_rank), _found(environ, RANK_VARS))
    count = _one("node count", _flag("--nnodes", nnodes), _found(environ, NNODES_VARS))
    where = _coordinator(coordinator, environ)
    rank_value = _integer(rank)
    count_value = _node_count(count)
    if count_value < 1:
        raise _fault(f"the node count must be at least 1, got {count_value} ({count.source})")
    if not 0 <= rank_value < count_value:
        raise _fault(
            f"node rank {rank_value} ({rank.source}) is out of range: {count_value} nodes have "
            f"ranks 0 to {count_value - 1}"
        )
    host, port = split_address(where.value, where.source)
    if where.source == "PET_MASTER_ADDR" and "PET_MASTER_PORT" in environ:
        port = parse_port(environ["PET_MASTER_PORT"], "PET_MASTER_PORT")
    return NodeIdentity(
        rank_value, count_value, host, port, rank.source, count.source, where.source
    )


def check_nnodes(identity: NodeIdentity, plan: LaunchPlan) -> None:
    """UsageError (one line, exit 2) unless the plan has one host per node."""
    hosts = [h.name for h in plan.hosts]
    if len(hosts) != identity.nnodes:
        shown = ",".join(hosts[:3]) + (",..." if len(hosts) > 3 else "")
        raise _fault(
            f"{identity.nnodes} nodes ({identity.nnodes_source or '--nnodes'}) but the plan has "
            f"{len(hosts)} hosts ({shown}): give one host per node"
        )


def split_address(text: str, source: str = "--coordinator") -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[IPV6]``, ``[IPV6]:PORT`` or a bare IPv6 address, as the
    host and the port (:data:`DEFAULT_PORT` when none is given). UsageError naming
    ``source`` for an empty host or a bad port."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise _fault(f"bad coordinator {text!r} ({source}): use HOST, HOST:PORT or [IPV6]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, None  # a name, or an IPv6 address without a port
    if not host or any(c.isspace() for c in host):
        raise _fault(f"bad coordinator {text!r} ({source}): no host")
    port = DEFAULT_PORT if port_text is None else parse_port(port_text, source)
    return host, port


def parse_port(text: str, source: str) -> int:
    """A TCP port from 1 to 65535; UsageError naming ``source`` otherwise."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise _fault(f"bad port {text!r} ({source}): a port is a number from 1 to 65535")
    return int(text)


def _flag(name: str, value: int | None) -> list[_Found]:
    return [] if value is None else [_Found(str(value), name)]


def _found(environ: Mapping[str, str], names: Sequence[str]) -> list[_Found]:
    return [_Found(environ[n].strip(), n) for n in names if environ.get(n, "").strip()]


def _one(what: str, flag: list[_Found], env: list[_Found]) -> _Found:
    """The first of the sources; UsageError when there is none or two of them differ."""
    given = [*flag, *env]
    if not given:
        flag_name = "--node-rank" if what == "node rank" else "--nnodes"
        names = RANK_VARS if what == "node rank" else NNODES_VARS
        raise _fault(f"no {what}: give {flag_name} or set one of {', '.join(names)}")
    first = given[0]
    key = _integer if what == "node rank" else _node_count
    for other in given[1:]:
        if key(first) != key(other):
            raise _fault(
                f"conflicting {what}s: {first.value} ({first.source}) and {other.value} "
                f"({other.source})"
            )
    return first


def _coordinator(flag: str | None, environ: Mapping[str, str]) -> _Found:
    if flag is not None and flag.strip():
        return _Found(flag, "--coordinator")
    for name in ("POPRUN_COORDINATOR", "PET_MASTER_ADDR"):
        if environ.get(name, "").strip():
            return _Found(environ[name], name)
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name, "").strip():
            return _Found(_first_host(environ[name], name), name)
    raise _fault(
        f"no coordinator: give --coordinator HOST[:PORT] or set one of "
        f"{', '.join(COORDINATOR_VARS)}"
    )


def _first_host(nodelist: str, source: str) -> str:
    try:
        return expand_names(nodelist, "Slurm node")[0]
    except HostExprError as exc:
        raise _fault(f"{source}: {exc}") from None


def _integer(found: _Found) -> int:
    try:
        return int(found.value)
    except ValueError:
        raise _fault(f"{found.source}={found.value!r} is not a whole number") from None


def _node_count(found: _Found) -> int:
    """A node count; Kubeflow's ``PET_NNODES`` may be ``MIN:MAX``, taken when the two agree."""
    low, colon, high = found.value.partition(":")
    if colon and low.strip() != high.strip():
        raise _fault(
            f"{found.source}={found.value!r} asks for an elastic node count; per-node mode "
            "runs a fixed number of nodes (MIN equal to MAX)"
        )
    return _integer(_Found(low, found.source))


def _fault(message: str) -> UsageError:
    return UsageError(f"per-node: {message}")
