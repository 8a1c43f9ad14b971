"""How every program of :mod:`poprun_py.hostside` ships to a host that has nothing of poprun-py.

:func:`bundle` makes an entry module self-contained: each ``from poprun_py.hostside.X import``
in it (found in the source, recursively) is replaced by X's code, each module once, in
dependency order. :func:`payload` compiles that once per process: a host whose Python has this
bytecode magic runs the code as is, any other compiles the source. One bootstrap starts every
program, ``python -c BOOTSTRAP WHERE ARGS``: it reads the payload from stdin when WHERE is ``-``
(the agent and hostops, over an SSH channel, with the host's python3: :func:`over_stdin`), else
from the environment variable WHERE (``check``'s instances: :func:`from_env`; by name, never in
an argv), refuses a Python older than 3.7 in one line (exit 3), and runs it as ``__main__``.

Example (client side; standard library only, run by the host's ``python3 -S``)::

    >>> import os, subprocess, tempfile
    >>> "from poprun_py" in bundle("agent"), "def bound(" in bundle("agent")
    (False, True)
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
PYTHON3 = (
    'for p in /usr/bin/python3 python3; do if command -v "$p" >/dev/null 2>&1; then '
    'exec "$p" -S -c "$0" "$@"; fi; done; echo "poprun-py: no python3 on PATH" >&2; exit 127'
)
"""``sh -c PYTHON3 BOOTSTRAP ARGS``: the host's python3 (the system one first: it starts
fastest) runs the bootstrap; without one, one line and exit 127."""
BOOTSTRAP = (
    "import os,sys\n"
    "w=sys.argv.pop(1)\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c:sys.exit(3)\n"
    "  b+=c\n"
    " return b\n"
    "if w=='-':h=r(12);p=h+r(int.from_bytes(h[4:8],'big')+int.from_bytes(h[8:],'big'))\n"
    "else:import binascii;p=binascii.a2b_base64(os.environ.pop(w))\n"
    "if sys.version_info<(3,7):\n"
    " sys.stderr.write('poprun-py: python3 here is %d.%d; poprun-py needs 3.7 or later"
    " on every host\\n'%sys.version_info[:2]);sys.exit(3)\n"
    "n=12+int.from_bytes(p[4:8],'big')\n"
    "if n>12 and p[:4]==sys.modules['_frozen_importlib_external'].MAGIC_NUMBER:\n"
    " import marshal;exec(marshal.loads(p[12:n]))\n"
    "else:exec(compile(p[n:],'poprun-py','exec'))\n"
)
"""Reads exactly the payload (:attr:`Payload.data`: never more, the rest of stdin is the
program's), or decodes it from the variable WHERE and removes that from the environment."""


@dataclass(frozen=True)
class Payload:
    """A program as it ships: compiled here, and its source (for another magic)."""

    code: bytes
    source: bytes
    magic: bytes = importlib.util.MAGIC_NUMBER

    @property
    def data(self) -> bytes:
        """What the bootstrap reads from stdin: magic, both lengths, code, source."""
        sizes = len(self.code).to_bytes(4, "big") + len(self.source).to_bytes(4, "big")
        return self.magic + sizes + self.code + self.source

    @property
    def text(self) -> str:
        """The same, as an environment variable's value."""
        return base64.b64encode(self.data).decode()


def over_stdin(*args: str) -> list[str]:
    """The host's python3 running a program whose :attr:`Payload.data` comes on stdin."""
    return ["sh", "-c", PYTHON3, BOOTSTRAP, "-", *args]


def from_env(python: str, var: str, *args: str) -> tuple[str, ...]:
    """``python`` running a program whose :attr:`Payload.text` is in the variable ``var``."""
    return (python, "-c", BOOTSTRAP, var, *args)


_LOCK = threading.Lock()


def payload(entry: str) -> Payload:
    """``entry``'s payload, built once per process: compiling the agent takes ~16 ms holding the
    GIL, and 16 hosts' threads asking at once would compile it 16 times."""
    with _LOCK:
        return _payload(entry)


def warm_up(entry: str) -> None:
    """Build ``entry``'s payload ahead of need; a failure is left for its first use to raise."""
    with contextlib.suppress(Exception):
        payload(entry)


@functools.cache
def _payload(entry: str) -> Payload:
    source = bundle(entry)
    return Payload(marshal.dumps(compile(source, "poprun-py", "exec")), source.encode())


def bundle(entry: str, order: list[str] | None = None) -> str:
    """The source of ``entry`` (a module of this package) with its modules of it inlined."""
    order = [] if order is None else order
    for dep in _module(entry)[1]:
        if dep not in order:
            bundle(dep, order)
    order.append(entry)
    return "from __future__ import annotations\n" + "".join(_module(n)[0] for n in order)


@functools.cache
def _module(name: str) -> tuple[str, tuple[str, ...]]:
    """A module's code with its future import and its imports of this package made ``pass``
    (their other lines blank), and the modules those name."""
    lines = Path(__file__).with_name(f"{name}.py").read_text("utf-8").splitlines(keepends=True)
    deps: list[str] = []
    for node in ast.walk(ast.parse("".join(lines))):
        if isinstance(node, ast.Import) and any(a.name.startswith("poprun_py") for a in node.names):
            raise ValueError(f"{name}.py:{node.lineno}: write from {PACKAGE}.X import NAMES")
        if not isinstance(node, ast.ImportFrom):
            continue
        module = "." * node.level + (node.module or "")
        if module.startswith((".", PACKAGE)) and not module.startswith(PACKAGE + "."):
            raise ValueError(f"{name}.py:{node.lineno}: write from {PACKAGE}.X import NAMES")
        if module == "__future__" or module.startswith(PACKAGE + "."):
            deps += [module[len(PACKAGE) + 1 :]] if module != "__future__" else []
            first, end = node.lineno - 1, node.end_lineno or node.lineno
            lines[first:end] = [" " * node.col_offset + "pass\n"] + [""] * (end - first - 1)
    return "".join(lines), tuple(deps)
