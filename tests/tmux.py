"""A tmux server of a test's own (its own socket), one window 80 columns wide: what a person
sees on a terminal (``send-keys``, ``capture-pane``).

Example (needs tmux):

    window = Tmux(tmp_path, rows=24)
    window.type("poprun-py plan -H h1,h2 t.py")
    window.wait_for("h2: instances")
    window.close()
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Tmux:
    """One 80-column window of ``rows`` lines running ``sh`` in ``cwd``; ``join``: the screen
    with wrapped lines joined (``capture-pane -J``)."""

    def __init__(self, cwd: Path, rows: int = 60, *, join: bool = True):
        self.socket = f"poprun-test-{uuid.uuid4().hex[:8]}"
        self.join = join
        outside = ("TMUX", "COLUMNS", "LINES", "NO_COLOR")  # the window's own, whatever CI sets
        env = {k: v for k, v in os.environ.items() if not k.startswith(outside)}
        self.env = {**env, "TERM": "xterm", "PYTHONPATH": str(ROOT)}
        self.run("new-session", "-d", "-x", "80", "-y", str(rows), "-s", "t", "-c", str(cwd),
                 "sh")  # fmt: skip

    def run(self, *args: str) -> str:
        argv = ["tmux", "-L", self.socket, *args]
        done = subprocess.run(
            argv, capture_output=True, text=True, env=self.env, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def type(self, line: str) -> None:
        self.run("send-keys", "-t", "t", line, "Enter")

    def screen(self, escapes: bool = False) -> str:
        """The window's text; with SGR escapes when asked (-e)."""
        flags = ["-J"] if self.join else []
        return self.run("capture-pane", "-p", *flags, *(["-e"] if escapes else []), "-t", "t")

    def wait_for(self, pattern: str, within: float = 60.0) -> str:
        deadline = time.monotonic() + within
        while not re.search(pattern, screen := self.screen()):
            assert time.monotonic() < deadline, f"no {pattern!r} on the screen:\n{screen}"
            time.sleep(0.05)
        return screen

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       env=self.env, timeout=30, check=False)  # fmt: skip
