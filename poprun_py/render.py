"""Render a plan into launch commands: argv lists and per-instance environments.

Templates live in ``poprun_py/templates`` (the repository's ``templates/``) or a directory the
user names with ``--templates``. They render to text which is split with :func:`shlex.split`
into argv lists, so every value is quoted at exactly one place (the ``quote`` filter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from poprun_py.plan import LaunchPlan


@dataclass(frozen=True)
class InstanceCommand:
    """What one instance runs: its argv (binding prefix included), its environment, its cwd,
    and the path and contents of its shard file."""

    index: int
    host: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    shard_file: str
    shard_text: str


@dataclass(frozen=True)
class RenderedJob:
    """A plan turned into commands for one backend.

    ``instances`` always holds one command per instance (the local and ssh backends run these);
    ``launcher`` is the single whole-job argv for mpirun/mpiexec/srun (empty otherwise);
    ``files`` maps names relative to ``job_dir`` to contents the backend writes before starting
    (hostfile, batch script); ``secrets`` names environment values never to print.
    """

    backend: str
    plan: LaunchPlan
    job_dir: str
    instances: tuple[InstanceCommand, ...]
    launcher: tuple[str, ...] = ()
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()
