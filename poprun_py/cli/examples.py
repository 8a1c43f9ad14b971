"""The ``Examples:`` section at the end of each command's ``--help`` (typer's epilog): a few
command lines a new user can copy, kept beside one another so that they agree.

Example:

    >>> print(epilog("wait"))
    Examples:
    <BLANKLINE>
    \b
      poprun-py wait local-2-20261201-120501-3f2a; echo $?
      poprun-py wait -c clusters/testhosts-4.yaml testhosts-4-20261201-120501-3f2a
"""

from __future__ import annotations

from poprun_py.cli.app import TOP_EXAMPLES, examples_section

JOB = "testhosts-4-20261201-120501-3f2a"
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": TOP_EXAMPLES,
    "plan": (
        "poprun-py plan --hosts h1,h2 --replicas 8 --instances 4 train.py",
        "poprun-py plan -c clusters/pod16.yaml --format json t.py | jq .instances",
    ),
    "render": (
        "poprun-py render -c clusters/pod16.yaml --backend mpirun python t.py",
        "poprun-py render --backend slurm -H node[01-04] --time 1:00:00 python t.py",
    ),
    "launch": (
        "poprun-py launch -c clusters/local-2.yaml python examples/train.py",
        "poprun-py launch -c clusters/pod16.yaml --max-restarts 3 --timeout 2h t.py",
        "poprun-py launch -c clusters/testhosts-4.yaml --detach python t.py",
        "poprun-py launch -c clusters/testhosts-4.yaml --up --down python t.py",
    ),
    "check": (
        "poprun-py check -c clusters/testhosts-4.yaml",
        "poprun-py check -c clusters/pod16.yaml --check-timeout 30s --format json",
    ),
    "exec": (
        "poprun-py exec --hosts node[01-16] --gather -- uname -r",
        "poprun-py exec -c clusters/pod16.yaml --timeout 30s -- nvidia-smi -L",
    ),
    "sync": (
        "poprun-py sync --hosts node[01-04] ~/job",
        "poprun-py sync -c clusters/pod16.yaml --dest /scratch/job --timeout 10m x/",
    ),
    "up": (
        "poprun-py up clusters/testhosts-4.yaml",
        'poprun-py launch -c "$(poprun-py up clusters/testhosts-4.yaml)" python t.py',
    ),
    "down": ("poprun-py down clusters/testhosts-4.yaml", "poprun-py down testhosts-4"),
    "status": ("poprun-py status", "poprun-py status testhosts-4 --no-refresh --format json"),
    "jobs": (
        "poprun-py jobs",
        "poprun-py jobs -c clusters/testhosts-4.yaml --format json",
        "poprun-py jobs --prune --older-than 7d",
    ),
    "logs": (
        f"poprun-py logs --follow {JOB}",
        f"poprun-py logs {JOB} --instance 3",
    ),
    "stop": (f"poprun-py stop {JOB}", f"poprun-py stop -c clusters/testhosts-4.yaml {JOB}"),
    "wait": (
        "poprun-py wait local-2-20261201-120501-3f2a; echo $?",
        f"poprun-py wait -c clusters/testhosts-4.yaml {JOB}",
    ),
}
"""Command name (``""``: the top level, whose lines are in :mod:`poprun_py.cli.app`) → its
example command lines."""


def epilog(command: str) -> str:
    """The ``Examples:`` section of ``command``'s help (:func:`examples_section`)."""
    return examples_section(EXAMPLES[command])
