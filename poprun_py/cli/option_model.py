"""The options of ``plan``, ``render``, ``launch`` and ``check`` as data, taken from the typer
command itself: :class:`~poprun_py.prepare.job.LaunchOptions` from the parsed parameters, the
argv that runs the same launch again (the Slurm batch job's body), and the part of a detached
job's record that the client does not act on itself.

Every parameter is passed on by default; the ones that are not are listed here with the reason
(:data:`NOT_PASSED_ON`, :data:`DONE_BY_THE_CLIENT`), so an option added to the command reaches
the batch job and the detached job without another edit (tests/unit/test_everyday_matrix.py
fails for an option with no row).

Example:

    >>> from click import Command, Option
    >>> cmd = Command("launch", params=[Option(["--replicas", "-r"], type=int),
    ...                                  Option(["--numa-aware/--no-numa-aware"], default=None)])
    >>> passed_on(cmd, {"replicas": 8, "numa_aware": False, "program": ("t.py", "-v")})
    ['--replicas=8', '--no-numa-aware', '--', 't.py', '-v']
    >>> launch_options({"replicas": 8, "inputs": None, "fmt": "json"}).inputs
    ()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, fields
from typing import Any, Protocol

from poprun_py.prepare.job import LaunchOptions


class Command(Protocol):
    """A click command (typer's, or click's own): its parameters."""

    @property
    def params(self) -> Sequence[Any]:
        """The options and arguments, in declaration order."""


NOT_PASSED_ON: dict[str, str] = {
    "program": "it goes last, after '--'",
    "backend": "the batch job runs with --backend slurm, whatever render was given",
    "hosts": "passed on only when the batch job asks for those very nodes (--nodelist); "
    "otherwise the allocation's nodes are the hosts",
    "dry_run": "a dry run prints the plan, never a batch script: the batch job is the launch",
    "fmt": "it says how render prints (a batch script is printed for table only)",
    "detach": "the slurm backend refuses it: a batch job already outlives its client",
    "up": "launch only (render refuses it): provisioning happens on the client, around a job",
    "down": "launch only (render refuses it), with --up",
    "yes": "launch only, with --up: it answers the client's cost prompt",
}
"""Parameters the Slurm batch job's ``launch`` does not get, each with the reason."""

DONE_BY_THE_CLIENT: dict[str, str] = {
    "backend": "the record's launch options carry the backend the client resolved",
    "dry_run": "a dry run never detaches",
    "fmt": "it says how the client prints the job's id",
    "detach": "the supervisor runs the job attached, in a session of its own",
    "print_topology": "the client prints the topology before it detaches",
    "check": "the client runs the check before it detaches",
    "check_timeout": "with --check, on the client",
    "check_torch": "with --check, on the client",
    "sync": "the client pushes its files before the supervisor starts",
    "up": "the client brings the cluster up; the record's spec is the inventory",
    "yes": "it answers the client's cost prompt",
    "down": "the record carries the spec to remove (its path and text)",
    "output_dir": "the record carries it, made absolute",
}
"""Parameters that are not LaunchOptions fields and that a detached job's supervisor does not
get in the record's ``cli`` part, each with the reason."""

PATHS = frozenset({"cluster", "templates", "known_hosts", "ssh_config", "identity", "output_dir"})
"""Parameters naming a file or directory: passed on as absolute paths."""


def launch_options(params: Mapping[str, Any]) -> LaunchOptions:
    """The LaunchOptions among a command's parsed parameters (typer's ``ctx.params``): each
    parameter named as a field; a list becomes a tuple, None for a tuple field ``()``."""
    values: dict[str, Any] = {}
    for f in fields(LaunchOptions):
        if f.name not in params:
            continue
        value = params[f.name]
        if f.default is not MISSING and isinstance(f.default, tuple):
            value = tuple(value or ())
        values[f.name] = value
    return LaunchOptions(**values)


def option_values(params: Mapping[str, Any], opts: LaunchOptions) -> dict[str, Any]:
    """Every parameter's value: the parsed ones, with the LaunchOptions as resolved (``--up``
    points ``cluster`` at the inventory) in place of their fields."""
    return {**params, **asdict(opts)}


def passed_on(command: Command, values: Mapping[str, Any], skip: Sequence[str] = ()) -> list[str]:
    """``--name=value`` words for every parameter of ``command`` with a value other than its
    default, except those in ``skip``; then ``--`` and the program."""
    argv: list[str] = []
    for param in command.params:
        name = param.name
        if name is None or name == "program" or name in skip:
            continue
        argv += _words(param, values.get(name))
    return [*argv, "--", *(values.get("program") or ())]


def batch_argv(command: Command, values: Mapping[str, Any], *, with_hosts: bool) -> list[str]:
    """``python -m poprun_py launch --backend slurm ...`` with every option of ``values``
    except :data:`NOT_PASSED_ON` (``--hosts`` too with ``with_hosts``), run by this same
    interpreter (same paths on every node), paths made absolute."""
    skip = [n for n in NOT_PASSED_ON if not (n == "hosts" and with_hosts)]
    absolute = {k: _absolute(k, v) for k, v in values.items()}
    head = [sys.executable, "-m", "poprun_py", "launch", "--backend", "slurm"]
    return [*head, *passed_on(command, absolute, skip)]


def detached_cli(command: Command, values: Mapping[str, Any]) -> dict[str, Any]:
    """A detached job's record part for the parameters that are not LaunchOptions fields:
    every one with a value other than its default, except :data:`DONE_BY_THE_CLIENT`."""
    known = {f.name for f in fields(LaunchOptions)}
    cli = {}
    for param in command.params:
        name = param.name
        if name is None or name in known or name in DONE_BY_THE_CLIENT:
            continue
        value = values.get(name)
        if value is not None and value != param.default:
            cli[name] = value
    return cli


def _absolute(name: str, value: Any) -> Any:
    if not value or not isinstance(value, str):
        return value
    if name in PATHS:
        return os.path.abspath(value)
    if name in ("hosts", "spare_hosts") and value.startswith("@"):
        return "@" + os.path.abspath(value[1:])
    return value


def _words(param: Any, value: Any) -> list[str]:
    """The words that give ``param`` its ``value`` again (none for its default)."""
    if value is None or value == param.default or value in ((), []):
        return []
    opts = getattr(param, "opts", [])
    flag = next((o for o in opts if o.startswith("--")), opts[0] if opts else "")
    if getattr(param, "is_flag", False):
        secondary = getattr(param, "secondary_opts", [])
        if value:
            return [flag]
        return [secondary[0]] if secondary else []
    if getattr(param, "multiple", False):
        return [f"{flag}={item}" for item in value]
    return [f"{flag}={value}"]
