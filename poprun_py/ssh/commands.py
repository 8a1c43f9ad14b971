"""Remote command lines, built in one place: :func:`remote_command` shell-quotes every word.

Environment values never appear in any command line: they travel on the channel's stdin
(:func:`env_block`), where a short POSIX-shell preamble reads them before ``exec``, so a secret is
neither in the remote process's argv nor in the login shell's.

Example:

    >>> remote_command(["echo", "a b", "$HOME"], cwd="/srv/x y")
    "cd -- '/srv/x y' || exit 1; exec echo 'a b' '$HOME'"
    >>> env_block({"LR": "0.1"})
    b'1\\nexport LR=0.1\\n'
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from poprun_py.core.spec import check_env_name
from poprun_py.errors import UsageError

# Reads the environment block written by env_block() from stdin, one byte at a time (the shell's
# `read` never consumes past a newline on a pipe), so the program still gets the rest of stdin.
_ENV_READER = (
    "IFS= read -r __pr_n || exit 255; __pr_s=; "
    'while [ "$__pr_n" -gt 0 ]; do IFS= read -r __pr_l || exit 255; '
    '__pr_s="$__pr_s$__pr_l\n"; __pr_n=$((__pr_n - 1)); done; '
    'eval "$__pr_s"; unset __pr_n __pr_s __pr_l'
)


def remote_command(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    *,
    report_pid: bool = False,
) -> str:
    """The one place a remote shell command line is built: ``cd`` then ``exec`` of ``argv``.

    With ``env``, the line starts by reading :func:`env_block` from stdin (send it first:
    :meth:`Connection.start` does); the values never appear in the line. With ``report_pid``
    the first line of stdout is the shell's pid, which ``exec`` hands to the program, and which
    is also its process group (sshd starts each session in a new session).
    """
    if not argv:
        raise UsageError("empty remote command")
    parts = ['echo "$$"'] if report_pid else []
    if env:
        parts.append(_ENV_READER)
    if cwd:
        parts.append(f"cd -- {shlex.quote(cwd)} || exit 1")
    parts.append("exec " + " ".join(shlex.quote(word) for word in argv))
    return "; ".join(parts)


def env_block(env: Mapping[str, str]) -> bytes:
    """The stdin prefix :func:`remote_command` reads: a line count, then ``export`` lines."""
    lines = []
    for name, value in env.items():
        check_env_name(name, "environment variable")
        if "\0" in value:
            raise UsageError(f"environment variable {name} contains a NUL byte")
        lines.append(f"export {name}={shlex.quote(value)}\n")
    script = "".join(lines)
    return f"{script.count(chr(10))}\n{script}".encode("utf-8", "surrogateescape")
