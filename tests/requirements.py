"""What the tests need of this machine -- programs, Python modules, root, ptrace rights, CPUs --
and what brings each: one table (:data:`NEEDS`), for the tests, ``scripts/install-deps.sh`` and
``scripts/test.sh``.

A test names what it needs with the ``requires`` marker (or, inside a helper, :func:`require`):

    @pytest.mark.requires("pgrep", "mpirun")
    def test_nothing_is_left(tmp_path): ...

When something is missing the test skips, and the reason names it and its Debian package:
``needs pgrep (Debian package procps), mpirun (Debian package openmpi-bin)``. Tests marked
``hosts`` need :data:`HOST_NEEDS` and tests marked ``slurm`` :data:`SLURM_NEEDS` besides. With
``CI=true`` every skip is a failure (tests/conftest.py), except the reasons of
:data:`ALLOWED_SKIPS`: what no set-up step can provide.

Only the standard library, and Python 3.7+: install-deps.sh runs this file with the
distribution's ``python3`` before any virtual environment exists::

    python3 tests/requirements.py             # one line: what is missing, the apt-get line
    python3 tests/requirements.py --ci        # the same, saying that those tests fail
    python3 tests/requirements.py --packages  # the missing Debian packages, a line each

Example:

    >>> NEEDS["pgrep"].describe()
    'pgrep (Debian package procps)'
    >>> reason(["root"]).startswith("needs root (")
    True
    >>> allowed_skip("could not import 'torch': No module named 'torch'")
    'torch'
    >>> allowed_skip("needs mpirun (Debian package openmpi-bin)") is None
    True
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Iterable
from typing import NamedTuple

SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
"""Where daemons live; an ordinary user's PATH often lacks them, the tests look there too."""


class Need(NamedTuple):
    """One thing a test may need: a program, a Python module or a privilege."""

    name: str
    kind: str  # "program", "module", "privilege" or "machine"
    source: str  # the Debian package; for pip: "pip"; for a privilege or machine: what for

    def present(self) -> bool:
        if self.name == "ptrace":
            return ptrace_refused() is None
        if self.name == TWO_CPUS:
            return len(os.sched_getaffinity(0)) >= 2
        if self.kind == "privilege":
            return os.geteuid() == 0
        if self.kind == "module":
            return importlib.util.find_spec(self.name) is not None
        return shutil.which(self.name) is not None or any(
            os.access(os.path.join(d, self.name), os.X_OK) for d in SBIN
        )

    def describe(self) -> str:
        if self.name == "ptrace":
            why = ptrace_refused()
            return f"{self.name} ({self.source}{': here ' + why if why else ''}; {PTRACE_FIX})"
        if self.name == TWO_CPUS:
            usable = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            return f"{self.name} ({self.source}; here this process may use CPU {usable} only)"
        if self.kind == "privilege":
            return f"{self.name} ({self.source})"
        if self.source == "pip":
            return f"{self.name} (pip: the test extras, which scripts/test.sh installs)"
        return f"{self.name} (Debian package {self.source})"


TWO_CPUS = "2 usable CPUs"
"""A CPU for each of two ranks bound on one host: ``taskset -c 0``, a cpuset or a one-CPU
machine leaves one, where a binding would change nothing and poprun-py makes none."""

YAMA = "/proc/sys/kernel/yama/ptrace_scope"
"""Yama's ptrace rule (absent without Yama: classic rules, a user may trace its own processes)."""
CAP_SYS_PTRACE = 19
PTRACE_FIX = (
    "to allow it: sysctl kernel.yama.ptrace_scope=0 (as root), or run the tests as root with "
    "CAP_SYS_PTRACE"
)


def ptrace_refused(scope: int | None = None, capable: bool | None = None) -> str | None:
    """Why this process may not ptrace a process it did not start (py-spy reading a sibling, as
    poprun-py's does an instance), or None: Yama's ``ptrace_scope`` 1 or 2 takes CAP_SYS_PTRACE
    (which a container may drop), 3 forbids it to anyone. ``scope`` and ``capable`` default to
    this process's (:data:`YAMA`, its effective capabilities).

    >>> ptrace_refused(0, False) is None and ptrace_refused(1, True) is None
    True
    >>> ptrace_refused(1, False)
    'kernel.yama.ptrace_scope is 1 and this process lacks CAP_SYS_PTRACE'
    """
    if scope is None:
        scope = _yama_scope()
    if capable is None:
        capable = _capable(CAP_SYS_PTRACE)
    if scope >= 3:
        return "kernel.yama.ptrace_scope is 3: no process may ptrace another (until a reboot)"
    if scope >= 1 and not capable:
        return f"kernel.yama.ptrace_scope is {scope} and this process lacks CAP_SYS_PTRACE"
    return None


def _yama_scope() -> int:
    try:
        with open(YAMA) as rule:
            return int(rule.read())
    except FileNotFoundError:
        return 0


def _capable(capability: int) -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split(":", 1)[1], 16) >> capability & 1)
    return os.geteuid() == 0


def _programs(package: str, *names: str) -> list[Need]:
    return [Need(name, "program", package) for name in names]


NEEDS = {
    need.name: need
    for need in [
        Need("root", "privilege", "test hosts: network namespaces, bridges, sshd, /etc/hosts"),
        *_programs("procps", "pgrep", "pkill", "ps"),
        *_programs("psmisc", "killall"),
        *_programs("iproute2", "ip"),
        *_programs("openssh-client", "ssh", "ssh-keygen"),
        *_programs("openssh-server", "sshd"),
        *_programs("openmpi-bin", "mpirun"),
        *_programs("libopenmpi-dev", "mpicc"),
        *_programs("mpich", "mpiexec.hydra"),
        *_programs("libmpich-dev", "mpicc.mpich"),
        *_programs("numactl", "numactl"),
        *_programs("rsync", "rsync"),
        *_programs("pdsh", "pdsh"),
        *_programs("clustershell", "clush"),
        *_programs("tmux", "tmux"),
        *_programs("iputils-ping", "ping"),
        *_programs("netcat-openbsd", "nc"),
        *_programs("util-linux", "setsid", "unshare", "nsenter", "taskset"),
        *_programs("hostname", "hostname"),
        *_programs("slurmctld", "slurmctld"),
        *_programs("slurmd", "slurmd"),
        *_programs("slurm-client", "srun", "salloc", "sbatch", "squeue", "scancel", "sinfo"),
        *_programs("munge", "munged"),
        *_programs("pip", "py-spy"),
        Need("ptrace", "privilege", "py-spy reads processes it did not start"),
        Need(
            TWO_CPUS,
            "machine",
            "two ranks of a host, each bound to a CPU of its own: not under taskset -c N, "
            "a cpuset of one CPU or on a one-CPU machine",
        ),
        Need("mpi4py", "module", "pip"),
    ]
}
"""Everything a test may need, by name; ``scripts/install-deps.sh`` installs every Debian
package named here."""

HOST_NEEDS = ("root", "ip", "sshd", "ssh", "ssh-keygen", "unshare", "hostname", "pgrep")
"""What test hosts (tests marked ``hosts``; tests/hostfixtures.py) need."""

SLURM_NEEDS = (*HOST_NEEDS, "nsenter", "munged", "slurmctld", "slurmd", "srun", "salloc")
SLURM_NEEDS += ("sbatch", "squeue", "scancel", "sinfo")
"""What a test Slurm (tests marked ``slurm``; tests/slurmfixtures.py) needs."""

MARKER_NEEDS = {"hosts": HOST_NEEDS, "slurm": SLURM_NEEDS}


class Allowed(NamedTuple):
    """A skip that may stay a skip with ``CI=true``: what no set-up step can provide."""

    name: str
    pattern: str  # a regular expression searched in the skip's reason
    why: str


ALLOWED_SKIPS = (
    Allowed(
        "torch",
        r"could not import 'torch'",
        "torch is installed by scripts/test.sh only from a wheel this machine already has "
        "(a registry's torch is several GB)",
    ),
    Allowed(
        "old Pythons",
        r"\bno python3\.\d+ build here",
        "interpreters older than any distribution ships (pyenv's 3.6, 3.7 builds on the "
        "development machines), which no registry serves",
    ),
)
"""The only skips ``CI=true`` lets through (tests/conftest.py)."""


def unknown(names: Iterable[str]) -> list[str]:
    return [name for name in names if name not in NEEDS]


def missing(names: Iterable[str]) -> list[Need]:
    """The needs among ``names`` this machine lacks (each once, in order)."""
    seen: dict[str, Need] = {}
    for name in names:
        need = NEEDS[name]
        if name not in seen and not need.present():
            seen[name] = need
    return list(seen.values())


def reason(names: Iterable[str]) -> str:
    """The skip reason for the needs ``names`` (missing ones)."""
    return "needs " + ", ".join(NEEDS[name].describe() for name in names)


def require(*names: str) -> None:
    """Skip the calling test, naming what is missing, unless this machine has all of ``names``."""
    lacking = missing(names)
    if lacking:
        import pytest

        pytest.skip(reason(n.name for n in lacking))


def allowed_skip(text: str) -> str | None:
    """The name of the allowed skip whose pattern the reason ``text`` matches, or None."""
    for allowed in ALLOWED_SKIPS:
        if re.search(allowed.pattern, text, re.M):
            return allowed.name
    return None


def debian_packages(needs: Iterable[Need]) -> list[str]:
    packages: list[str] = []
    for need in needs:
        if need.kind == "program" and need.source != "pip" and need.source not in packages:
            packages.append(need.source)
    return packages


def summary(lacking: list[Need], effect: str = "the tests that need them skip, naming it") -> str:
    """One line: what is missing here, ``effect``, and the ``apt-get install`` line that adds it."""
    if not lacking:
        return "everything the tests need is here: the whole suite runs"
    by_source: dict[str, list[str]] = {}
    for need in lacking:
        by_source.setdefault(need.source, []).append(need.name)
    parts = [_part(source, names) for source, names in by_source.items()]
    packages = debian_packages(lacking)
    line = "missing here: " + ", ".join(parts) + "; " + effect
    if packages:
        line += "; to add them, as root: apt-get install " + " ".join(packages)
    return line


def _part(source: str, names: list[str]) -> str:
    if names == ["root"]:
        return "not root (test hosts)"
    if len(names) == 1 and NEEDS[names[0]].kind in ("privilege", "machine"):
        return NEEDS[names[0]].describe()  # with what it is here, and the fix
    return f"{'/'.join(names)} ({source})"


def main(argv: list[str]) -> int:
    lacking = missing(NEEDS)
    if argv == ["--packages"]:
        print("\n".join(debian_packages(lacking)))
    elif not argv:
        print(summary(lacking))
    elif argv == ["--ci"]:
        print(summary(lacking, "with CI=true the tests that need them FAIL"))
    else:
        print("usage: requirements.py [--packages | --ci]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
