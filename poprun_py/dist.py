"""The instance side: what a program started by poprun-py reads about its place in the job.

PopDist-like getters (``getNumTotalReplicas`` ...) with snake_case aliases, plus poprun-py's own
(``host_index``, ``shard_files``, ``replica_groups`` ...). Each reads the instance environment
that :func:`poprun_py.core.env.instance_env` sets and falls back to a single process when nothing is
set: 1 replica, 1 instance, index 0, no shard. This module imports only the standard library
(no typer, rich, jinja2, fabric, paramiko or pydantic), so it costs an instance next to nothing.

Example (in a training script):

    >>> import os
    >>> os.environ.update(POPDIST_NUM_TOTAL_REPLICAS="8", POPDIST_INSTANCE_INDEX="1")
    >>> getNumTotalReplicas(), instance_index(), isPopdistEnvSet(), getNumIpusPerReplica()
    (8, 1, True, 1)
    >>> for name in ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_INSTANCE_INDEX"):
    ...     del os.environ[name]
    >>> files = shard_files()  # this instance's input files; [] when run on its own
    >>> restart_count()  # 0 on the first attempt, k after the k-th restart (--max-restarts)
    0
    >>> heartbeat()  # progress for --hang-timeout; nothing happens outside poprun-py
    >>> checkpoint_signal(), on_checkpoint(lambda signum, frame: None)  # None: not under poprun-py
    (None, None)

Under poprun-py (``POPRUN_RESTART_COUNT`` set), importing this module registers
:mod:`faulthandler` for SIGUSR1 (chained to a handler the program set before; never to the
default action, which would end the program) and says so with one
line on stderr that poprun-py swallows: a hung job's stacks can then be dumped into its logs.
:func:`heartbeat` writes another such line (at most one every 0.1 s).
:func:`on_checkpoint` installs a handler for the signal that means "checkpoint now"
(``POPRUN_CHECKPOINT_SIGNAL``, the first of ``--forward-signals``: SIGUSR1 by default).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The names poprun_py.core.env.layout_env sets (tests/unit/test_dist.py checks they agree).
NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_INSTANCES = "POPDIST_NUM_INSTANCES"
INSTANCE_INDEX = "POPDIST_INSTANCE_INDEX"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
UNIFORM_REPLICAS = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
HOST_INDEX = "POPRUN_HOST_INDEX"
NUM_HOSTS = "POPRUN_NUM_HOSTS"
HOST_NAME = "POPRUN_HOST_NAME"
NUMA_NODES = "POPRUN_NUMA_NODES"
CPUS = "POPRUN_CPUS"
DEVICES = "POPRUN_DEVICES"
SHARD_FILE = "POPRUN_SHARD_FILE"
SHARD_PADDING = "POPRUN_SHARD_PADDING"
GROUP_SIZE = "POPRUN_GROUP_SIZE"
REPLICA_GROUPS = "POPRUN_REPLICA_GROUPS"
RESTART_COUNT = "POPRUN_RESTART_COUNT"
CHECKPOINT_SIGNAL = "POPRUN_CHECKPOINT_SIGNAL"

NAMES = (
    NUM_TOTAL_REPLICAS,
    NUM_INSTANCES,
    INSTANCE_INDEX,
    LOCAL_INSTANCE_INDEX,
    NUM_LOCAL_REPLICAS,
    REPLICA_INDEX_OFFSET,
    NUM_IPUS_PER_REPLICA,
    UNIFORM_REPLICAS,
    HOST_INDEX,
    NUM_HOSTS,
    HOST_NAME,
    NUMA_NODES,
    CPUS,
    DEVICES,
    SHARD_FILE,
    SHARD_PADDING,
    GROUP_SIZE,
    REPLICA_GROUPS,
    RESTART_COUNT,
    CHECKPOINT_SIGNAL,
)
"""Every variable this module reads."""

# The stderr lines poprun_py.process.progress swallows (tests/unit/test_dist.py checks they agree).
HEARTBEAT_LINE = b"\x1b[poprun-py:heartbeat]\n"
FAULTHANDLER_LINE = b"\x1b[poprun-py:faulthandler]\n"
STEP_LINE = b"\x1b[poprun-py:step %d]\n"
_beat = [0.0]
_step: list[int | None] = [None, None]  # the last step given, the last step told
_dumping = [False]  # faulthandler registered for SIGUSR1 (see _register_faulthandler)


# PopDist's camelCase names come first; the snake_case aliases follow them.


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def _ints(name: str) -> tuple[int, ...]:
    value = os.environ.get(name, "")
    return tuple(int(part) for part in value.split(",") if part.strip())


def isPopdistEnvSet() -> bool:
    """True when the program runs under a launcher that set the PopDist variables."""
    return NUM_TOTAL_REPLICAS in os.environ


def getNumTotalReplicas() -> int:
    """Replicas in the whole job (1 when unset)."""
    return _int(NUM_TOTAL_REPLICAS, 1)


def getNumInstances() -> int:
    """Instances in the whole job (1 when unset)."""
    return _int(NUM_INSTANCES, 1)


def getInstanceIndex() -> int:
    """This instance's index in the job (0 when unset)."""
    return _int(INSTANCE_INDEX, 0)


def getLocalInstanceIndex() -> int:
    """This instance's index on its host (0 when unset)."""
    return _int(LOCAL_INSTANCE_INDEX, 0)


def getNumLocalReplicas() -> int:
    """Replicas this instance drives (1 when unset)."""
    return _int(NUM_LOCAL_REPLICAS, 1)


def getReplicaIndexOffset() -> int:
    """Index of this instance's first replica (0 when unset)."""
    return _int(REPLICA_INDEX_OFFSET, 0)


def getNumIpusPerReplica() -> int:
    """Devices per replica (1 when unset)."""
    return _int(NUM_IPUS_PER_REPLICA, 1)


num_total_replicas = getNumTotalReplicas
num_instances = getNumInstances
instance_index = getInstanceIndex
local_instance_index = getLocalInstanceIndex
num_local_replicas = getNumLocalReplicas
replica_index_offset = getReplicaIndexOffset
num_devices_per_replica = getNumIpusPerReplica
is_popdist_env_set = isPopdistEnvSet


def host_index() -> int:
    """Index of this instance's host (0 when unset)."""
    return _int(HOST_INDEX, 0)


def num_hosts() -> int:
    """Hosts in the job (1 when unset)."""
    return _int(NUM_HOSTS, 1)


def host_name() -> str:
    """The plan's name of this instance's host ('' when unset)."""
    return os.environ.get(HOST_NAME, "")


def numa_nodes() -> tuple[int, ...]:
    """NUMA nodes this instance is bound to (empty when unbound)."""
    return _ints(NUMA_NODES)


def cpus() -> tuple[int, ...]:
    """CPUs this instance is bound to (empty when unbound)."""
    return _ints(CPUS)


def devices() -> tuple[int, ...]:
    """Devices this instance drives (empty when none)."""
    return _ints(DEVICES)


def shard_files() -> list[str]:
    """This instance's input files, in order (padding included); [] without a shard file."""
    path = os.environ.get(SHARD_FILE, "")
    if not path:
        return []
    text = Path(path).read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line]


def shard_padding() -> int:
    """How many trailing entries of :func:`shard_files` repeat earlier ones as padding."""
    return _int(SHARD_PADDING, 0)


def group_size() -> int:
    """Replicas per communication group (``--group-size``; all replicas when unset)."""
    return _int(GROUP_SIZE, getNumTotalReplicas())


def replica_groups() -> tuple[int, ...]:
    """Indices of the groups this instance's replicas belong to (empty when no groups)."""
    return _ints(REPLICA_GROUPS)


def restart_count() -> int:
    """The attempt this instance belongs to: 0, or k after the k-th restart of the whole job
    (``--max-restarts``); a program resumes from its checkpoint when it is above 0."""
    return _int(RESTART_COUNT, 0)


def heartbeat(step: int | None = None) -> None:
    """Tell poprun-py this instance makes progress (``--hang-timeout``) without printing:
    one line on stderr that poprun-py swallows, at most every 0.1 s; nothing when the program
    was not started by poprun-py. Cheap enough to call every step.

    With ``step`` (the training step just done) poprun-py also learns how far the job got:
    ``--min-progress`` stops restarting an attempt that got no further than the last one, and
    the summary lists each attempt's last step. The last step given is told at exit too."""
    if RESTART_COUNT not in os.environ:
        return
    import time

    now = time.monotonic()
    if step is not None and _step[0] is None:
        import atexit

        atexit.register(_tell_step)
    if step is not None:
        _step[0] = int(step)
    if now - _beat[0] >= 0.1:
        _beat[0] = now
        if step is None:
            _write_stderr(HEARTBEAT_LINE)
        else:
            _write_stderr(_step_line(int(step)))
            _step[1] = int(step)


def _step_line(step: int) -> bytes:
    return STEP_LINE % step


def _tell_step() -> None:
    """At exit: the last step, if a later one than last told was given meanwhile."""
    if _step[0] is not None and _step[0] != _step[1]:
        _write_stderr(_step_line(_step[0]))


def _write_stderr(line: bytes) -> None:
    try:  # noqa: SIM105 - contextlib costs an import
        os.write(2, line)
    except OSError:
        pass


def checkpoint_signal() -> int | None:
    """The signal that means "checkpoint now" (``POPRUN_CHECKPOINT_SIGNAL``: the first of
    ``--forward-signals``, SIGUSR1 by default), as a number; None outside poprun-py or when
    this system has no such signal."""
    import signal

    name = os.environ.get(CHECKPOINT_SIGNAL, "").strip().upper()
    value = getattr(signal, name, None) if name.startswith("SIG") else None
    return int(value) if isinstance(value, int) else None


def on_checkpoint(handler: Callable[[int, Any], object]) -> int | None:
    """Call ``handler(signum, frame)`` (as :func:`signal.signal` would) when poprun-py passes
    on the checkpoint signal (:func:`checkpoint_signal`); main thread only. Returns the signal
    number, or None (nothing installed) outside poprun-py. For SIGUSR1 the stack dump that
    this module registered stays (a hung job's stacks): it runs first, then ``handler``."""
    import signal

    signum = checkpoint_signal()
    if signum is None:
        return None
    dumping = signum == getattr(signal, "SIGUSR1", None) and _dumping[0]
    if dumping:
        import faulthandler

        faulthandler.unregister(signum)  # back to the old disposition, then chained to ours
    signal.signal(signum, handler)
    if dumping:
        faulthandler.register(signum, all_threads=True, chain=True)
    return signum


def _register_faulthandler() -> None:
    """Under poprun-py: SIGUSR1 dumps every thread's stack on stderr (chained), announced."""
    import faulthandler
    import signal
    import sys

    if RESTART_COUNT not in os.environ or not hasattr(signal, "SIGUSR1") or sys.stderr is None:
        return
    previous = signal.getsignal(signal.SIGUSR1)
    # chain=True over the default action would re-raise SIGUSR1 and kill the program
    chain = previous not in (signal.SIG_DFL, None)
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=chain)
    except (RuntimeError, ValueError, OSError, AttributeError):
        return
    _dumping[0] = True
    _write_stderr(FAULTHANDLER_LINE)


_register_faulthandler()
