"""Stack dumps of running instances with ``py-spy dump``, for ``--hang-timeout``: used by the
local supervision and, inlined into its source, by the per-host agent
(:mod:`poprun_py.agent.host`), so it uses the standard library only (Python 3.7).

An instance may be a shell or a wrapper around the program: every process of its tree (its
root and the root's descendants, from ``/proc``) that runs a Python interpreter is dumped, all
in parallel, each ``py-spy dump`` killed after :data:`PYSPY_TIMEOUT` seconds. An instance
none of whose Python processes could be dumped (py-spy absent, no ptrace rights, no Python in
its tree, a timeout) gets None: the caller falls back to SIGUSR1 for faulthandler.

Under an MPI launcher the ranks are processes of a daemon's tree (orted, hydra_pmi_proxy, or
mpirun itself here): :func:`dump_ranks` dumps every Python process of the trees given and files
each dump under its rank, read from the process's environment (:data:`RANK_VARS`).

Example:

    >>> import os
    >>> dump_trees({0: os.getpid()}, None)  # no py-spy: nothing dumped
    {0: None}
    >>> python_processes(os.getpid())[:1] == [os.getpid()]  # doctests run under python
    True
    >>> dump_ranks({0: os.getpid()}, None), rank_of(os.getpid(), {"RANK": "3"})
    ({}, 3)
"""

from __future__ import annotations

import os
import subprocess
import threading

TYPE_CHECKING = False  # not typing's: the agent's start does not pay for importing it
if TYPE_CHECKING:
    from collections.abc import Callable

PYSPY = "py-spy"
PYSPY_TIMEOUT = 1.25  # seconds for one py-spy dump; the dumps of a job run in parallel
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")
"""Where a rank's index is: Open MPI's, MPICH hydra's, then the one poprun-py's env sets."""


def find_pyspy(path: str | None = None) -> str | None:
    """Where ``py-spy`` is on ``path`` (default: this process's PATH), or None."""
    import shutil  # here: the agent's start does not pay for it

    return shutil.which(PYSPY, path=path)


def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def _is_python(pid: int) -> bool:
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
    children = _proc_children()
    order, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return [pid for pid in order if _is_python(pid)]


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


def rank_of(pid: int, environ: dict[str, str] | None = None) -> int | None:
    """The rank of process ``pid`` (the first of :data:`RANK_VARS` in its environment, read
    from ``/proc``, or ``environ`` when given), or None."""
    if environ is None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                items = handle.read().split(b"\0")
        except OSError:
            return None
        pairs = (item.partition(b"=") for item in items)
        environ = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in pairs}
    for name in RANK_VARS:
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
    return {**{rank: None for rank, _ in jobs}, **_dump_pids(jobs, pyspy, timeout)}


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
