"""The Jinja2 environment of every template: where templates are found (``--templates DIR``
first, then the packaged ``templates/``), its bytecode cache, the filters, and the one-line
RenderError (exit 2) that any fault of a template becomes.

Example:

    >>> render_template("sbatch.j2", {}, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    poprun_py.errors.RenderError: ...sbatch.j2...
    >>> "mpirun.j2" in list_templates()
    True
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.core import shellwords
from poprun_py.core.backends import REGISTRY
from poprun_py.core.topology import format_cpulist
from poprun_py.errors import PoprunError, RenderError
from poprun_py.render.filters import fits, quote, quoted, word, words

if TYPE_CHECKING:
    import jinja2

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
INSTANCE_TEMPLATE = "instance.j2"


class _LauncherTemplates(Mapping[str, str | None]):
    """The registry's (:data:`~poprun_py.core.backends.REGISTRY`) launcher templates, read
    when asked: a backend registered later (a test's fake) is one too."""

    def __getitem__(self, name: str) -> str | None:
        return REGISTRY[name].capabilities.launcher_template

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


LAUNCHER_TEMPLATES: Mapping[str, str | None] = _LauncherTemplates()
"""Backend name -> the template of its whole-job launcher (None: instances run directly)."""


def list_templates(templates_dir: Path | None = None) -> tuple[str, ...]:
    """The template names available (packaged ones plus those of ``templates_dir``), sorted."""
    names = {p.name for p in TEMPLATES_DIR.glob("*.j2")}
    if templates_dir is not None:
        names.update(p.name for p in check_dir(templates_dir).glob("*.j2"))
    return tuple(sorted(names))


def render_template(
    name: str, context: Mapping[str, Any], templates_dir: Path | None = None
) -> str:
    """Render any template (e.g. ``sbatch.j2``) with ``context`` and the filters above."""
    return render_text(environment(templates_dir), name, context)


# ------------------------------------------------------------------ Jinja2 environment


def warm_up(backend: str, templates_dir: Path | None = None) -> None:
    """Import Jinja2 and load ``backend``'s templates now (e.g. on a thread, while the hosts are
    checked), so that :func:`render_job` later does not wait for them. Faults are left for
    ``render_job`` to report."""
    import jinja2

    names = (INSTANCE_TEMPLATE, LAUNCHER_TEMPLATES.get(backend))
    with contextlib.suppress(PoprunError, OSError, jinja2.TemplateError):
        jenv = environment(templates_dir)
        for name in names:
            if name is not None:
                jenv.get_template(name)


def environment(templates_dir: Path | None) -> jinja2.Environment:
    user = str(check_dir(templates_dir).resolve()) if templates_dir is not None else None
    return cached_environment(user)


@functools.lru_cache(maxsize=8)
def cached_environment(user_dir: str | None) -> jinja2.Environment:
    import jinja2

    search = [user_dir, str(TEMPLATES_DIR)] if user_dir else [str(TEMPLATES_DIR)]
    jenv = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - shell words, not HTML; quoting is explicit
        keep_trailing_newline=True,
        bytecode_cache=bytecode_cache(),
    )
    jenv.filters.update(quote=quote, quoted=quoted, word=word, words=words, fits=fits)
    jenv.filters.update(cpulist=format_cpulist)
    return jenv


def bytecode_cache() -> Any:
    """Compiled templates kept between runs (keyed by source checksum, so edits take effect):
    compiling them is most of a small render's time. None when no cache dir is writable."""
    import os

    import jinja2

    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    directory = Path(base) / "poprun-py" / "templates"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(directory))


def check_dir(path: Path) -> Path:
    if not path.is_dir():
        raise RenderError(f"templates directory {str(path)!r} does not exist")
    return path


def render_each(
    jenv: jinja2.Environment, name: str, contexts: Iterable[Mapping[str, Any]]
) -> Iterator[str]:
    """Render template ``name`` once per context (loading it once)."""
    with faults(jenv, name):
        template = jenv.get_template(name)
        for context in contexts:
            yield template.render(context)


def render_text(jenv: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    """Render template ``name`` once."""
    return "".join(render_each(jenv, name, [context]))


@contextlib.contextmanager
def faults(jenv: jinja2.Environment, name: str) -> Iterator[None]:
    """Turn every fault of a template into a one-line RenderError naming the template."""
    import jinja2

    try:
        yield
    except jinja2.TemplateNotFound as exc:
        dirs = ", ".join(getattr(jenv.loader, "searchpath", []))
        raise RenderError(f"template {exc.name!r} not found (looked in {dirs})") from None
    except jinja2.TemplateSyntaxError as exc:
        where = f"{exc.filename or exc.name or name}:{exc.lineno}"
        raise RenderError(one_line(f"{where}: syntax error: {exc.message}")) from None
    except jinja2.UndefinedError as exc:
        raise RenderError(one_line(f"{where_in(exc, name)}: {exc.message}")) from None
    except RenderError as exc:
        raise RenderError(one_line(f"{where_in(exc, name)}: {exc}")) from None
    except Exception as exc:  # a user template's own fault (e.g. 1/0) is still bad input
        raise RenderError(one_line(f"{where_in(exc, name)}: {type(exc).__name__}: {exc}")) from None


def where_in(exc: BaseException, name: str) -> str:
    """``path:line`` of the innermost template frame of ``exc`` (Jinja2 rewrites them)."""
    where, tb = name, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            where = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def one_line(message: str) -> str:
    return " ".join(message.split())


def split_rendered(text: str, name: str) -> tuple[str, ...]:
    try:
        argv = tuple(shellwords.split(text))
    except ValueError as exc:
        raise RenderError(f"{name}: output is not valid shell words: {exc}") from None
    if not argv:
        raise RenderError(f"{name}: rendered an empty command")
    return argv


# ------------------------------------------------------------------ building contexts
