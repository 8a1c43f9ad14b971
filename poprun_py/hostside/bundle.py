"""How every program of :mod:`poprun_py.hostside` ships to a host that has nothing of poprun-py:
:func:`bundle` inlines each ``from poprun_py.hostside.X import`` of an entry module (recursively,
each module once, dependencies first), :func:`payload` compiles that once per process, and one
bootstrap starts it, ``python -c BOOTSTRAP WHERE ARGS``. It reads the payload from stdin when
WHERE is ``-`` (:func:`over_stdin`: over an SSH channel, with the host's python3), else from the
variable WHERE (:func:`from_env`: an instance's program, a Slurm step's; by name, never in an
argv), refuses a
Python older than 3.7 (exit 3), and runs the code compiled here where the bytecode magic is this
one's, else compiles the source::

    >>> import os, subprocess, tempfile
    >>> env = {"PATH": os.environ["PATH"], "POPRUN_PY_JOB_ROOT": tempfile.mkdtemp()}
    >>> subprocess.run(over_stdin("list"), input=payload("hostops").data, env=env,
    ...                capture_output=True).stdout
    b'[]\\n'
"""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import importlib.util
import marshal
import threading
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "poprun_py.hostside"
PYTHON3 = (  # sh -c PYTHON3 BOOTSTRAP ARGS: the system python3 first (it starts fastest)
    'for p in /usr/bin/python3 python3; do if command -v "$p" >/dev/null 2>&1; then '
    'exec "$p" -S -c "$0" "$@"; fi; done; echo "poprun-py: no python3 on PATH" >&2; exit 127'
)
BOOTSTRAP = (  # reads exactly the payload from stdin (the rest is the program's)
    "import os,sys;w=sys.argv.pop(1)\n"
    "def r(n,b=b''):\n"
    " while len(b)<n:b+=os.read(0,n-len(b)) or sys.exit(3)\n"
    " return b\n"
    "if w=='-':h=r(12);p=h+r(int.from_bytes(h[4:8],'big')+int.from_bytes(h[8:],'big'))\n"
    "else:import binascii;p=binascii.a2b_base64(os.environ.pop(w))\n"
    "if sys.version_info<(3,7):sys.stderr.write('poprun-py: python3 here is %d.%d; poprun-py"
    " needs 3.7 or later on every host\\n'%sys.version_info[:2]);sys.exit(3)\n"
    "n=12+int.from_bytes(p[4:8],'big');m=sys.modules['_frozen_importlib_external'].MAGIC_NUMBER\n"
    "exec(__import__('marshal').loads(p[12:n]) if n>12 and p[:4]==m"
    " else compile(p[n:],'poprun-py','exec'))\n"
)


@dataclass(frozen=True)
class Payload:
    """A program as it ships: compiled here, and its source (run where the magic differs)."""

    code: bytes
    source: bytes
    magic: bytes = importlib.util.MAGIC_NUMBER

    @property
    def data(self) -> bytes:
        """For stdin: the magic, both lengths (4 bytes each), the code, the source."""
        sizes = len(self.code).to_bytes(4, "big") + len(self.source).to_bytes(4, "big")
        return self.magic + sizes + self.code + self.source

    @property
    def text(self) -> str:
        """For an environment variable: :attr:`data` in base64."""
        return base64.b64encode(self.data).decode()


def over_stdin(*args: str) -> list[str]:
    """The host's python3 running a program whose :attr:`Payload.data` comes on stdin."""
    return ["sh", "-c", PYTHON3, BOOTSTRAP, "-", *args]


def from_env(python: str, var: str, *args: str, flags: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``python`` (with ``flags``) running a program whose :attr:`Payload.text` is in the
    variable ``var``."""
    return (python, *flags, "-c", BOOTSTRAP, var, *args)


_LOCK, _BUILT = threading.Lock(), dict[str, Payload]()


def payload(entry: str) -> Payload:
    """``entry``'s payload, built once per process (compiling the agent holds the GIL ~16 ms)."""
    with _LOCK:
        if entry not in _BUILT:
            source = bundle(entry)
            code = marshal.dumps(compile(source, "poprun-py", "exec"))
            _BUILT[entry] = Payload(code, source.encode())
        return _BUILT[entry]


def warm_up(entry: str) -> None:
    """Build ``entry``'s payload ahead of need; a failure is left for its first use to raise."""
    with contextlib.suppress(Exception):
        payload(entry)


def bundle(entry: str) -> str:
    """The source of ``entry`` (a module of this package) with its modules of it inlined."""
    return "from __future__ import annotations\n" + "".join(_module(n)[0] for n in _order(entry))


def _order(name: str) -> list[str]:
    """``name`` and the modules it imports, each once, every module after those it imports."""
    return list(dict.fromkeys([m for dep in _module(name)[1] for m in _order(dep)] + [name]))


@functools.cache
def _module(name: str) -> tuple[str, tuple[str, ...]]:
    """A module's code with its imports of this package and __future__ taken out; their modules."""
    lines = Path(__file__).with_name(f"{name}.py").read_text("utf-8").splitlines(keepends=True)
    deps: list[str] = []
    for node in ast.walk(ast.parse("".join(lines))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        module = "." * node.level + (node.module or "") if isinstance(node, ast.ImportFrom) else ""
        if module == "__future__" or module.startswith(PACKAGE + "."):
            deps += [module[len(PACKAGE) + 1 :]] if module != "__future__" else []
            first, end = node.lineno - 1, node.end_lineno or node.lineno
            alias = "; ".join(f"{a.asname} = {a.name}" for a in node.names if a.asname) or "pass"
            lines[first:end] = [" " * node.col_offset + alias + "\n"] + [""] * (end - first - 1)
        elif any(n.startswith((".", "poprun_py")) for n in [module, *(a.name for a in node.names)]):
            raise ValueError(f"{name}.py:{node.lineno}: write from {PACKAGE}.X import NAMES")
    return "".join(lines), tuple(deps)
