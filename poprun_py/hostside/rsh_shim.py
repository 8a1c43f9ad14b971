"""The remote-shell agent of poprun-py's MPI launches: orted (Open MPI) or hydra_pmi_proxy
(MPICH) through the host's agent.

A remote ``--backend mpirun`` launch already has one agent per host
(:mod:`poprun_py.hostside.agent`, started over its SSH connection for preflight). Rather than
let Open MPI open one more SSH connection and login session per host, poprun-py runs mpirun with
``--mca plm_rsh_agent "/usr/bin/env <python> -S -I <this file>"`` and ``POPRUN_RSH_SOCKET``
naming a Unix socket it serves (:mod:`poprun_py.agent.relay`). Open MPI runs this script as it
would run ssh, ``[SSH OPTIONS] HOST COMMAND WORDS...``, and the script:

1. skips the ssh options (and the argument of those that take one, per ssh(1));
2. sends ``HOST``, NUL, ``COMMAND WORDS`` joined by spaces, NUL to the socket (no argument can
   hold a NUL, so no quoting is needed);
3. relays the reply, one record a line -- ``o TEXT`` to its stdout, ``e TEXT`` to its stderr --
   until ``x CODE``, and exits with CODE (the remote command's exit code, as ssh does).

When the host is unknown, poprun-py is gone or the request is malformed it says so in one stderr
line and exits 255, as ssh does when it cannot connect. Standard library only, and no import of
poprun_py: it runs with ``-S -I``, imports nothing Python does not load at start-up but
``_socket``, and starts in about 15 ms.

MPICH's hydra takes one executable path (``-launcher ssh -launcher-exec PATH``) and runs it as
``PATH -x HOST COMMAND WORDS...``: :func:`launcher_exec` writes (once) a two-line ``/bin/sh``
script that execs this one with ``-S -I``.

Example:

    >>> parse_args(["-F", "/etc/cfg", "-x", "-p22", "h1", " orted", "-mca", "ess", '"env"'])
    ('h1', ' orted -mca ess "env"')
"""

from __future__ import annotations

import _socket  # not socket, json or typing: their imports would treble the start-up time
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from typing import BinaryIO

SOCKET_VAR = "POPRUN_RSH_SOCKET"
EXIT_ERROR = 255
WITH_ARGUMENT = frozenset("BbcDEeFIiJLlmOoPpQRSWw")
"""ssh(1) options that take an argument (attached, ``-p22``, or the next word)."""


def parse_args(args: Sequence[str]) -> tuple[str, str]:
    """``(host, command)`` from ssh-style arguments; ValueError when one of them is missing."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            i += 1
            break
        i += 1 + _takes_next(args[i])
    if i >= len(args):
        raise ValueError("no host given")
    if i + 1 >= len(args):
        raise ValueError(f"no command given for host {args[i]}")
    return args[i], " ".join(args[i + 1 :])


def _takes_next(option: str) -> int:
    """1 when ``option`` (a cluster of flags such as ``-xF``) ends with one taking the next word."""
    for pos, letter in enumerate(option[1:], start=1):
        if letter in WITH_ARGUMENT:
            return 1 if pos == len(option) - 1 else 0
    return 0


def request(host: str, command: str) -> bytes:
    """The request: host and command, each ending with NUL (which no argument can contain)."""
    return os.fsencode(host) + b"\0" + os.fsencode(command) + b"\0"


def received_lines(sock: _socket.socket) -> Iterator[bytes]:
    """The lines ``sock`` receives (without their newline) until it closes."""
    buffer, chunk = b"", sock.recv(65536)
    while chunk:
        *lines, buffer = (buffer + chunk).split(b"\n")
        yield from lines
        chunk = sock.recv(65536)


def relay(lines: Iterable[bytes], out: BinaryIO, err: BinaryIO) -> int | None:
    """Write ``o``/``e`` records to ``out``/``err`` until ``x CODE``: CODE, or None if none came."""
    for line in lines:
        kind, _, text = line.removesuffix(b"\n").partition(b" ")
        if kind == b"x":
            return int(text)
        stream = out if kind == b"o" else err if kind == b"e" else None
        if stream is not None:
            try:
                stream.write(text + b"\n")
                stream.flush()
            except OSError:  # nobody reads (mpirun is gone): keep relaying to the exit code
                pass
    return None


def fail(host: str, message: str) -> int:
    """One line on stderr, as ssh would print it, and ssh's own failure code."""
    where = f" ({host})" if host else ""
    sys.stderr.write(f"poprun-py rsh agent{where}: {message}\n")
    return EXIT_ERROR


def run(args: Sequence[str], path: str | None) -> int:
    """Send the request to the poprun-py at ``path`` and relay its answer; the exit code."""
    try:
        host, command = parse_args(args)
    except ValueError as exc:
        return fail("", str(exc))
    if not path:
        return fail(host, f"{SOCKET_VAR} is not set (only poprun-py's MPI launches use this)")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
            sock.sendall(request(host, command))
        except OSError as exc:
            why = exc.strerror or exc
            return fail(host, f"cannot reach poprun-py ({why}): is it still running?")
        try:
            code = relay(received_lines(sock), sys.stdout.buffer, sys.stderr.buffer)
        except (OSError, ValueError) as exc:
            return fail(host, f"lost poprun-py: {exc}")
    finally:
        sock.close()
    return code if code is not None else fail(host, "poprun-py went away before the command ended")


# ---------------------------------------------------------------- how poprun-py names this script

RELAYED_PARAMS = ("rsh_agent", "assume_same_shell")
"""mpirun options (``--mca ...``, ``OMPI_MCA_...``) by which the user chose how daemons start."""
CSH_SHELLS = frozenset(("csh", "tcsh"))
CONCURRENT = "plm_rsh_num_concurrent"
RSH_CONCURRENT = 128  # Open MPI's default number of daemons started at once


ENV = "/usr/bin/env"
"""The agent's first word: every Open MPI daemon looks ``plm_rsh_agent``'s first word up on its
own host, even with no tree spawn, and aborts (4.1.4 then segfaults) where it is missing -- as
the launcher's Python is on hosts that do not share its path (a venv, pyenv under ``/root``):
every ``launch --backend mpirun`` on such hosts failed with exit 139."""


def agent_command(python: str = sys.executable, shell: str | None = None) -> str | None:
    """``/usr/bin/env <python> -S -I <this file>`` for ``plm_rsh_agent`` (without ``env`` where
    this host has none: :data:`ENV`), or None when Open MPI could not use it: whitespace or ':'
    in a path (Open MPI splits the value into words on whitespace and into alternatives on
    ':'), or a csh-like local login shell (Open MPI then writes the remote command in csh
    syntax, which the agents' ``/bin/sh`` cannot run)."""
    here = os.path.abspath(__file__)
    if not python or any(c.isspace() or c == ":" for c in python + here):
        return None
    if os.path.basename(shell if shell is not None else _login_shell()) in CSH_SHELLS:
        return None
    lead = f"{ENV} " if os.access(ENV, os.X_OK) else ""
    return f"{lead}{python} -S -I {here}"


def _login_shell() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        return ""


def mpirun_args(
    user_args: Sequence[str], environ: Mapping[str, str] = os.environ, hosts: int = 0
) -> tuple[str, ...]:
    """The mpirun options that start Open MPI's daemons through this script: the agent, no tree
    spawn (mpirun starts every daemon itself: the relay is on this machine only) and sessions
    left attached (without it, a daemon started that way daemonizes and leaves the agent's
    session at once). Past :data:`RSH_CONCURRENT` ``hosts``, as many concurrent daemon starts
    as hosts: with sessions attached each start lasts as long as its daemon, so Open MPI refuses
    fewer (and 4.1.4 then segfaults), unless the user chose a number. ``()`` when the user chose
    (``--mca`` or ``OMPI_MCA_``) how daemons start, or :func:`agent_command` is None."""
    chosen = [a for a in user_args if any(p in a for p in RELAYED_PARAMS)]
    chosen += [k for k in environ if k.startswith("OMPI_MCA_") and "rsh_agent" in k]
    command = agent_command()
    if chosen or command is None:
        return ()
    given = any(CONCURRENT in a for a in [*user_args, *environ])
    concurrent = ("--mca", CONCURRENT, str(hosts)) if hosts > RSH_CONCURRENT and not given else ()
    return (
        *("--mca", "plm_rsh_agent", command),
        *("--mca", "plm_rsh_no_tree_spawn", "1"),
        *("--mca", "orte_leave_session_attached", "1"),
        *concurrent,
    )


def uses_relay(launcher: Sequence[str]) -> bool:
    """True when a rendered mpirun or mpiexec argv starts its daemons through this script."""
    command = agent_command()
    if command is not None and command in launcher:
        return True
    return "-launcher-exec" in launcher and exec_script_path() in launcher


EXEC_SCRIPT = "poprun-rsh-agent"


def exec_script(python: str = sys.executable) -> str:
    """The text of a one-path executable that runs this script as :func:`agent_command` does."""
    import shlex

    here = shlex.quote(os.path.abspath(__file__))
    return f'#!/bin/sh\nexec {shlex.quote(python)} -S -I {here} "$@"\n'


def exec_script_path(python: str = sys.executable, environ: Mapping[str, str] = os.environ) -> str:
    """Where :func:`launcher_exec` keeps that executable: named by a digest of its text, in
    poprun-py's cache directory (``$XDG_CACHE_HOME/poprun-py``, else ``~/.cache/poprun-py``)."""
    import hashlib

    digest = hashlib.sha256(exec_script(python).encode()).hexdigest()[:12]
    base = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "poprun-py", f"{EXEC_SCRIPT}-{digest}")


def launcher_exec(python: str = sys.executable, environ: Mapping[str, str] = os.environ) -> str:
    """:func:`exec_script_path`, written (mode 0700, atomically) unless it is there already."""
    path = exec_script_path(python, environ)
    if not os.access(path, os.X_OK):
        from poprun_py.hostside.private import private_dir, write_private  # not on the hosts

        private_dir(os.path.dirname(path))
        write_private(path, exec_script(python), mode=0o700)
    return path


def main() -> None:
    """Entry point: ``python -S -I rsh_shim.py [SSH OPTIONS] HOST COMMAND...``."""
    sys.exit(run(sys.argv[1:], os.environ.get(SOCKET_VAR)))


if __name__ == "__main__":
    main()
