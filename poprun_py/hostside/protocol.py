"""The agent protocol, specified once: what poprun-py and the per-host agent
(:mod:`poprun_py.hostside.agent`) say to each other over the agent's SSH channel, one record a line.
Both sides use these names; the agent ships alone, so this module (plain assignments only, the
standard library's Python 3.7) is inlined into its source in place of its import
(:mod:`poprun_py.hostside.bundle`).

poprun-py to the agent (its stdin):

1. any number of requests, each answered ``R {json}`` before the next is read:
   ``run {json}`` (preflight's checks: ``argv``, ``timeout``, ``env``, ``cwd``, ``stdin``;
   answered with ``code``, ``stdout``, ``stderr``, ``timeout``) and ``put {json}`` (``files``:
   ``path``/``text`` objects written mode 0600, as the MPI backends stage a job; answered with
   ``error``, '' when all went well);
2. ``job {json}``: the host's part of the job (``files``, ``instances`` -- ``index``, ``argv``,
   ``env``, ``cwd``, and ``cpus``/``mems`` when bound -- and the timings);
3. control lines: ``h`` (heartbeat), ``term`` (SIGTERM now, SIGKILL after the grace period),
   ``stop`` (the same, because the job failed or was interrupted: nothing follows the job, so the
   agent does not linger after it), ``kill`` (SIGKILL now), ``sig N`` (signal N to every running
   instance's process group, and nothing else: SIGUSR1/SIGUSR2 forwarded by poprun-py), ``sigr N``
   (signal N to the ranks of every running instance, an MPICH daemon relayed
   (:mod:`poprun_py.agent.relay`): each rank wrapper's process group, never the daemon, which would
   die of SIGUSR2), ``dump F`` (a hung job's stacks: ``py-spy dump`` of every running instance's
   Python processes where py-spy is on the agent's PATH, sent as that instance's stderr lines;
   SIGUSR1 to the others among ``F``, the comma-separated indexes that registered faulthandler,
   ``-`` for none), ``dump-ranks`` (the same for an MPI daemon's ranks, relayed: ``py-spy dump`` of
   every Python process of the instances' trees, each filed under its rank from its environment,
   ``s``/``w`` records, then ``y IDX none`` for each running instance, which ends the answer; no
   SIGUSR1: the launcher decides), ``pause`` (poprun-py is about to be stopped, Ctrl-Z: its
   silence does not count until its next line). End of input means poprun-py is gone: stop
   everything.

The agent to poprun-py (its stdout), about the job::

    h              heartbeat, after ``heartbeat`` seconds without any other record
    p IDX PID      instance IDX started; PID is also its process group and session id
    o IDX TEXT     one line of its stdout (e: stderr), without the newline
    x IDX CODE     it exited with CODE          k IDX SIG   it was killed by signal SIG
    f IDX TEXT     it could not be started (TEXT says why)
    n IDX TEXT     it was not started: the agent was told to stop first
    y IDX HOW      its stacks were dumped (after ``dump``): HOW is py-spy, faulthandler or none
    s RANK TEXT    one line of rank RANK's stacks (after ``dump-ranks``, before the ``y``)
    w RANK HOW     rank RANK was found and dumped (HOW py-spy) or not (none), before the ``y``
    d              every instance has ended and nothing is left; the agent exits
    d linger       the same, and the agent serves requests again until its stdin ends (its
                   header said ``linger``, and its part succeeded: no instance failed by
                   itself, none was not started, no ``stop`` came)

Example:

    >>> record(EXITED, 3, 0)
    b'x 3 0'
    >>> parse(b"o 3 hello world")
    (b'o', 3, b'hello world')
    >>> dump_line(frozenset({2, 0})), dump_indexes(dump_line(frozenset()))
    (b'dump 0,2', set())
"""

# the agent's Python may be 3.7: annotations stay strings
from __future__ import annotations

REQUEST_RUN = b"run"
REQUEST_PUT = b"put"
REPLY = b"R"
JOB = b"job"

HEARTBEAT_LINE = b"h"
TERM_LINE = b"term"
STOP_LINE = b"stop"  # term, because the job failed or was interrupted: no linger after it
KILL_LINE = b"kill"
PAUSE_LINE = b"pause"  # poprun-py stops (Ctrl-Z): no silence limit until its next line
SIGNAL_LINE = b"sig"  # ``sig N``
SIGNAL_RANKS_LINE = b"sigr"  # ``sigr N``
DUMP_LINE = b"dump"  # ``dump F``
DUMP_RANKS_LINE = b"dump-ranks"

STARTED = b"p"
STDOUT = b"o"
STDERR = b"e"
EXITED = b"x"
KILLED = b"k"
FAILED = b"f"
NOT_STARTED = b"n"
STACKS = b"y"
RANK_STACK = b"s"
RANK_DUMPED = b"w"
DONE = b"d"
DONE_LINGERING = b"d linger"  # the job is over and the agent serves requests again
INSTANCE_RECORDS = frozenset(
    (STARTED, STDOUT, STDERR, EXITED, KILLED, FAILED, NOT_STARTED, STACKS, RANK_STACK, RANK_DUMPED)
)
STACKS_PYSPY = b"py-spy"  # HOW in ``y IDX HOW``
STACKS_FAULTHANDLER = b"faulthandler"
STACKS_NONE = b"none"


HEARTBEAT_HOSTS = 64
"""Up to this many hosts, the heartbeat is the one asked for; past it, it grows with the
number of hosts (:func:`heartbeat_for`)."""


def heartbeat_for(hosts: int, heartbeat: float, liveness: float) -> float:
    """The heartbeat for a job on ``hosts`` hosts: ``heartbeat`` up to
    :data:`HEARTBEAT_HOSTS` hosts, then in proportion to the hosts (so poprun-py's side sends
    and reads about as many heartbeats a second as at 64 hosts: 1,024 agents at 0.5 s were
    4,096 lines a second), never past a quarter of ``liveness`` (a host is still heard several
    times before its silence counts) nor below ``heartbeat``.

    >>> [heartbeat_for(hosts, 0.5, 180.0) for hosts in (8, 64, 256, 1024)]
    [0.5, 0.5, 2.0, 8.0]
    >>> heartbeat_for(1024, 0.5, 8.0), heartbeat_for(1024, 0.5, 1.0)  # --host-timeout 8, 1
    (2.0, 0.5)
    """
    scaled = heartbeat * hosts / HEARTBEAT_HOSTS
    return max(heartbeat, min(scaled, liveness / 4))


def dump_line(faulthandler: frozenset[int]) -> bytes:
    """The ``dump F`` control line for the instances in ``faulthandler``."""
    return DUMP_LINE + b" " + (b",".join(b"%d" % i for i in sorted(faulthandler)) or b"-")


def dump_indexes(line: bytes) -> set[int]:
    """The indexes of a ``dump F`` control line (the inverse of :func:`dump_line`)."""
    return {int(i) for i in line[len(DUMP_LINE) + 1 :].split(b",") if i.isdigit()}


def record(kind: bytes, index: int, value: int | bytes) -> bytes:
    """One instance record: ``KIND IDX VALUE`` (VALUE an int, or bytes)."""
    tail = value if isinstance(value, bytes) else b"%d" % value
    return b"%s %d %s" % (kind, index, tail)


def parse(line: bytes) -> tuple[bytes, int, bytes]:
    """An instance record as (kind, index, rest); index -1 when the line is no such record."""
    kind, _, rest = line.partition(b" ")
    number, _, text = rest.partition(b" ")
    if kind not in INSTANCE_RECORDS or not number.isdigit():
        return kind, -1, rest
    return kind, int(number), text
