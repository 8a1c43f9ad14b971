"""The option catalog as typer parameters: the entries of :data:`OPTIONS` (described once, as
data, in :mod:`poprun_py.core.options`) become each command's options with :func:`takes`
(:func:`annotated`: flags, help, click types), the SSH ones one :class:`SshOptions`;
:mod:`poprun_py.cli.option_model` derives the rest, and :mod:`poprun_py.cli.reference` the
reference (docs/cli.md).

Example:

    >>> from poprun_py.cli.options import SSH_FLAGS, ssh_options
    >>> [f.decls[0] for f in SSH_FLAGS if "jobs" in f.commands]
    ['--connect-timeout', '--known-hosts', '--ssh-config', '--ssh-client', '--identity', '--user']
    >>> ssh = ssh_options({"user": "ops", "hosts": "h1", "connect_timeout": 3.0})
    >>> ssh.user, ssh.connect_timeout, ssh.known_hosts
    ('ops', 3.0, None)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Annotated, Any

import typer
from typer._click.types import ParamType

from poprun_py.cli.durations import DURATION, DURATION_TEXT, SLURM_TIME
from poprun_py.core.options import EVERY, H_SSH, LAUNCHING, OPTIONS, REQUIRED, Flag, Int, taken_by
from poprun_py.core.spec import SshOptions

__all__ = [
    "EVERY",
    "H_SSH",
    "LAUNCHING",
    "OPTIONS",
    "REQUIRED",
    "Flag",
    "Int",
    "taken_by",
]  # and what is here


SSH_FLAGS = tuple(f for f in OPTIONS.values() if f.panel == H_SSH)
"""The SSH options: flags first, then the cluster spec's key, then ~/.ssh
(:func:`poprun_py.ssh.settings.settings_for`). A command takes them with a parameter ``ssh``
(:func:`takes`) and gets them as one :class:`SshOptions`, built by name."""

Ssh = SshOptions
SSH_HERE = SshOptions()
"""``ssh: Ssh = SSH_HERE``: where :func:`takes` puts a command's SSH flags."""


def ssh_options(params: Mapping[str, Any]) -> SshOptions:
    """The SSH options among a command's parsed parameters (its keyword arguments, or typer's
    ``ctx.params``), each by its name; one the command does not take keeps its default."""
    return SshOptions(**{f.name: params[f.name] for f in fields(SshOptions) if f.name in params})


def takes(
    command: str, entries: Mapping[str, Flag] = OPTIONS
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command function the options of ``entries`` that ``command`` takes: a parameter
    named as one gets its declaration; ``ssh`` becomes the SSH flags, passed to the function
    as one :class:`SshOptions` (:func:`ssh_options`); ``**kwargs`` becomes every other one,
    in order. The help and the order of ``ctx.params`` follow the signature built."""
    mine = {f.name: f for f in taken_by(command, entries)}
    ssh = [f.name for f in mine.values() if f.panel == H_SSH]

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(fn, eval_str=True)
        named = set(signature.parameters) | ({*ssh} if "ssh" in signature.parameters else set())
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.kind is param.VAR_KEYWORD:
                rest = [f for f in mine.values() if f.name not in named]
                params += [_param(f, param.KEYWORD_ONLY) for f in rest]
            elif param.name == "ssh":
                params += [_param(mine[n], param.kind) for n in ssh]
            else:
                params.append(_param(mine[param.name], param.kind) if param.name in mine else param)
        grouped = "ssh" in signature.parameters

        @functools.wraps(fn)
        def with_options(**kwargs: Any) -> None:
            if grouped:
                given = {k: kwargs.pop(k) for k in ssh if k in kwargs}
                kwargs["ssh"] = ssh_options(given)
            fn(**kwargs)

        with_options.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    return decorate


def _param(flag: Flag, kind: Any) -> inspect.Parameter:
    default = inspect.Parameter.empty if flag.default is REQUIRED else flag.default
    return inspect.Parameter(flag.name, kind, default=default, annotation=annotated(flag))


def annotated(flag: Flag) -> Any:
    """The typer parameter: ``Annotated[type, typer.Option(...)]`` (or ``Argument``)."""
    if not flag.decls:
        return Annotated[flag.type, typer.Argument(help=flag.help)]
    kind: ParamType | None = SLURM_TIME if flag.name == "slurm_time" else None
    if flag.duration:
        kind = DURATION_TEXT if flag.base is str else DURATION
    option = typer.Option(
        *flag.decls,
        rich_help_panel=flag.panel,
        help=flag.help,
        metavar=flag.metavar,
        show_default=False,
        click_type=kind,
    )
    return Annotated[flag.type, option]
