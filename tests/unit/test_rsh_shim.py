"""The rsh shim Open MPI runs instead of ssh: argument parsing, the request it sends and how it
relays the answer (against a fake poprun-py at the socket), and the mpirun options naming it."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.hostside import rsh_shim
from poprun_py.hostside.rsh_shim import agent_command, mpirun_args, parse_args, relay, uses_relay

# What Open MPI 4.1 passes (plm_rsh_args "-F cfg", no prefix): options, host, command words.
OPEN_MPI_ARGS = ["-F", "/x/cfg", "198.18.0.12", " orted", "-mca", "ess", '"env"']


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (OPEN_MPI_ARGS, ("198.18.0.12", ' orted -mca ess "env"')),
        (["h1", "echo", "a b", "c"], ("h1", "echo a b c")),  # joined by spaces, as ssh does
        (["-x", "-T", "h1", "true"], ("h1", "true")),
        (["-p", "2222", "-l", "root", "-i", "key", "h1", "true"], ("h1", "true")),
        (["-p2222", "-oBatchMode=yes", "h1", "true"], ("h1", "true")),  # attached arguments
        (["-xqF", "cfg", "h1", "true"], ("h1", "true")),  # flags clustered, the last takes one
        (["-Fcfg", "h1", "-x"], ("h1", "-x")),  # after the host, everything is the command
        (["-x", "--", "-h1", "true"], ("-h1", "true")),
        (["-o", "ProxyCommand=a -b", "user@h1", "true"], ("user@h1", "true")),
    ],
)
def test_parse_args_skips_ssh_options_like_ssh(args: list[str], expected: tuple[str, str]) -> None:
    assert parse_args(args) == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [([], "no host"), (["-F", "cfg"], "no host"), (["-x", "h1"], "no command given for host h1")],
)
def test_parse_args_refuses_a_missing_host_or_command(args: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_args(args)


def test_request_ends_host_and_command_with_nul() -> None:
    assert rsh_shim.request("h1", "echo 'a b'\n") == b"h1\0echo 'a b'\n\0"


def test_relay_writes_records_to_their_streams_until_the_exit_code() -> None:
    out, err = io.BytesIO(), io.BytesIO()
    lines = [b"o first\n", b"e oops\n", b"o \n", b"h\n", b"o two words\n", b"x 7\n", b"o late\n"]
    assert relay(lines, out, err) == 7
    assert out.getvalue() == b"first\n\ntwo words\n"
    assert err.getvalue() == b"oops\n"
    assert relay([b"o cut short\n"], io.BytesIO(), io.BytesIO()) is None


# ---------------------------------------------------------------- the script against a fake


class FakePoprun:
    """A Unix socket that records each request and answers with canned lines, then closes."""

    def __init__(self, path: Path, answer: bytes):
        self.path, self.answer = str(path), answer
        self.requests: list[dict[str, str]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            data = b""
            while data.count(b"\0") < 2:
                data += conn.recv(4096)
            host, command, _ = data.split(b"\0")
            self.requests.append({"host": host.decode(), "command": command.decode()})
            conn.sendall(self.answer)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path (a Unix socket path has at most 107 bytes)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shim-") as name:
        yield Path(name)


def shim(args: list[str], socket_path: str | None) -> subprocess.CompletedProcess[bytes]:
    """The script as Open MPI runs it: ``python -S -I rsh_shim.py ARGS``."""
    env = {k: v for k, v in os.environ.items() if k != rsh_shim.SOCKET_VAR}
    if socket_path is not None:
        env[rsh_shim.SOCKET_VAR] = socket_path
    argv = [sys.executable, "-S", "-I", rsh_shim.__file__, *args]
    return subprocess.run(argv, env=env, capture_output=True, timeout=20, check=False)


def test_the_script_sends_one_request_and_exits_with_the_remote_code(short_tmp: Path) -> None:
    fake = FakePoprun(short_tmp / "s", b"o out line\ne err line\nx 3\n")
    proc = shim(OPEN_MPI_ARGS, fake.path)
    fake.thread.join(5)
    assert fake.requests == [{"host": "198.18.0.12", "command": ' orted -mca ess "env"'}]
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, b"out line\n", b"err line\n")


def test_the_script_exits_255_with_one_line_when_poprun_py_is_gone(short_tmp: Path) -> None:
    gone = shim(["h1", "true"], str(short_tmp / "nothing-here"))
    assert gone.returncode == 255
    assert gone.stderr.decode().count("\n") == 1
    assert "rsh agent (h1): cannot reach poprun-py" in gone.stderr.decode()
    unset = shim(["h1", "true"], None)
    assert unset.returncode == 255 and b"POPRUN_RSH_SOCKET is not set" in unset.stderr
    fake = FakePoprun(short_tmp / "s", b"o partial\n")  # closes without an exit code
    cut = shim(["h1", "true"], fake.path)
    assert (cut.returncode, cut.stdout) == (255, b"partial\n")
    assert b"went away" in cut.stderr
    assert shim(["-x"], fake.path).returncode == 255


# ---------------------------------------------------------------- how poprun-py names it


def test_mpirun_args_name_the_script_unless_the_user_chose_an_agent() -> None:
    args = mpirun_args((), environ={})
    command = agent_command()
    assert command is not None and command.endswith(" -S -I " + rsh_shim.__file__)
    assert args == (
        *("--mca", "plm_rsh_agent", command),
        *("--mca", "plm_rsh_no_tree_spawn", "1"),
        *("--mca", "orte_leave_session_attached", "1"),
    )
    assert uses_relay(("mpirun", *args, "true"))
    assert not uses_relay(("mpirun", "--mca", "plm_rsh_agent", "ssh", "true"))
    assert mpirun_args(("--mca", "plm_rsh_agent", "ssh"), environ={}) == ()
    assert mpirun_args(("--mca", "plm_rsh_assume_same_shell", "0"), environ={}) == ()
    assert mpirun_args((), environ={"OMPI_MCA_plm_rsh_agent": "ssh"}) == ()


def test_past_128_hosts_mpirun_starts_as_many_daemons_at_once_as_hosts() -> None:
    """With sessions attached, Open MPI refuses fewer concurrent starts than daemons (and
    4.1.4 segfaulted at 1,024 hosts): one per host past its default of 128, unless chosen."""
    assert mpirun_args((), environ={}, hosts=128) == mpirun_args((), environ={})
    args = mpirun_args((), environ={}, hosts=1024)
    assert args[-3:] == ("--mca", "plm_rsh_num_concurrent", "1024")
    mine = ("--mca", "plm_rsh_num_concurrent", "64")
    assert "1024" not in mpirun_args(mine, environ={}, hosts=1024)
    env = {"OMPI_MCA_plm_rsh_num_concurrent": "64"}
    assert "1024" not in mpirun_args((), environ=env, hosts=1024)


def test_the_agent_command_starts_with_env_which_every_host_has() -> None:
    """Open MPI's daemons look the agent's first word up on their own host and abort where it
    is missing (the launcher's venv Python): ``/usr/bin/env`` is on every host."""
    command = agent_command("/opt/venv/bin/python", shell="/bin/sh")
    assert command == f"/usr/bin/env /opt/venv/bin/python -S -I {rsh_shim.__file__}"


def test_no_agent_command_that_open_mpi_would_split_or_run_with_csh() -> None:
    assert agent_command("/opt/my python/bin/python3", shell="/bin/bash") is None
    assert agent_command("/opt/a:b/python3", shell="/bin/bash") is None
    assert agent_command("/usr/bin/python3", shell="/bin/tcsh") is None
    assert agent_command("/usr/bin/python3", shell="/bin/bash") is not None
