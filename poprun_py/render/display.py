"""How a rendered job is shown: ``render``/``--dry-run`` text and ``render --format json``.

Every secret value is masked (:data:`poprun_py.core.env.MASK`) unless asked otherwise.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> from poprun_py.render.job import render_job
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h1")), JobSpec(("prog", "a b")))
    >>> print(format_job(render_job(plan, "local", job_dir="/tmp/j")).splitlines()[0])
    # local: 1 instance(s) on 1 host(s)
    >>> job_dict(render_job(plan, "local", job_dir="/tmp/j"))["instances"][0]["argv"]
    ['prog', 'a b']
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from poprun_py.core import env as instance_env
from poprun_py.render.binding import binding_dict

if TYPE_CHECKING:
    from poprun_py.render.job import InstanceCommand, RenderedJob


def format_job(job: RenderedJob, masked: bool = True) -> str:
    """A RenderedJob as text for ``render`` and ``--dry-run``: shell-quoted lines (shlex.join),
    the launcher one app context a line, each instance as an ``env ... argv`` line.

    With ``masked`` every secret value is replaced by :data:`poprun_py.core.env.MASK`.
    """
    secrets = job.secrets if masked else frozenset()
    hosts = len(job.plan.hosts)
    lines = [f"# {job.backend}: {len(job.instances)} instance(s) on {hosts} host(s)"]
    lines.append(f"# job dir: {job.job_dir}")
    if job.launcher:
        lines += ["# launcher", _format_launcher(job.launcher)]
    if job.launcher_env:
        lines.append("# launcher environment")
        lines += [shlex.quote(f"{k}={v}") for k, v in _masked(job.launcher_env, secrets).items()]
    for name, text in job.files.items():
        lines += [f"# file {posixpath.join(job.job_dir, name)}", text.rstrip("\n")]
    for cmd in job.instances:
        lines += [_instance_header(cmd), _format_instance(cmd, secrets)]
    return _scrubber(job, secrets)("\n".join(lines) + "\n")


def job_dict(job: RenderedJob, masked: bool = True) -> dict[str, Any]:
    """A RenderedJob as JSON-ready data (``render --format json``), secrets masked."""
    secrets = job.secrets if masked else frozenset()
    scrub = _scrubber(job, secrets)
    return {
        "backend": job.backend,
        "job_dir": job.job_dir,
        "launcher": [scrub(a) for a in job.launcher],
        "launcher_env": _masked(job.launcher_env, secrets),
        "files": {name: scrub(text) for name, text in job.files.items()},
        "secrets": sorted(job.secrets),
        "instances": [
            {
                "index": cmd.index,
                "host": cmd.host,
                "argv": [scrub(a) for a in cmd.argv],
                "env": _masked(cmd.env, secrets),
                "cwd": cmd.cwd,
                "shard_file": cmd.shard_file,
                "shard": list(job.plan.instances[cmd.index].shard.files),
                "binding": binding_dict(cmd.binding),
            }
            for cmd in job.instances
        ],
    }


def _format_launcher(argv: tuple[str, ...]) -> str:
    """One app context a line (split before each ``:``), joined with shell continuations."""
    parts: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            parts.append([])
        parts[-1].append(arg)
    return " \\\n  ".join(shlex.join(p) for p in parts)


def _instance_header(cmd: InstanceCommand) -> str:
    files = cmd.shard_text.count("\n")
    text = f"# instance {cmd.index} on {cmd.host}: shard {cmd.shard_file} ({files} file(s))"
    if cmd.binding is not None:
        nodes = f", memory on NUMA nodes {cmd.binding.nodes}" if cmd.binding.nodes else ""
        text += f"; bound to CPUs {cmd.binding.cpus}{nodes}"
    return text


def _format_instance(cmd: InstanceCommand, secrets: frozenset[str]) -> str:
    chdir = [f"--chdir={cmd.cwd}"] if cmd.cwd is not None else []
    assignments = [f"{k}={v}" for k, v in _masked(cmd.env, secrets).items()]
    return shlex.join(["env", *chdir, *assignments, *cmd.argv])


def _masked(env: Mapping[str, str], secrets: frozenset[str]) -> dict[str, str]:
    return instance_env.masked(dict(env), secrets)


def _scrubber(job: RenderedJob, secrets: frozenset[str]) -> Callable[[str], str]:
    """Belt and braces: masks any secret value (4+ characters) that reached a text anyway."""
    values = [v.value for v in job.plan.env if v.name in secrets and len(v.value) >= 4]

    def scrub(text: str) -> str:
        for value in values:
            text = text.replace(value, instance_env.MASK)
        return text

    return scrub
