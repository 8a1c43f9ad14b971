"""CPU and memory binding without numactl: ``sched_setaffinity`` and ``set_mempolicy``.

Both are per-thread and inherited by a child across fork/vfork/clone and exec, so a spawner
binds *itself* around each spawn: :func:`bound` sets the calling thread's CPU affinity and
memory policy (``MPOL_BIND``, as ``numactl --membind``), the child is started (``posix_spawn``
or ``Popen``), and the thread's own affinity and policy come back -- four syscalls a child, no
process in between. ``set_mempolicy``/``get_mempolicy`` are plain syscalls through ctypes
(:data:`SYSCALLS` per architecture); no library is needed. Where there are none (a kernel
without NUMA policies, or an architecture not in the table: ENOSYS) memory stays unbound and
CPUs are still bound.

Standard library only, Python 3.7+ syntax, and no import of poprun_py: the agent ships this
module inside its own source (:mod:`poprun_py.hostside.bundle` inlines it in place of the import
line), so the local backend and the agent bind with the same code.

Example:

    >>> import os, subprocess
    >>> cpu = min(os.sched_getaffinity(0))
    >>> with bound((cpu,), ()):
    ...     out = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"],
    ...                          capture_output=True, text=True).stdout
    >>> out.split()[-1] == str(cpu)
    True
    >>> os.sched_getaffinity(0) == set(allowed_cpus())   # the spawner's own is back
    True
"""

from __future__ import annotations

import contextlib
import errno
import os

TYPE_CHECKING = False  # not typing's; ctypes is imported on first use (~5 ms: agents start fast)
if TYPE_CHECKING:
    import ctypes
    from collections.abc import Iterable, Iterator, Sequence

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE = 0, 1, 2, 3
MAX_NODES = 1024  # bits of the node masks passed to the kernel (Linux's MAX_NUMNODES limit)

SYSCALLS = {  # machine -> (set_mempolicy, get_mempolicy) syscall numbers
    "x86_64": (238, 239),
    "i386": (276, 275),
    "i686": (276, 275),
    "aarch64": (237, 236),  # the generic table (include/uapi/asm-generic/unistd.h)
    "arm64": (237, 236),
    "riscv64": (237, 236),
    "loongarch64": (237, 236),
    "armv7l": (321, 320),
    "armv8l": (321, 320),
    "ppc64le": (261, 260),
    "ppc64": (261, 260),
    "s390x": (270, 269),
}

_LIBC: list[ctypes.CDLL] = []  # the C library, loaded on first use
_CACHE: dict[str, object] = {}  # syscall numbers and the mask type, found on first use


def syscall_numbers() -> tuple[int, int] | None:
    """(set_mempolicy, get_mempolicy) for this machine and Python, or None where unknown."""
    if "numbers" not in _CACHE:
        _CACHE["numbers"] = _syscall_numbers()
    return _CACHE["numbers"]  # type: ignore[return-value]


def _syscall_numbers() -> tuple[int, int] | None:
    import ctypes

    machine = os.uname().machine
    if machine == "x86_64" and ctypes.sizeof(ctypes.c_void_p) == 4:
        machine = "i386"  # a 32-bit Python on a 64-bit kernel uses the 32-bit table
    elif machine == "aarch64" and ctypes.sizeof(ctypes.c_void_p) == 4:
        machine = "armv7l"
    return SYSCALLS.get(machine)


def _syscall(number: int, *args: object) -> None:
    import ctypes

    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    if _LIBC[0].syscall(ctypes.c_long(number), *args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _mask_type() -> type:
    if "mask" not in _CACHE:
        import ctypes

        _CACHE["mask"] = ctypes.c_ulong * (MAX_NODES // (8 * ctypes.sizeof(ctypes.c_ulong)))
    return _CACHE["mask"]  # type: ignore[return-value]


def _mask(nodes: Iterable[int]) -> ctypes.Array[ctypes.c_ulong]:
    import ctypes

    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask: ctypes.Array[ctypes.c_ulong] = _mask_type()()
    for node in nodes:
        if not 0 <= node < MAX_NODES:
            raise OSError(errno.EINVAL, f"NUMA node {node} is out of range")
        mask[node // bits] |= 1 << (node % bits)
    return mask


def set_mempolicy(mode: int, nodes: Iterable[int] = ()) -> None:
    """Set the calling thread's memory policy (``MPOL_BIND`` etc., flags or'ed in) over
    ``nodes``; OSError when the kernel refuses (e.g. EINVAL: none of them is online)."""
    import ctypes

    numbers = syscall_numbers()
    if numbers is None:
        raise OSError(errno.ENOSYS, f"set_mempolicy: unknown syscall on {os.uname().machine}")
    if mode == MPOL_DEFAULT:
        _syscall(numbers[0], ctypes.c_int(mode), None, ctypes.c_ulong(0))
        return
    mask = _mask(nodes)
    _syscall(numbers[0], ctypes.c_int(mode), mask, ctypes.c_ulong(MAX_NODES + 1))


def get_mempolicy() -> tuple[int, tuple[int, ...]]:
    """The calling thread's memory policy: (mode with its flags, node ids)."""
    import ctypes

    numbers = syscall_numbers()
    if numbers is None:
        raise OSError(errno.ENOSYS, f"get_mempolicy: unknown syscall on {os.uname().machine}")
    mode, mask = ctypes.c_int(0), _mask_type()()
    _syscall(numbers[1], ctypes.byref(mode), mask, ctypes.c_ulong(MAX_NODES + 1), None, 0)
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    nodes = [
        w * bits + b for w, word in enumerate(mask) if word for b in range(bits) if word >> b & 1
    ]
    return mode.value, tuple(nodes)


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity), sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


@contextlib.contextmanager
def bound(cpus: Sequence[int], nodes: Sequence[int]) -> Iterator[None]:
    """Bind the calling thread to ``cpus`` (when any) and its memory to ``nodes`` (MPOL_BIND,
    when any) for the duration; children started meanwhile inherit both. The thread's own
    affinity and policy are restored on exit. OSError (nothing changed) when the kernel
    refuses either, e.g. no CPU of ``cpus`` is allowed here; a kernel without NUMA policies
    (ENOSYS) has one memory node, and memory is then left unbound."""
    if not cpus and not nodes:
        yield
        return
    old_cpus = os.sched_getaffinity(0) if cpus else None
    old_policy = _policy() if nodes else None
    if old_cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            why = f"cannot bind to CPUs {_cpulist(cpus)}: {exc.strerror}"
            raise OSError(exc.errno, why) from None
    try:
        if old_policy is not None:
            try:
                set_mempolicy(MPOL_BIND, nodes)
            except OSError as exc:
                why = f"cannot bind memory to NUMA nodes {_cpulist(nodes)}: {exc.strerror}"
                raise OSError(exc.errno, why) from None
        try:
            yield
        finally:
            if old_policy is not None:
                set_mempolicy(*old_policy)
    finally:
        if old_cpus is not None:
            os.sched_setaffinity(0, old_cpus)


def _policy() -> tuple[int, tuple[int, ...]] | None:
    """The thread's memory policy, or None on a kernel without NUMA policies (ENOSYS: one
    memory node, so there is nothing to bind)."""
    try:
        return get_mempolicy()
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return None
        raise


def _cpulist(ids: Iterable[int]) -> str:
    """``0-3,8`` for (0, 1, 2, 3, 8)."""
    parts = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)
