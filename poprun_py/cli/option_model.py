"""What the option catalog (:data:`poprun_py.core.options.OPTIONS`) gives besides the typer
parameters: :class:`~poprun_py.prepare.job.LaunchOptions` from the parsed parameters, the argv
that runs the same launch again (the Slurm batch job's body), and the part of a detached job's
record that the client does not act on itself.

Every option is passed on unless its entry says why not (``batch``, ``detach``; gathered in
:data:`NOT_PASSED_ON` and :data:`DONE_BY_THE_CLIENT`), so a new entry reaches the batch job and
the detached job without another edit (tests/unit/test_everyday_matrix.py fails for an option
with no row).

Example:

    >>> values = {"replicas": 8, "numa_aware": False, "fmt": "json", "program": ("t.py", "-v")}
    >>> passed_on(values)
    ['--replicas=8', '--no-numa-aware', '--format=json', '--', 't.py', '-v']
    >>> launch_options({"replicas": 8, "inputs": None, "fmt": "json"}).inputs
    ()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

from poprun_py.cli.options import OPTIONS, Flag, taken_by
from poprun_py.prepare.job import LaunchOptions

LAUNCH = taken_by("launch")
NOT_PASSED_ON = {f.name: f.batch for f in LAUNCH if f.batch}
"""Parameters the Slurm batch job's ``launch`` does not get, each with the reason."""
DONE_BY_THE_CLIENT = {f.name: f.detach for f in LAUNCH if f.detach}
"""Parameters that a detached job's supervisor does not get from the client (in the record's
``cli`` part, or as given among its launch options), each with the reason."""


def launch_options(
    params: Mapping[str, Any], entries: Mapping[str, Flag] = OPTIONS
) -> LaunchOptions:
    """The LaunchOptions among a command's parsed parameters (typer's ``ctx.params``): each
    entry that is a field, by its name; a list becomes a tuple, None for a list ``()``.
    TypeError naming the entry when LaunchOptions has no such field."""
    known = {f.name for f in fields(LaunchOptions)}
    values: dict[str, Any] = {}
    for f in entries.values():
        if not f.field or f.name not in params:
            continue
        if f.name not in known:
            raise TypeError(
                f"option {f.name!r} is marked field=True but LaunchOptions has no such field: "
                f"add it to poprun_py.prepare.job.LaunchOptions, or mark it field=False"
            )
        value = params[f.name]
        values[f.name] = tuple(value or ()) if f.many else value
    return LaunchOptions(**values)


def option_values(params: Mapping[str, Any], opts: LaunchOptions) -> dict[str, Any]:
    """Every parameter's value: the parsed ones, with the LaunchOptions as resolved (``--up``
    points ``cluster`` at the inventory) in place of their fields."""
    return {**params, **asdict(opts)}


def passed_on(
    values: Mapping[str, Any], skip: Sequence[str] = (), entries: Mapping[str, Flag] = OPTIONS
) -> list[str]:
    """``--name=value`` words for every option of ``launch`` with a value other than its
    default, except those in ``skip``; then ``--`` and the program."""
    argv: list[str] = []
    for f in taken_by("launch", entries):
        if f.decls and f.name not in skip:
            argv += _words(f, values.get(f.name))
    return [*argv, "--", *(values.get("program") or ())]


def batch_argv(
    values: Mapping[str, Any], with_hosts: bool, entries: Mapping[str, Flag] = OPTIONS
) -> list[str]:
    """``python -m poprun_py launch --backend slurm ...`` with every option of ``values``
    whose entry passes it on (``--hosts`` too ``with_hosts``: the backend's batch job asks for
    those very nodes, else the hosts are the allocation's), run by this same interpreter
    (same paths on every node), paths made absolute."""
    skip = [f.name for f in entries.values() if f.batch and not (f.name == "hosts" and with_hosts)]
    absolute = {k: _absolute(entries[k], v) if k in entries else v for k, v in values.items()}
    head = [sys.executable, "-m", "poprun_py", "launch", "--backend", "slurm"]
    return [*head, *passed_on(absolute, skip, entries)]


def detached_cli(
    values: Mapping[str, Any], entries: Mapping[str, Flag] = OPTIONS
) -> dict[str, Any]:
    """A detached job's record part for the options that are not LaunchOptions fields: every
    one with a value other than its default, except those whose entry says why not."""
    cli = {}
    for f in taken_by("launch", entries):
        value = values.get(f.name)
        if not (f.field or f.detach) and value is not None and value != f.default:
            cli[f.name] = value
    return cli


def _absolute(flag: Flag, value: Any) -> Any:
    if not value or not isinstance(value, str):
        return value
    if flag.path == "path":
        return os.path.abspath(value)
    if flag.path == "@" and value.startswith("@"):
        return "@" + os.path.abspath(value[1:])
    return value


def _words(flag: Flag, value: Any) -> list[str]:
    """The words that give ``flag`` its ``value`` again (none for its default)."""
    if value is None or value == flag.default or value in ((), []):
        return []
    name, _, negative = flag.decls[0].partition("/")
    if flag.base is bool:
        return [name] if value else [negative] if negative else []
    if flag.many:
        return [f"{name}={item}" for item in value]
    return [f"{name}={value}"]
