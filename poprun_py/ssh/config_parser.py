"""The fallback ssh-config reader, for machines without the OpenSSH client: Paramiko's
``SSHConfig`` (``Host``, ``Match``, tokens, first-obtained-value-wins) plus what it lacks:
``Include`` (several paths, globs, ``~``, relative to ``~/.ssh`` or ``/etc/ssh``, nested, inside
``Host``/``Match`` blocks) and the system file ``/etc/ssh/ssh_config`` after the user's.

Includes are inlined: after an included file the enclosing ``Host``/``Match`` line is repeated,
so what follows still belongs to it. Not like OpenSSH: ``Host`` blocks of a file included inside
an inactive block are not suppressed, unknown keywords are not refused, ``Match user`` sees the
configured user rather than ``-l``, and ``Match exec`` needs the ``invoke`` package.

Example:

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "more.conf").write_text("Host n*\\n  User ops\\n")
    >>> _ = (d / "config").write_text(f"Include {d}/*.conf\\nHost *\\n  Port 2222\\n")
    >>> opts = FallbackConfig.load(d / "config", system=None).lookup("n1", None)
    >>> opts["user"], opts["port"]
    (['ops'], ['2222'])
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.errors import UsageError
from poprun_py.ssh.settings import tilde, user_home

if TYPE_CHECKING:
    import paramiko

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
MAX_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_LINE = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*?)\s*$")
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)


def load_paramiko() -> Any:
    """Import paramiko without invoke, which ``paramiko.config`` imports at load time only for
    ``Match exec`` (it costs ~0.2 s of start-up: asyncio, unittest.mock, yaml)."""
    if "paramiko" in sys.modules:
        return sys.modules["paramiko"]
    blocked = "invoke" not in sys.modules
    if blocked:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # makes `import invoke` fail
    try:
        import paramiko
    finally:
        if blocked and sys.modules.get("invoke", 0) is None:
            del sys.modules["invoke"]
    # its transport threads log socket errors after a refused connection is closed: keep them
    # off stderr (Python's last-resort handler), where each refusal is one line of ours
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    return paramiko


@dataclass(frozen=True)
class _Source:
    path: Path
    base: Path  # where relative Include paths are looked up


def inline(source: _Source, depth: int = 0) -> str:
    """The text of ``source`` with every Include replaced by the files it names."""
    try:
        text = source.path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read ssh config {source.path}: {exc.strerror}") from None
    out: list[str] = []
    header = ""
    for number, raw in enumerate(text.splitlines(), 1):
        where = f"{source.path} line {number}"
        line = raw.split("#", 1)[0] if raw.lstrip().startswith("#") else raw
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None or not match.group(2):
            raise UsageError(f"ssh config {where}: expected 'Keyword value', got {raw.strip()!r}")
        keyword, value = match.group(1).lower(), match.group(2)
        if keyword in ("host", "match"):
            header = line.strip()
        if keyword != "include":
            out.append(line.strip())
            continue
        if depth >= MAX_DEPTH:
            raise UsageError(f"ssh config {where}: Include nested too deep (a loop?)")
        for path in _include_paths(value, source.base):
            out.append(inline(_Source(path, source.base), depth + 1))
            if header:
                out.append(header)
    return "\n".join(out) + "\n"


def _include_paths(value: str, base: Path) -> list[Path]:
    found: list[Path] = []
    for raw in value.split():
        word = tilde(raw.strip('"'))
        pattern = word if os.path.isabs(word) else str(base / word)
        found += sorted(Path(p) for p in glob.glob(pattern) if os.path.isfile(p))
    return found


class FallbackConfig:
    """The user's (or ``-F``) file then the system file, Includes inlined, parsed by Paramiko."""

    def __init__(self, config: paramiko.SSHConfig, origin: str):
        self.config = config
        self.origin = origin

    @staticmethod
    def load(path: Path | None, system: Path | None = SYSTEM_CONFIG) -> FallbackConfig:
        """``path`` alone when given (as ``ssh -F``), else ``~/.ssh/config`` and ``system``."""
        user_dir = Path(user_home(), ".ssh")
        if path is not None:
            if not path.is_file():
                raise UsageError(f"cannot read ssh config {path}: no such file")
            sources = [_Source(path, user_dir)]
        else:
            sources = [_Source(user_dir / "config", user_dir)]
            if system is not None:
                sources.append(_Source(system, system.parent))
            sources = [s for s in sources if s.path.is_file()]
        text = "".join(inline(s) + "Host *\n" for s in sources)
        origin = ", ".join(str(s.path) for s in sources) or "no ssh config"
        return FallbackConfig(_parse(text, origin), origin)

    def lookup(self, name: str, user: str | None = None) -> dict[str, list[str]]:
        """The options for ``name``, in :data:`poprun_py.ssh.config.Options` form (``user``,
        from ``-l``, is not seen by ``Match user``: a documented limit)."""
        del user
        pm = load_paramiko()
        try:
            found = self.config.lookup(name)
        except (pm.ConfigParseError, pm.SSHException, OSError) as exc:
            raise UsageError(f"ssh config {self.origin}: {exc}") from None
        return {
            key: [str(v) for v in value] if isinstance(value, list) else [str(value)]
            for key, value in found.items()
        }


def _parse(text: str, origin: str) -> paramiko.SSHConfig:
    pm = load_paramiko()
    try:
        if _MATCH_EXEC.search(text):  # give paramiko the invoke it skipped at import
            import invoke
            import paramiko.config

            paramiko.config.invoke = invoke  # type: ignore[attr-defined]
        config: paramiko.SSHConfig = pm.SSHConfig.from_text(text)
    except ImportError:
        raise UsageError(f"ssh config {origin}: Match exec needs the invoke package") from None
    except pm.ConfigParseError as exc:
        raise UsageError(f"ssh config {origin}: {exc}") from None
    return config
