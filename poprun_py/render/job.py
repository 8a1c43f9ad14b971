"""Render a plan into launch commands: argv lists and per-instance environments.

Templates live in ``poprun_py/render/templates`` (the repository's ``templates/``) or a directory
the user names with ``--templates``, whose files override the packaged ones by name. They render to
text which is split into argv lists as :func:`shlex.split` would (by the faster
:func:`poprun_py.core.shellwords.split`), so every value is quoted at exactly one place (the
``quote`` filter).

- ``instance.j2`` renders once per instance: the program; its binding is data
  (:mod:`poprun_py.render.binding`) that the local and ssh backends apply themselves, unless
  the template binds with numactl (``inst.numactl``). Launchers reuse it as ``inst.argv``.
- ``<launcher>.j2`` (:data:`LAUNCHER_TEMPLATES`: ``mpirun.j2``, ``mpiexec.j2``, ``srun.j2``)
  renders once per job into the launcher's argv. A ``{% call file("hostfile") %}...{% endcall %}``
  block inside it becomes a file of the job directory (:attr:`RenderedJob.files`).

Template context, the same for every launcher: ``backend``, ``plan`` (the LaunchPlan),
``program``, ``job_dir``, ``files`` (``files.hostfile`` is ``<job_dir>/hostfile``), ``file``
(the call-block collector), ``hosts`` (:class:`HostContext`), ``targets`` (:class:`Target`: the
machines as launchers name them, with their slots), ``instances`` (:class:`InstanceContext`),
``secrets``, ``mpi_args``, ``mpi_subnet``, ``mpi_network``, ``as_root`` and ``appfile``: true
when the per-instance part would make the command line longer than :data:`ARGV_LIMIT`, so a
template should move it into a file (Open MPI's ``--app``; hydra's ranks read their own line:
the command line then stays the same size whatever the number of hosts and instances, and host
lists are always in files); then the values and program words that cannot be one word of such a
file are passed by name (below; ``by_name`` names them all) or run through :data:`EXEC_ARGV`.
Filters: those of :mod:`poprun_py.render.filters` (``quote``, ``quoted``, ``word``, ``words``,
``fits``) and ``cpulist``.

The context offers no secret value: in ``inst.env`` a ``None`` value means "pass this variable
by name"; its value is in :attr:`RenderedJob.launcher_env`.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    >>> plan = make_plan(cluster, JobSpec(("train.py", "--name", "run 1"), replicas=2))
    >>> job = render_job(plan, "mpirun", job_dir="/tmp/job")
    >>> job.launcher[:6]
    ('mpirun', '--tag-output', '--bind-to', 'none', '--hostfile', '/tmp/job/hostfile')
    >>> job.files["hostfile"]
    'h1 slots=1\\nh2 slots=1\\n'
    >>> job.instances[1].argv, job.instances[1].env["RANK"]
    (('train.py', '--name', 'run 1'), '1')
"""

from __future__ import annotations

import functools
import posixpath
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.core import env as instance_env
from poprun_py.core.plan import HostPlan, InstancePlan, LaunchPlan
from poprun_py.core.topology import Topology
from poprun_py.errors import RenderError, UnknownNameError
from poprun_py.render.binding import Binder, Binding, binds_itself
from poprun_py.render.environment import (
    INSTANCE_TEMPLATE,
    LAUNCHER_TEMPLATES,
    environment,
    render_each,
    render_text,
    split_rendered,
)
from poprun_py.render.filters import (
    NOT_A_WORD,
    carriable,
    carriable_value,
)

if TYPE_CHECKING:
    import jinja2


ARGV_LIMIT = 100 * 1024
"""Command lines longer than this (bytes) move their per-instance part into a file."""
ARGV_MAX = 2 * 1024 * 1024
"""Linux refuses to exec command lines (plus environment) beyond about this size (ARG_MAX)."""
MAX_ARG_STRLEN = 128 * 1024
"""Linux refuses to exec a command with one argument (or environment string) this long."""
EXEC_VAR = "POPRUN_EXEC"
EXEC_ARGV = ("/bin/sh", "-c", 'eval${IFS}"$POPRUN_EXEC"')
"""Runs the program from $POPRUN_EXEC when its words cannot be written to the launcher's syntax
(an Open MPI appfile splits on whitespace and has no quoting; ``:`` separates app contexts).
The script contains no whitespace: the unquoted ``${IFS}`` expands to the word separator."""


@dataclass(frozen=True)
class InstanceCommand:
    """What one instance runs: its argv, its environment, its cwd, the path and contents of its
    shard file, and the binding the backend applies when it starts it (None: unbound, or bound
    by the argv itself, e.g. a template's numactl prefix)."""

    index: int
    host: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    shard_file: str
    shard_text: str
    binding: Binding | None = None


@dataclass(frozen=True)
class RenderedJob:
    """A plan turned into commands for one backend.

    ``instances`` always holds one command per instance (the local and ssh backends run these);
    ``launcher`` is the single whole-job argv for mpirun/mpiexec/srun (empty otherwise);
    ``launcher_env`` holds values the launcher must find in its own environment (secrets and
    values its syntax cannot carry, passed by name); ``files`` maps names relative to
    ``job_dir`` to contents the backend writes before starting (hostfile, appfile);
    ``secrets`` names environment values never to print.
    """

    backend: str
    plan: LaunchPlan
    job_dir: str
    instances: tuple[InstanceCommand, ...]
    launcher: tuple[str, ...] = ()
    launcher_env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()


# ------------------------------------------------------------------ template context


@dataclass(frozen=True)
class Target:
    """A machine as launchers name it (address, or ``localhost`` for simulated hosts) and the
    number of instances it runs: one hostfile line."""

    name: str
    slots: int


@dataclass(frozen=True)
class HostContext:
    """One plan host for templates: ``slots`` is its instance count."""

    index: int
    name: str
    target: Target
    slots: int
    instances: tuple[int, ...]
    plan: HostPlan


@dataclass(frozen=True)
class InstanceContext:
    """One instance for templates.

    ``env`` is ``(name, value)`` pairs in order, ``value`` None for variables passed by name;
    ``exports`` the same as ``NAME=VALUE`` words (``NAME`` alone when passed by name); ``argv``
    is the rendered ``instance.j2`` command; ``launch_argv`` is what a launcher should run for
    it (``argv``, or the binding prefix plus :data:`EXEC_ARGV`); ``numactl`` is the binding as
    a numactl prefix (empty when unbound), for templates that want numactl to bind.
    """

    index: int
    host: HostContext
    local_index: int
    plan: InstancePlan
    binding: Binding | None
    cwd: str | None
    shard_file: str
    argv: tuple[str, ...] = ()
    launch_argv: tuple[str, ...] = ()
    _values: Mapping[str, str] = field(default_factory=dict, repr=False)
    _by_name: frozenset[str] = frozenset()

    @property
    def numactl(self) -> tuple[str, ...]:
        """``numactl --physcpubind=CPUS [--membind=NODES]``, or () when unbound (or when the
        rendered ``argv`` already starts with numactl)."""
        if self.binding is None or binds_itself(self.argv):
            return ()
        words = ["numactl", f"--physcpubind={self.binding.cpus}"]
        if self.binding.nodes:
            words.append(f"--membind={self.binding.nodes}")
        return tuple(words)

    @functools.cached_property
    def env(self) -> tuple[tuple[str, str | None], ...]:
        """The environment as (name, value) pairs; None for values passed by name."""
        hidden = self._by_name
        return tuple([(k, None if k in hidden else v) for k, v in self._values.items()])

    @functools.cached_property
    def exports(self) -> tuple[str, ...]:
        """The environment as ``NAME=VALUE`` words, or ``NAME`` for values passed by name."""
        hidden = self._by_name
        return tuple([k if k in hidden else f"{k}={v}" for k, v in self._values.items()])


@dataclass(frozen=True)
class JobPaths:
    """``files.hostfile`` / ``files["app file"]``: absolute paths inside the job directory."""

    root: str

    def __getitem__(self, name: str) -> str:
        return posixpath.join(self.root, _check_file_name(name))

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]


class _FileCollector:
    """The ``file`` call-block function: ``{% call file("hostfile") %}text{% endcall %}``."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def __call__(self, name: str, caller: Callable[[], str]) -> str:
        if _check_file_name(name) in self.files:
            raise RenderError(f"file {name!r} is written twice")
        self.files[name] = str(caller())
        return ""


# ------------------------------------------------------------------ public API


@dataclass(frozen=True)
class RenderArgs:
    """What a backend adds to rendering: launcher options (``--mpi-args`` plus its own), the
    interface selection (``mpi_subnet``: the MPI daemons' network; ``mpi_network``: the ranks',
    by default the plan's ``--network``, else ``mpi_subnet``), and whether the launcher runs
    as root."""

    mpi_args: tuple[str, ...] = ()
    mpi_subnet: str | None = None
    as_root: bool = False
    mpi_network: str | None = None


def render_job(
    plan: LaunchPlan,
    backend: str,
    *,
    job_dir: str,
    templates_dir: Path | None = None,
    available: Mapping[str, Topology | None] | None = None,
    mpi_args: Sequence[str] = (),
    mpi_subnet: str | None = None,
    as_root: bool = False,
    mpi_network: str | None = None,
    argv_limit: int = ARGV_LIMIT,
    restart_count: int = 0,  # the attempt: POPRUN_RESTART_COUNT of every instance
    forward_signals: Sequence[str] = ("SIGUSR1", "SIGUSR2"),  # --forward-signals, by name
) -> RenderedJob:
    """Render ``plan`` for ``backend``; RenderError (exit 2) names the template and the fault.

    ``available`` maps a host name to the real topology of the machine that runs its instances;
    bindings keep only CPUs and NUMA nodes that exist there. ``argv_limit`` is the command-line
    size above which launchers move per-instance arguments into a file.
    """
    if backend not in LAUNCHER_TEMPLATES:
        raise UnknownNameError("backend", backend, list(LAUNCHER_TEMPLATES))
    jenv = environment(templates_dir)
    job_dir = _normalize_dir(job_dir)
    hosts = _host_contexts(plan)
    checkpoint = forward_signals[0] if forward_signals else instance_env.CHECKPOINT_SIGNAL
    contexts, envs = _instance_contexts(
        plan, hosts, job_dir, available or {}, (restart_count, checkpoint)
    )
    base = _base_context(plan, backend, job_dir, hosts)
    base.update(traps=_traps(forward_signals))
    base.update(mpi_args=tuple(mpi_args), mpi_subnet=mpi_subnet, as_root=as_root)
    base.update(mpi_network=mpi_network)
    argvs = _render_instances(jenv, base, contexts)
    commands = _commands(contexts, argvs, envs)
    secrets = instance_env.secret_names(plan.env)
    template = LAUNCHER_TEMPLATES[backend]
    if template is None:
        return RenderedJob(backend, plan, job_dir, commands, secrets=secrets)
    launch = _Launch(plan, contexts, argvs, envs, secrets)
    launcher, launcher_env, files = _render_launcher(jenv, template, base, launch, argv_limit)
    return RenderedJob(backend, plan, job_dir, commands, launcher, launcher_env, files, secrets)


def _commands(
    contexts: Sequence[InstanceContext],
    argvs: Sequence[tuple[str, ...]],
    envs: Sequence[Mapping[str, str]],
) -> tuple[InstanceCommand, ...]:
    """Each instance's command: its rendered argv and environment, working directory, shard
    file and text, and the binding its backend applies (none when the argv binds itself)."""
    return tuple(
        InstanceCommand(
            c.index,
            c.host.name,
            argv,
            env,
            c.cwd,
            c.shard_file,
            instance_env.shard_text(c.plan),
            None if binds_itself(argv) else c.binding,
        )
        for c, argv, env in zip(contexts, argvs, envs, strict=True)
    )


def _normalize_dir(path: str) -> str:
    if not path:
        raise RenderError("the job directory must not be empty")
    return path.rstrip("/") or "/"


def _check_file_name(name: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise RenderError(f"bad job file name {name!r}: use a plain file name")
    return name


def _host_contexts(plan: LaunchPlan) -> tuple[HostContext, ...]:
    """Hosts with their launcher targets; plan hosts sharing a machine share its slots."""
    names = ["localhost" if plan.cluster.simulated else hp.spec.target for hp in plan.hosts]
    slots: dict[str, int] = {}
    for name, hp in zip(names, plan.hosts, strict=True):
        slots[name] = slots.get(name, 0) + len(hp.instances)
    targets = {name: Target(name, count) for name, count in slots.items()}
    return tuple(
        HostContext(hp.index, hp.name, targets[name], len(hp.instances), hp.instances, hp)
        for name, hp in zip(names, plan.hosts, strict=True)
    )


def _instance_contexts(
    plan: LaunchPlan,
    hosts: Sequence[HostContext],
    job_dir: str,
    available: Mapping[str, Topology | None],
    attempt: tuple[int, str],  # the restart count, the checkpoint signal's name
) -> tuple[list[InstanceContext], list[dict[str, str]]]:
    secrets = instance_env.secret_names(plan.env)
    bind = Binder(plan, available)
    contexts, envs = [], []
    for inst in plan.instances:
        shard_file = posixpath.join(job_dir, f"shard-{inst.index}.txt")
        env = instance_env.instance_env(plan, inst, shard_file, *attempt)
        host = hosts[inst.host_index]
        where = (inst.index, host, inst.local_index, inst, bind(inst), plan.workdir, shard_file)
        contexts.append(InstanceContext(*where, (), (), env, secrets))
        envs.append(env)
    return contexts, envs


def _traps(forward_signals: Sequence[str]) -> str:
    """What a rank's wrapper shell traps (``trap : USR1 USR2 HUP``) to survive what reaches its
    process group: SIGUSR1 and SIGUSR2 always (a stack dump sends SIGUSR1), and every signal
    forwarded."""
    names = ["USR1", "USR2"] + [n.removeprefix("SIG") for n in forward_signals]
    return " ".join(dict.fromkeys(names))


def _base_context(
    plan: LaunchPlan, backend: str, job_dir: str, hosts: tuple[HostContext, ...]
) -> dict[str, Any]:
    targets = tuple({h.target.name: h.target for h in hosts}.values())
    return {
        "backend": backend,
        "plan": plan,
        "program": plan.program,
        "job_dir": job_dir,
        "files": JobPaths(job_dir),
        "hosts": hosts,
        "targets": targets,
        "secrets": instance_env.secret_names(plan.env),
    }


def _render_instances(
    jenv: jinja2.Environment, base: Mapping[str, Any], contexts: Sequence[InstanceContext]
) -> list[tuple[str, ...]]:
    """Render ``instance.j2`` for every instance; equal texts are split once."""
    split: dict[str, tuple[str, ...]] = {}
    argvs = []
    texts = render_each(jenv, INSTANCE_TEMPLATE, ({**base, "inst": ctx} for ctx in contexts))
    for text in texts:
        if text not in split:
            split[text] = split_rendered(text, INSTANCE_TEMPLATE)
        argvs.append(split[text])
    return argvs


# ------------------------------------------------------------------ launchers


@dataclass(frozen=True)
class _Launch:
    """Everything needed to build launcher contexts in either syntax (command line/appfile)."""

    plan: LaunchPlan
    contexts: Sequence[InstanceContext]
    argvs: Sequence[tuple[str, ...]]
    envs: Sequence[Mapping[str, str]]
    secrets: frozenset[str]

    def estimate(self, limit: int) -> int:
        """A generous estimate of the inline command line's size; stops once over ``limit``."""
        total = 0
        for env, argv in zip(self.envs, self.argvs, strict=True):
            # a secret goes by name (its value in the launcher's environment): not counted
            sizes = (len(k) + 8 + (0 if k in self.secrets else len(v)) for k, v in env.items())
            total += 32 + sum(sizes)
            total += sum(len(a) + 3 for a in argv)
            if total > limit:
                break
        return total

    def contexts_for(self, appfile: bool) -> tuple[list[InstanceContext], dict[str, str]]:
        """Instance contexts for one syntax, and the values passed by name (launcher_env)."""
        by_name = self._by_name(appfile)
        launcher_env = self._uniform_values(by_name)
        launch_argvs: dict[tuple[str, ...], tuple[str, ...]] = {}
        result = []
        for ctx, argv, env in zip(self.contexts, self.argvs, self.envs, strict=True):
            if argv not in launch_argvs:
                launch_argvs[argv] = self._launch_argv(argv, appfile)
            launch_argv = launch_argvs[argv]
            values, hidden = env, by_name
            if launch_argv != argv:
                if EXEC_VAR in env:
                    raise RenderError(f"{EXEC_VAR} is reserved for poprun-py; do not set it")
                launcher_env[EXEC_VAR] = "exec " + shlex.join(self.plan.program)
                values, hidden = {**env, EXEC_VAR: ""}, by_name | {EXEC_VAR}
            result.append(_launching(ctx, values, hidden, argv, launch_argv))
        return result, launcher_env

    def _by_name(self, appfile: bool) -> frozenset[str]:
        """Secrets, and variables with a value the launcher's syntax cannot carry."""
        names = set(self.secrets)
        for env in self.envs:
            values = env.values()
            if ":" in values or (appfile and NOT_A_WORD.search("\0".join(values))):
                names.update(k for k, v in env.items() if not carriable_value(v, appfile))
        return frozenset(names)

    def _uniform_values(self, names: Iterable[str]) -> dict[str, str]:
        """The values of variables passed by name: one per variable, the same everywhere."""
        values = {}
        for name in sorted(names):
            seen = {env[name] for env in self.envs}
            if len(seen) > 1:
                example = min(seen, key=lambda v: not NOT_A_WORD.search(v))
                raise RenderError(
                    f"{name} differs between instances and {example!r} cannot be written to an "
                    "Open MPI appfile (whitespace or '#'); check the job directory"
                )
            values[name] = seen.pop()
        return values

    def _launch_argv(self, argv: tuple[str, ...], appfile: bool) -> tuple[str, ...]:
        if all(carriable(a, appfile) for a in argv):
            return argv
        program = self.plan.program
        prefix = argv[: len(argv) - len(program)]
        if argv[len(prefix) :] == program and all(carriable(a, appfile) for a in prefix):
            return prefix + EXEC_ARGV
        bad = next(a for a in argv if not carriable(a, appfile))
        raise RenderError(
            f"{INSTANCE_TEMPLATE}: argument {bad!r} cannot be written to the launcher's "
            "command line, and the command does not end with the program"
        )


def _launching(
    ctx: InstanceContext,
    values: Mapping[str, str],
    by_name: frozenset[str],
    argv: tuple[str, ...],
    launch_argv: tuple[str, ...],
) -> InstanceContext:
    """``ctx`` with its launcher environment and commands."""
    where = (ctx.index, ctx.host, ctx.local_index, ctx.plan, ctx.binding, ctx.cwd, ctx.shard_file)
    return InstanceContext(*where, argv, launch_argv, values, by_name)


def _render_launcher(
    jenv: jinja2.Environment,
    name: str,
    base: Mapping[str, Any],
    launch: _Launch,
    argv_limit: int,
) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
    """Render the launcher inline, or with ``appfile`` when the command line would be too long."""
    appfile = launch.estimate(argv_limit) > argv_limit
    while True:
        contexts, launcher_env = launch.contexts_for(appfile)
        files = _FileCollector()
        context = {**base, "instances": contexts, "appfile": appfile, "file": files}
        context["by_name"] = tuple(launcher_env)
        argv = split_rendered(render_text(jenv, name, context), name)
        size = sum(len(a.encode()) + 1 for a in argv)
        if appfile or size <= argv_limit:
            break
        appfile = True
    longest = max(len(a.encode()) + 1 for a in argv)
    if size > ARGV_MAX or longest > MAX_ARG_STRLEN:
        raise RenderError(
            f"{name}: the command line is {size} bytes, its longest argument {longest}: "
            "more than the OS accepts"
        )
    return argv, launcher_env, files.files
