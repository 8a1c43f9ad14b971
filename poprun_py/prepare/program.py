"""What the instances run, said in the plan: ``poprun-py launch ... train.py`` means ``python
train.py``; ``--backend local --hosts h1,h2`` runs "h1" and "h2" here.

A PROGRAM whose name ends in ``.py`` and that is not an executable file on this machine (a path
with its execute bit, looked up from the working directory; a bare name on ``PATH``) runs under
the instance's Python, as torchrun and deepspeed run their scripts: the cluster spec's
``defaults.python`` where it is set, else this interpreter (``sys.executable``) when every
instance runs on this machine, else ``python3`` (on each host's ``PATH``, as the agents' own).
An executable ``.py`` (a ``#!`` line and ``chmod +x``) runs as it is. The plan's notes say which
interpreter was chosen, and ``--dry-run``/``render`` show the command it gives.

The local backend simulates hosts: unless a cluster spec declares them ``simulated:`` or they
are this machine's names, :func:`simulated_note` says that they are not reached (the plan's
note; the local backend repeats it once on stderr).

Example:

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "train.py"), "w").write("print('hi')\\n")
    >>> run = with_python(("train.py", "--steps", "3"), "/opt/py/bin/python3", d)
    >>> run.program
    ('/opt/py/bin/python3', 'train.py', '--steps', '3')
    >>> os.chmod(os.path.join(d, "train.py"), 0o755)
    >>> with_python(("./train.py",), "python3", d).program, with_python(("ls",), "python3", d).note
    (('./train.py',), None)
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

from poprun_py.core.spec import LOCAL_NAMES, ClusterSpec, JobSpec

SIMULATED = "--backend local runs every instance on this machine: "
"""How :func:`simulated_note` starts (the local backend finds its note by it)."""


@dataclass(frozen=True)
class Program:
    """The argv every instance runs, and the plan note saying why it differs from the one given
    (None when it does not)."""

    program: tuple[str, ...]
    note: str | None = None


def resolve_program(job: JobSpec, cluster: ClusterSpec, *, here: bool) -> Program:
    """What ``job``'s instances run (``here``: every instance runs on this machine), looked up
    with the instances' ``PATH`` (``--env PATH=...``, the spec's ``env``, else this one's)."""
    path = next((v.value for v in job.env if v.name == "PATH"), cluster.env.get("PATH"))
    workdir = job.workdir if job.workdir and os.path.isdir(job.workdir) else None
    return with_python(job.program, instance_python(cluster, here), workdir, path)


def instance_python(cluster: ClusterSpec, here: bool) -> str:
    """The Python that runs a ``.py`` PROGRAM: ``defaults.python``, else this interpreter when
    every instance runs on this machine (``here``), else ``python3``."""
    return cluster.defaults.python or (sys.executable if here else "python3")


def with_python(
    program: tuple[str, ...], python: str, workdir: str | None, path: str | None = None
) -> Program:
    """``program`` as every instance runs it: under ``python`` when it is a ``.py`` file that is
    not executable here (see the module docstring); ``path`` is the instances' ``PATH``."""
    if not program or not program[0].endswith(".py") or _executable(program[0], workdir, path):
        return Program(program)
    note = (
        f"{program[0]} is not an executable file here: it runs as `{python} {program[0]}` "
        "(the spec's defaults.python chooses the interpreter; chmod +x and a #! line run it "
        "as it is)"
    )
    return Program((python, *program), note)


def _executable(name: str, workdir: str | None, path: str | None) -> bool:
    """Whether ``name`` would be run as it is: a path (from ``workdir``) to an executable file,
    or a bare name found on ``path``."""
    if "/" not in name:
        return shutil.which(name, path=path) is not None
    full = os.path.join(workdir or os.getcwd(), name)
    return os.path.isfile(full) and os.access(full, os.X_OK)


def simulated_note(cluster: ClusterSpec, declared: bool) -> str | None:
    """The plan's note when the local backend simulates hosts named after other machines; None
    when the spec ``declared`` them simulated, or every host has one of this machine's names."""
    names = [h.name for h in cluster.hosts if h.name not in LOCAL_NAMES]
    if declared or not names:
        return None
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (
        f"{SIMULATED}host(s) {shown} are simulated here, not reached "
        "(use --backend ssh to run on them)"
    )
