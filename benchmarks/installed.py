"""What the benchmarks run: poprun-py as it is installed, not through a pyenv shim or from source.

``console_script()`` is the ``poprun-py`` script beside this Python (a pyenv shim in front of it
adds ~0.1 s of bash per call). ``compile_package()`` byte-compiles the package first, as
``pip install`` leaves it: an editable checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (as on
these machines) would otherwise compile every module from source on every start (~30 ms).

Example:

    >>> console_script()[-1].endswith(("poprun-py", "poprun_py"))
    True
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def console_script() -> list[str]:
    """The installed ``poprun-py`` script itself, else ``python -m poprun_py``."""
    script = Path(sys.executable).parent / "poprun-py"
    return [str(script)] if script.exists() else [sys.executable, "-m", "poprun_py"]


def compile_package() -> None:
    """Byte-compile ``poprun_py`` (quietly; an unchanged module is not compiled again)."""
    compileall.compile_dir(ROOT / "poprun_py", quiet=1)
