"""Stack dumps of running instances with ``py-spy dump``, for ``--hang-timeout``: used by the
local supervision and, inlined into its source, by the per-host agent
(:mod:`poprun_py.hostside.agent`), so it uses the standard library only (Python 3.7).

An instance may be a shell or a wrapper around the program: every process of its tree (its
root and the root's descendants, from ``/proc``) that runs a Python interpreter is dumped, all
in parallel, each ``py-spy dump`` killed after :data:`PYSPY_TIMEOUT` seconds. An instance
none of whose Python processes could be dumped (py-spy absent, no ptrace rights, no Python in
its tree, a timeout) gets None: the caller falls back to SIGUSR1 for faulthandler.

Under an MPI launcher the ranks are processes of a daemon's tree (orted, hydra_pmi_proxy, or
mpirun itself here): :func:`dump_ranks` dumps every Python process of the trees given and files
each dump under its rank, read from the process's environment (:data:`RANK_VARS`).

Under srun the tasks run under slurmstepd on the nodes: a step of the same allocation runs
:mod:`poprun_py.hostside.step_dump` on every node, with this module bundled.

MPICH's hydra dies of SIGUSR2, so poprun-py passes it (and SIGUSR1) to hydra's ranks itself:
:func:`signal_ranks` finds the ranks' wrappers (``/bin/sh -c REPORT poprun-rank ...``, see
``mpiexec.j2``; hydra starts each in a session of its own) in a daemon's tree and signals each
wrapper's process group, as hydra does with SIGUSR1; the wrapper traps both signals. A
wrapper found before its shell has run its ``trap`` (it would die of the signal) is signalled
by a thread once its ``SigCgt`` shows the trap (:func:`signal_when_trapped`), not dropped.

Example:

    >>> import os
    >>> dump_trees({0: os.getpid()}, None)  # no py-spy: nothing dumped
    {0: None}
    >>> python_processes(os.getpid())[:1] == [os.getpid()]  # doctests run under python
    True
    >>> dump_ranks({0: os.getpid()}, None), rank_of(os.getpid(), {"RANK": "3"})
    ({}, 3)
    >>> signal_ranks([os.getpid()], 0)  # no rank wrapper in this tree: nobody signalled
    0
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

from poprun_py.hostside.identity import identify, proc_table, same, subtree  # bundled with it

TYPE_CHECKING = False  # not typing's: the agent's start does not pay for importing it
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun_py.hostside.identity import Identity

PYSPY = "py-spy"
PYSPY_TIMEOUT = 1.25  # seconds for one py-spy dump; the dumps of a job run in parallel
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")
"""Where a rank's index is: Open MPI's, MPICH hydra's, then the one poprun-py's env sets."""
RANK_WRAPPER = b"poprun-rank"
"""The ``$0`` of the shell each rank of an mpiexec job runs under (``mpiexec.j2``)."""
TRAP_WAIT = 10.0
"""Seconds a rank wrapper that has not run its ``trap`` yet is waited for before a signal for
it is given up (:func:`signal_ranks`); it runs the trap first, so this is the start of a shell
on a loaded host."""
TRAP_POLL = 0.01  # seconds between looks at such a wrapper


def find_pyspy(path: str | None = None) -> str | None:
    """Where ``py-spy`` is on ``path`` (default: this process's PATH), or None."""
    import shutil  # here: the agent's start does not pay for it

    return shutil.which(PYSPY, path=path)


def is_python(pid: int) -> bool:
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        try:
            with open(f"/proc/{pid}/comm", "rb") as handle:
                name = handle.read().strip().decode("utf-8", "replace")
        except OSError:
            return False
    return name.startswith(("python", "pypy"))


def python_processes(root: int) -> list[int]:
    """``root`` and its live descendants that run a Python interpreter, root first."""
    return [pid for pid in tree(root) if is_python(pid)]


def tree(root: int) -> list[int]:
    """``root`` and its live descendants, root first (breadth first)."""
    live = {pid: s for pid, s in proc_table().items() if s[4] not in ("Z", "X")}
    return subtree([root], live)


def _is_rank_wrapper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return len(argv) > 3 and argv[1] == b"-c" and argv[3] == RANK_WRAPPER


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in ``/proc``): a rank's
    wrapper that has not run its ``trap`` yet would die of the signal."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _ready(pid: int, sig: int) -> bool:
    """Whether rank wrapper ``pid`` is ready for ``sig``: it catches it (its ``trap`` ran)
    and its rank has started (a descendant that is no copy of the wrapper: between ``trap``
    and the fork of ``"$@"`` a signal would reach the shell alone, and the rank never)."""
    return catches(pid, sig) and any(not _is_rank_wrapper(p) for p in tree(pid)[1:])


def _signal_tree(pid: int, sig: int) -> None:
    for member in tree(pid):
        try:
            os.kill(member, sig)
        except OSError:
            continue  # it ended meanwhile


def _signal_wrapper(pid: int, sig: int) -> bool:
    """``sig`` to rank wrapper ``pid``'s process group when it leads one, else to it and its
    descendants; False when it ended meanwhile."""
    try:
        leads = os.getpgid(pid) == pid
        if leads:
            os.killpg(pid, sig)
    except OSError:
        return False
    if not leads:
        _signal_tree(pid, sig)
    return True


def signal_ranks(roots: list[int], sig: int, wait: float = TRAP_WAIT) -> int:
    """Send ``sig`` to every rank of an mpiexec job in the trees of ``roots``: the process
    group of each rank wrapper (:data:`RANK_WRAPPER`) that leads one, else the wrapper and its
    descendants. A wrapper not catching ``sig`` yet (just started: its shell has not run its
    ``trap``) would die of it, and one whose rank has not started yet would keep it from
    the rank: a thread signals it once it is ready (:func:`_ready`), within ``wait``
    seconds (:func:`signal_when_trapped`). Return how many ranks were signalled at once."""
    count, pending = 0, []
    for root in roots:
        for pid in tree(root):
            if pid == root or not _is_rank_wrapper(pid):
                continue
            ident = identify(pid)
            if _ready(pid, sig):
                count += _signal_wrapper(pid, sig)
            elif ident is not None:  # one gone meanwhile is dropped
                pending.append(ident)
    if pending:
        args = (pending, sig, wait)
        threading.Thread(target=signal_when_trapped, args=args, daemon=True).start()
    return count


def signal_when_trapped(wrappers: list[Identity], sig: int, wait: float = TRAP_WAIT) -> int:
    """Signal each rank wrapper (an :mod:`~poprun_py.hostside.identity` identity) once it is
    ready (:func:`_ready`), polling for ``wait`` seconds at most; one that ended (or whose pid
    now names another process) is dropped, one still not ready then is left alone.
    Return how many were signalled."""
    deadline, count, todo = time.monotonic() + wait, 0, list(wrappers)
    while todo:
        for ident in list(todo):
            if not same(ident) or not _is_rank_wrapper(ident[0]):
                todo.remove(ident)
            elif _ready(ident[0], sig):
                todo.remove(ident)
                count += _signal_wrapper(ident[0], sig)
        if not todo or time.monotonic() >= deadline:
            break
        time.sleep(TRAP_POLL)
    return count


def pyspy_dump(pyspy: str, pid: int, timeout: float = PYSPY_TIMEOUT) -> list[bytes] | None:
    """``py-spy dump --pid PID``'s output lines, or None when it failed or timed out (it is
    killed then: nothing is left running)."""
    try:
        done = subprocess.run(
            [pyspy, "dump", "--pid", str(pid)],
            check=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.rstrip(b"\n").split(b"\n")
    return lines if done.returncode == 0 and done.stdout.strip() else None


def dump_trees(
    roots: dict[int, int], pyspy: str | None, timeout: float = PYSPY_TIMEOUT
) -> dict[int, list[bytes] | None]:
    """Every instance's (``index -> root pid``) Python stacks: the output lines of each
    process dumped, or None where none could be (no py-spy: None for every one)."""
    if pyspy is None:
        return dict.fromkeys(roots)
    jobs = [(index, pid) for index, root in roots.items() for pid in python_processes(root)]
    return {**dict.fromkeys(roots), **_dump_pids(jobs, pyspy, timeout)}


def environ_of(pid: int) -> dict[str, str]:
    """Process ``pid``'s environment, from ``/proc`` (empty when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            items = handle.read().split(b"\0")
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in items)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}


def rank_of(
    pid: int, environ: dict[str, str] | None = None, names: tuple[str, ...] = RANK_VARS
) -> int | None:
    """The rank of process ``pid`` (the first of ``names`` in its environment, read from
    ``/proc``, or ``environ`` when given), or None."""
    if environ is None:
        environ = environ_of(pid)
    for name in names:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return None


def dump_ranks(
    roots: dict[int, int], pyspy: str | None, timeout: float = PYSPY_TIMEOUT
) -> dict[int, list[bytes] | None]:
    """The Python stacks of every rank in the trees of ``roots`` (daemons' pids; the keys are
    not used): ``rank -> lines`` (None: found, not dumped); ``{}`` without py-spy."""
    if pyspy is None:
        return {}
    jobs = []
    for root in roots.values():
        for pid in python_processes(root):
            rank = rank_of(pid)
            if rank is not None:
                jobs.append((rank, pid))
    return by_rank(jobs, pyspy, timeout)


def by_rank(
    jobs: list[tuple[int, int]], pyspy: str | None, timeout: float
) -> dict[int, list[bytes] | None]:
    """Every rank of ``jobs`` (``(rank, pid)``): its dumped lines, or None (not dumped)."""
    found = _dump_pids(jobs, pyspy, timeout) if pyspy is not None else {}
    return {**{rank: None for rank, _ in jobs}, **found}


def _dump_pids(
    jobs: list[tuple[int, int]], pyspy: str, timeout: float
) -> dict[int, list[bytes] | None]:
    """``py-spy dump`` of every ``(key, pid)`` in parallel: each key's lines (its processes'
    in order), for the keys of which some process could be dumped."""
    dumps: dict[tuple[int, int], list[bytes] | None] = {}

    def one(job: tuple[int, int]) -> None:
        dumps[job] = pyspy_dump(pyspy, job[1], timeout)

    threads = [threading.Thread(target=one, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found: dict[int, list[bytes] | None] = {}
    for (key, _pid), lines in sorted(dumps.items()):
        if lines is not None:
            found[key] = (found.get(key) or []) + lines
    return found


def dump_in_background(
    roots: dict[int, int],
    done: Callable[[dict[int, list[bytes] | None]], None],
    dumper: Callable[[dict[int, int], str | None], dict[int, list[bytes] | None]] = dump_trees,
) -> threading.Thread | None:
    """``dumper`` (:func:`dump_trees`, or :func:`dump_ranks`) of ``roots`` with the py-spy on
    PATH, on a thread that then calls ``done`` with what it found (the thread is returned: join
    it before leaving, py-spy runs are bounded by their timeout). Without py-spy or roots,
    ``done`` is called here, at once, with what ``dumper`` finds without py-spy, and None is
    returned."""
    pyspy = find_pyspy()
    if pyspy is None or not roots:
        done(dumper(roots, None))
        return None
    thread = threading.Thread(target=lambda: done(dumper(roots, pyspy)), daemon=True)
    thread.start()
    return thread
