"""OpenSSH as a transport (poprun_py/ssh/openssh.py, ProcessStream in poprun_py/agent/stream.py),
without hosts: the client's argv and its one quoted remote line, what ``auto`` picks and why,
ssh's own failures as typed errors, and the agent protocol over a child process. A stand-in
``ssh`` on PATH runs the remote line with ``sh -c`` here, as sshd would on a host; the real
client on real hosts is tests/integration/test_openssh_hosts.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.agent.client import AgentConnection
from poprun_py.agent.stream import ProcessStream
from poprun_py.core.spec import HostSpec
from poprun_py.errors import PreflightError, UsageError
from poprun_py.hostside.bundle import over_stdin, payload
from poprun_py.ssh import openssh
from poprun_py.ssh.commands import remote_command
from poprun_py.ssh.errors import (
    AuthError,
    Cancelled,
    ConnectionLost,
    HostKeyError,
    RemoteTimeout,
    UnreachableError,
)
from poprun_py.ssh.openssh import OpenSshConnection, choose, needs_openssh, ssh_argv
from poprun_py.ssh.settings import Endpoint, SshSettings, check_client

FAKE_SSH = """#!/bin/sh
# a stand-in for ssh: the words after "--" are HOST and the remote line, run here by sh -c
echo "$*" >> "$0.log"
while [ "$1" != "--" ]; do shift; done
case "$2" in
  refused) echo "ssh: connect to host refused port 22: Connection refused" >&2; exit 255 ;;
  denied) echo "root@denied: Permission denied (publickey,hostbased)." >&2; exit 255 ;;
esac
exec sh -c "$3"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    yield ssh


def connection(name: str = "h1", settings: SshSettings | None = None) -> OpenSshConnection:
    ep = Endpoint(name, name, 22, "root", (), False, (name,), (), None)
    return OpenSshConnection(HostSpec(name), ep, settings or SshSettings(), "test")


# ---------------------------------------------------------------- argv and the remote line


def test_the_argv_is_a_list_and_the_remote_line_runs_the_argv_exactly() -> None:
    argv = ["printf", "%s|", "a b", "$HOME", "it's", "`x`", "*"]
    line = remote_command(argv)
    words = ssh_argv(HostSpec("n1"), SshSettings(), line)
    assert words[-3:] == ["--", "n1", line]
    assert words[1:4] == ["-T", "-o", "BatchMode=yes"]
    done = subprocess.run(["sh", "-c", words[-1]], capture_output=True, text=True, check=True)
    assert done.stdout == "a b|$HOME|it's|`x`|*|"


def test_flags_and_the_host_spec_come_first_as_ssh_options() -> None:
    host = HostSpec("n1", address="10.0.0.9", port=2200, user="ops", identity_file="/k/my key")
    settings = SshSettings(
        known_hosts=Path("/lab/kh"), accept_new_host_keys=True, connect_timeout=2.5,
        ssh_config=Path("/lab/cfg"),
    )  # fmt: skip
    words = ssh_argv(host, settings, "true")
    assert words[:3] == [words[0], "-F", "/lab/cfg"]
    pairs = {words[i + 1] for i, w in enumerate(words) if w == "-o"}
    assert {"BatchMode=yes", "HostName=10.0.0.9", 'IdentityFile="/k/my key"'} <= pairs
    assert {"IdentitiesOnly=yes", "StrictHostKeyChecking=accept-new", "ConnectTimeout=3"} <= pairs
    assert "UserKnownHostsFile=/lab/kh ~/.ssh/known_hosts" in pairs
    known = [Path("/lab/kh"), Path("/cfg/known hosts")]  # the Endpoint's: also the config's
    again = ssh_argv(host, settings, "true", known)
    assert 'UserKnownHostsFile=/lab/kh "/cfg/known hosts"' in again
    assert words[words.index("-l") + 1] == "ops" and words[words.index("-p") + 1] == "2200"


# ---------------------------------------------------------------- auto


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"hostbasedauthentication": ["yes"]}, "HostbasedAuthentication yes"),
        ({"gssapiauthentication": ["yes"]}, "GSSAPIAuthentication yes"),
        ({"knownhostscommand": ["/bin/kh %H"]}, "KnownHostsCommand"),
        ({"pkcs11provider": ["/usr/lib/p11.so"]}, "PKCS11Provider"),
        ({"securitykeyprovider": ["/usr/lib/sk.so"]}, "SecurityKeyProvider"),
        ({"controlmaster": ["auto"]}, "ControlMaster"),
        ({"controlpath": ["/tmp/cm-%C"]}, "ControlPath"),
    ],
)
def test_auto_takes_openssh_for_what_paramiko_cannot_do(
    options: dict[str, list[str]], why: str
) -> None:
    assert needs_openssh(options, kerberos=True) == (why,)
    assert choose("auto", needs_openssh(options, kerberos=True), have_ssh=True) == ("openssh", why)
    assert choose("auto", needs_openssh(options, kerberos=True), have_ssh=False) == ("paramiko", "")


def test_gssapi_without_kerberos_here_keeps_paramiko() -> None:
    """Debian's /etc/ssh/ssh_config sets GSSAPIAuthentication yes for every host: without a
    Kerberos configuration or ticket here it gets no one in, and Paramiko stays."""
    assert needs_openssh({"gssapiauthentication": ["yes"]}, kerberos=False) == ()


def test_ssh_g_defaults_need_nothing_and_keep_paramiko() -> None:
    defaults = {
        "hostbasedauthentication": ["no"], "gssapiauthentication": ["no"],
        "securitykeyprovider": ["internal"], "controlmaster": ["false"],
        "identityfile": ["~/.ssh/id_ed25519_sk"],  # an sk key's default name, absent
    }  # fmt: skip
    assert needs_openssh(defaults) == ()
    assert choose("auto", ()) == ("paramiko", "")
    assert choose("paramiko", ("KnownHostsCommand",)) == ("paramiko", "")
    assert choose("openssh", ()) == ("openssh", "--ssh-client openssh")


def test_a_fido_key_needs_openssh(tmp_path: Path) -> None:
    key = tmp_path / "id_sk"
    key.write_text("private")
    Path(f"{key}.pub").write_text("sk-ssh-ed25519@openssh.com AAAA me\n")
    assert needs_openssh({"identityfile": [str(key)]}) == ("a FIDO (sk) key",)


def test_auto_without_an_ssh_client_stays_with_paramiko(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openssh, "ssh_binary", lambda: None)
    assert choose("auto", ("KnownHostsCommand",)) == ("paramiko", "")
    with pytest.raises(PreflightError, match="no ssh client on PATH") as caught:
        openssh.require_client("openssh")
    assert caught.value.exit_code == 3
    openssh.require_client("auto")


def test_a_client_other_than_the_three_is_one_line_exit_2() -> None:
    assert check_client(None) == "auto" and check_client("openssh") == "openssh"
    with pytest.raises(UsageError, match="--ssh-client must be auto, paramiko or openssh"):
        check_client("putty")


@pytest.mark.parametrize(
    ("said", "kind"),
    [
        ("root@h1: Permission denied (publickey).", AuthError),
        ("Host key verification failed.", HostKeyError),
        ("ssh: Could not resolve hostname h1: Name or service not known", UnreachableError),
        ("ssh: connect to host h1 port 22: Connection timed out", UnreachableError),
        ("kex_exchange_identification: read: Connection reset by peer", ConnectionLost),
    ],
)
def test_ssh_failures_are_typed_and_named(said: str, kind: type) -> None:
    error = openssh.transport_error("h1", f"Warning: Permanently added 'h1'\n{said}\n")
    assert type(error) is kind
    assert error.detail == f"h1: ssh: {said.removeprefix('ssh: ')}"


def test_the_line_that_says_why_is_kept_not_sshs_closing_one() -> None:
    said = "No ED25519 host key is known for h1 and you have requested strict checking.\n"
    error = openssh.transport_error("h1", "@@@@\n" + said + "Host key verification failed.\n")
    assert type(error) is HostKeyError
    assert error.detail == f"h1: ssh: {said.strip()}"


# ---------------------------------------------------------------- run, through a stand-in ssh


def test_run_gives_the_commands_exit_code_output_and_env(fake_ssh: Path, tmp_path: Path) -> None:
    conn = connection()
    done = conn.run(
        ["sh", "-c", 'echo "$X $(pwd)"; cat; echo oops >&2; exit 7'],
        stdin=b"in\n", env={"X": "it's x"}, cwd=str(tmp_path),
    )  # fmt: skip
    assert (done.exit_code, done.stdout, done.stderr) == (7, f"it's x {tmp_path}\nin\n", "oops\n")
    assert "it's x" not in Path(f"{fake_ssh}.log").read_text()  # env travels on stdin


def test_a_remote_255_is_the_commands_and_ssh_own_255_a_typed_fault(fake_ssh: Path) -> None:
    assert connection().run(["sh", "-c", "exit 255"]).exit_code == 255
    seen: list[bytes] = []
    with pytest.raises(UnreachableError, match=r"refused: ssh: .*Connection refused"):
        connection("refused").run(["true"], on_output=lambda stream, data: seen.append(data))
    assert seen == []  # ssh's own words are the error's line, not the command's output
    said = connection().run(
        ["sh", "-c", "echo early >&2; exit 4"], on_output=lambda s, d: seen.append(d)
    )
    assert said.exit_code == 4 and seen == [b"early\n"]
    with pytest.raises(AuthError, match=r"denied: ssh: .*Permission denied"):
        connection("denied").run(["true"])


def test_a_timeout_or_cancel_stops_the_remote_group(fake_ssh: Path, tmp_path: Path) -> None:
    conn = connection()
    mark = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(RemoteTimeout):
        conn.run(["sh", "-c", f"sleep 30 & echo $! > {mark}; wait"], timeout=0.5)
    assert time.monotonic() - started < 5
    assert _gone_within(int(mark.read_text()), seconds=5.0)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    with pytest.raises(Cancelled):
        conn.run(["sleep", "30"], cancel=cancel)
    conn.close()


def test_put_text_writes_the_file_with_its_mode(fake_ssh: Path, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "job file"
    connection().put_text(str(target), "text 'quoted'\n", 0o640)
    assert target.read_text() == "text 'quoted'\n"
    assert target.stat().st_mode & 0o777 == 0o640


def _gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` has exited (or is a zombie) before ``seconds`` pass: the group's kill
    is sent when the time-out fires, and the kernel may take a moment under load."""
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ---------------------------------------------------------------- the agent over a process


def test_the_real_agent_answers_over_a_process_stream(fake_ssh: Path) -> None:
    conn = connection()
    stream = ProcessStream(conn.spawn(over_stdin()))
    stream.write(payload("agent").data)
    agent = AgentConnection("h1", stream)
    done = agent.run(["sh", "-c", "echo hi; echo err >&2; exit 3"], timeout=10.0)
    assert (done.exit_code, done.stdout, done.stderr) == (3, "hi\n", "err\n")
    agent.send_eof()
    deadline = time.monotonic() + 10
    while not agent.exited():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    agent.close()
    assert stream.process.poll() is not None


def test_a_process_that_ends_early_gives_its_last_words() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stderr.write('one\\nno python3 here\\n')"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        start_new_session=True,
    )  # fmt: skip
    stream = ProcessStream(child)
    deadline = time.monotonic() + 10
    while not stream.ended():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not stream.ready() and stream.read() == b""
    assert stream.last_words() == "no python3 here"
    with pytest.raises(OSError):
        for _ in range(100):  # the pipe breaks once the process is gone
            stream.write(b"x" * 65536)
    stream.close()


def test_close_ends_the_process_group() -> None:
    child = subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!; wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        start_new_session=True,
    )  # fmt: skip
    stream = ProcessStream(child)
    got = b""
    deadline = time.monotonic() + 10
    while b"\n" not in got:
        assert time.monotonic() < deadline
        got += stream.read()
        time.sleep(0.01)
    stream.close()
    assert child.poll() is not None
    assert _gone_within(int(got), seconds=5.0)


def test_preflight_names_the_hosts_over_openssh_and_why() -> None:
    one, two, three = connection("h1"), connection("h2"), connection("h3")
    object.__setattr__(three, "why", "KnownHostsCommand")
    assert openssh.over_openssh([]) == ""
    assert openssh.over_openssh([one, two, three]) == (
        "over OpenSSH's ssh: h[1-2] (test); h3 (KnownHostsCommand)"
    )


def test_an_agent_whose_ssh_is_refused_is_an_auth_fault_not_a_broken_pipe(fake_ssh: Path) -> None:
    with pytest.raises(AuthError, match=r"denied: ssh: .*Permission denied"):
        AgentConnection.start(connection("denied")).run(["true"], timeout=10.0)


def test_an_agent_that_ends_on_the_host_gives_its_last_words(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("poprun_py.agent.client.over_stdin", lambda: ["sh", "-c", "echo gone >&2"])
    with pytest.raises(ConnectionLost, match="the agent on host h1 ended: gone"):
        AgentConnection.start(connection()).run(["true"], timeout=10.0)


@pytest.mark.parametrize("where", ["flag", "spec"])
def test_a_bad_client_is_one_line_exit_2_before_any_host(tmp_path: Path, where: str) -> None:
    spec = tmp_path / "lab.yaml"
    client = "  client: putty\n" if where == "spec" else ""
    spec.write_text(f"name: lab\nssh:\n  known_hosts: /dev/null\n{client}hosts: [{{name: h1}}]\n")
    flag = ["--ssh-client", "putty"] if where == "flag" else []
    done = subprocess.run(
        [sys.executable, "-m", "poprun_py", "exec", "-c", str(spec), *flag, "--", "true"],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ssh-client must be auto, paramiko or openssh" in lines[0]
