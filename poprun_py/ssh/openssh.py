"""OpenSSH as a transport: one ``ssh`` client process per remote command (or agent), its stdin
and stdout the stream, its stderr kept for the error message.

:func:`ssh_argv` builds the client's argv (a list, never a local shell line): ``ssh -F CFG -T
-o BatchMode=yes [-l USER] [-p PORT] [-o ...] -- HOST COMMAND``, where COMMAND is the one
remote shell line, built and quoted by :func:`poprun_py.ssh.commands.remote_command`. ssh reads
its own configuration: the ``-o`` options are only what the host spec and the flags put first
(``HostName``, ``IdentityFile``, ``UserKnownHostsFile``, ``StrictHostKeyChecking``,
``ConnectTimeout``), as ``ssh -G`` was asked.

:func:`needs_openssh` says what in a host's resolved configuration Paramiko cannot do
(host-based or GSSAPI authentication, ``KnownHostsCommand``, PKCS#11, FIDO keys, connection
sharing); :func:`choose` turns ``--ssh-client auto|paramiko|openssh`` and that into the
transport for the host. :class:`OpenSshConnection` stands where a Paramiko
:class:`~poprun_py.ssh.connection.Connection` stands: ``run`` (``exec``, preflight checks,
jobs), ``spawn`` (an agent: see :meth:`poprun_py.agent.client.AgentConnection.start`).

Example:

    >>> from poprun_py.core.spec import HostSpec
    >>> from pathlib import Path
    >>> s = SshSettings(ssh_config=Path("/lab/cfg"), user="ops", connect_timeout=4.0)
    >>> ssh_argv(HostSpec("n1", port=2222), s, "exec true")[1:]
    ['-F', '/lab/cfg', '-T', '-o', 'BatchMode=yes', '-l', 'ops', '-p', '2222', '-o', \
'ConnectTimeout=4', '--', 'n1', 'exec true']
    >>> needs_openssh({"hostbasedauthentication": ["yes"], "controlmaster": ["false"]})
    ('HostbasedAuthentication yes',)
    >>> needs_openssh({"gssapiauthentication": ["yes"]}, kerberos=False)  # Debian's default
    ()
    >>> choose("auto", ("KnownHostsCommand",), have_ssh=True)
    ('openssh', 'KnownHostsCommand')
    >>> choose("auto", ("KnownHostsCommand",), have_ssh=False)  # no ssh client here
    ('paramiko', '')
    >>> choose("auto", ())
    ('paramiko', '')
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from poprun_py.core.spec import HostSpec
from poprun_py.errors import Fault, PreflightError
from poprun_py.ssh.commands import env_block, remote_command
from poprun_py.ssh.connection import KILL_GRACE, Connection, OutputFn, RemoteResult
from poprun_py.ssh.errors import (
    AuthError,
    Cancelled,
    ConnectionLost,
    HostKeyError,
    RemoteTimeout,
    TransportError,
    UnreachableError,
)
from poprun_py.ssh.settings import CLIENTS, Endpoint, SshSettings, tilde
from poprun_py.ssh.streams import ProcessStream, Stream, end_process

if TYPE_CHECKING:
    import paramiko

THROUGH = "through gateway "  # the reason a tree's host (poprun_py.ssh.tree) uses OpenSSH
POLL = 0.1  # how often a running command looks at its deadline and cancel event
_YES = ("yes", "true")
_AUTH = ("Permission denied", "Too many authentication failures")
_KEY = ("Host key verification failed", "HOST IDENTIFICATION HAS CHANGED", "No host key")
_NET = ("Could not resolve", "Connection refused", "Connection timed out", "No route to host",
        "Network is unreachable", "Connection closed by", "timed out during banner",
        "Invalid argument")  # fmt: skip
_TELLING = (*_AUTH, *_NET[:5], "Invalid argument", "host key is known", "Certificate invalid",
            "was revoked", "HOST IDENTIFICATION HAS CHANGED", "Offending")  # fmt: skip
"""Lines of ssh's that say why, ahead of its closing 'Host key verification failed.'"""


def ssh_binary() -> str | None:
    """The OpenSSH client on PATH, if any."""
    return shutil.which("ssh")


def require_client(client: str) -> None:
    """PreflightError (exit 3, one line) when ``--ssh-client openssh`` finds no ``ssh`` here."""
    if client == "openssh" and ssh_binary() is None:
        why = "--ssh-client openssh: no ssh client on PATH here (Debian: openssh-client)"
        raise PreflightError([Fault("localhost", "ssh client", why)])


def kerberos_here() -> bool:
    """True if this machine has Kerberos to offer (a ticket cache or a krb5 configuration):
    without it, ``GSSAPIAuthentication yes`` (Debian's system default for every host) gets
    no one in."""
    uid = os.getuid()
    return bool(os.environ.get("KRB5CCNAME") or os.environ.get("KRB5_CONFIG")) or any(
        Path(p).exists() for p in ("/etc/krb5.conf", f"/tmp/krb5cc_{uid}")
    )


def needs_openssh(
    options: Mapping[str, Sequence[str]], kerberos: bool | None = None
) -> tuple[str, ...]:
    """What in a host's resolved options (``ssh -G``'s, lower-case keys) Paramiko cannot do;
    ``GSSAPIAuthentication yes`` only where Kerberos is here (``kerberos``, else
    :func:`kerberos_here`)."""

    def first(key: str) -> str:
        values = options.get(key) or ("",)
        return values[0].strip()

    why = (
        ["HostbasedAuthentication yes"] if first("hostbasedauthentication").lower() in _YES else []
    )
    if first("gssapiauthentication").lower() in _YES and (
        kerberos_here() if kerberos is None else kerberos
    ):
        why.append("GSSAPIAuthentication yes")
    for key, name, off in (
        ("knownhostscommand", "KnownHostsCommand", ("", "none")),
        ("pkcs11provider", "PKCS11Provider", ("", "none")),
        ("securitykeyprovider", "SecurityKeyProvider", ("", "internal", "$SSH_SK_PROVIDER")),
        ("controlmaster", "ControlMaster", ("", "false", "no")),
        ("controlpath", "ControlPath", ("", "none")),
    ):
        if first(key) not in off:
            why.append(name)
    if any(_is_sk_key(tilde(path)) for path in options.get("identityfile") or ()):
        why.append("a FIDO (sk) key")
    return tuple(why)


def _is_sk_key(path: str) -> bool:
    """True for an identity whose public key is a FIDO one (``sk-...``)."""
    try:
        with open(f"{path}.pub", encoding="utf-8", errors="replace") as handle:
            return handle.read(3) == "sk-"
    except OSError:
        return False


def choose(wanted: str, needs: Sequence[str], *, have_ssh: bool | None = None) -> tuple[str, str]:
    """The transport for a host (``openssh`` or ``paramiko``) and why OpenSSH ('' if not).
    ``auto`` keeps Paramiko when there is no ``ssh`` here (``have_ssh``: looked up if None)."""
    if wanted not in CLIENTS:
        raise ValueError(wanted)
    if wanted == "openssh":
        return "openssh", "--ssh-client openssh"
    if have_ssh is None:
        have_ssh = ssh_binary() is not None
    if wanted == "auto" and needs and have_ssh:
        return "openssh", ", ".join(needs)
    return "paramiko", ""


def over_openssh(connections: Iterable[Connection]) -> str:
    """One line naming the hosts reached through OpenSSH (as a node set), and why ('' for
    none)."""
    from ClusterShell.NodeSet import NodeSet

    why: dict[str, list[str]] = {}
    gateways: dict[str, list[str]] = {}  # a tree's: gateway -> its hosts
    for conn in connections:
        if isinstance(conn, OpenSshConnection) and conn.why.startswith(THROUGH):
            gateways.setdefault(conn.why.removeprefix(THROUGH), []).append(conn.name)
        elif isinstance(conn, OpenSshConnection):
            why.setdefault(conn.why, []).append(conn.name)
    if not why and not gateways:
        return ""
    parts = [f"{NodeSet.fromlist(names)} ({reason})" for reason, names in why.items()]
    if gateways:
        hosts = NodeSet.fromlist([name for names in gateways.values() for name in names])
        parts.append(f"{hosts} (on their gateways {NodeSet.fromlist(list(gateways))}: --fanout)")
    return "over OpenSSH's ssh: " + "; ".join(parts)


def ssh_argv(
    host: HostSpec, settings: SshSettings, command: str, known: Sequence[Path] = ()
) -> list[str]:
    """The OpenSSH client's argv to run the remote shell line ``command`` on ``host``."""
    return [*ssh_options(host, settings, known), "--", host.name, command]


def ssh_options(host: HostSpec, settings: SshSettings, known: Sequence[Path] = ()) -> list[str]:
    """``ssh`` and its options for ``host``, without the host and command (for ``rsync -e``,
    and ``-s`` for a subsystem). With ``--known-hosts``, the host's known_hosts files are
    ``known`` (its Endpoint's: that file, then the configuration's), as over Paramiko."""
    argv = [ssh_binary() or "ssh"]
    if settings.ssh_config is not None:
        argv += ["-F", str(settings.ssh_config)]
    argv += ["-T", "-o", "BatchMode=yes"]
    user = host.user or settings.user
    if user:
        argv += ["-l", user]
    if host.port:
        argv += ["-p", str(host.port)]
    if host.address:
        argv += ["-o", f"HostName={host.address}"]
    identity = host.identity_file or settings.identity_file
    if identity:
        argv += ["-o", f"IdentityFile={_word(tilde(identity))}", "-o", "IdentitiesOnly=yes"]
    if settings.known_hosts is not None:
        files = known or (settings.known_hosts, Path("~/.ssh/known_hosts"))
        words = " ".join(_word(str(path)) for path in files)
        argv += ["-o", f"UserKnownHostsFile={words}"]
    if settings.accept_new_host_keys:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    argv += ["-o", f"ConnectTimeout={max(1, math.ceil(settings.connect_timeout))}"]
    return argv


def _word(text: str) -> str:
    """One ssh_config argument: in double quotes when it has blanks."""
    return f'"{text}"' if any(c.isspace() for c in text) else text


def transport_error(name: str, stderr: str) -> TransportError:
    """The typed error for an ``ssh`` that could not run the command, from what it said."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Warning: Permanently added", "@"))]
    telling = [ln for ln in lines if any(m in ln for m in _TELLING)]
    said = (telling or lines or ["ssh exited with 255 before the command ran"])[0]
    detail = f"{name}: ssh: {said.removeprefix('ssh: ')}"
    for markers, kind in ((_AUTH, AuthError), (_KEY, HostKeyError), (_NET, UnreachableError)):
        if any(m in stderr for m in markers):
            return kind(name, detail)
    return ConnectionLost(name, detail)


def ssh_failure(name: str, said: str, code: int | None) -> TransportError:
    """Why an agent's ``ssh`` ended before the agent answered, from what it ``said`` on stderr
    and its exit ``code``: ssh's own failure (exit 255) typed, else the remote command's last
    words (no python3...)."""
    if code == 255:
        return transport_error(name, said)
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    if lines:
        return ConnectionLost(name, f"the agent on host {name} ended: {lines[-1]}")
    return ConnectionLost(name, f"the connection to host {name} closed")


class OpenSshConnection(Connection):
    """A host reached through the OpenSSH client: no connection is held; every ``run`` and
    every agent is one ``ssh`` process (its session with ``ControlMaster`` if configured);
    SFTP is one more, on the sftp subsystem. No Paramiko channels here."""

    def __init__(self, host: HostSpec, endpoint: Endpoint, settings: SshSettings, why: str):
        self.host, self.endpoint, self.settings, self.why = host, endpoint, settings, why
        self.via = None
        self._on_close = []
        self._sftp = None
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[bytes]] = set()
        self._children_lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"OpenSshConnection({self.endpoint.user}@{self.endpoint.label})"

    @property
    def alive(self) -> bool:
        """True until closed (each command finds out for itself whether the host answers)."""
        return not self._closed

    @property
    def endpoint_timeout(self) -> float:
        """The connect timeout."""
        return self.settings.connect_timeout

    def options(self) -> list[str]:
        """``ssh`` and its options for this host (:func:`ssh_options`)."""
        return ssh_options(self.host, self.settings, self.endpoint.known_hosts)

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, report_pid: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start ``ssh ... HOST COMMAND`` for ``argv`` (env sent on its stdin first), its three
        streams pipes, in a session of its own; ConnectionLost if it cannot start."""
        return self._start(remote_command(argv, env, None, report_pid=report_pid), env)

    def agent_stream(self, argv: Sequence[str]) -> Stream:
        """The transport seam: ``argv`` run by an ``ssh`` process of its own, as a
        :class:`~poprun_py.ssh.streams.ProcessStream`."""
        return ProcessStream(self.spawn(argv))

    def agent_failure(self, stream: Stream) -> Callable[[], TransportError] | None:
        """ssh's own refusal (typed: unreachable, host key, auth), from what it said."""
        if not isinstance(stream, ProcessStream):
            return None
        return lambda: ssh_failure(self.name, stream.said(), stream.process.returncode)

    def open_channel(self) -> paramiko.Channel:
        """No Paramiko channels over the OpenSSH client."""
        self._unsupported("a channel")

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        report_pid: bool = False,
    ) -> paramiko.Channel:
        """No Paramiko channels over the OpenSSH client: :meth:`spawn` starts a process."""
        self._unsupported("a channel")

    def sftp(self) -> paramiko.SFTPClient:
        """An SFTP session over an ``ssh -s HOST sftp`` process (the sftp subsystem), opened
        once; Paramiko's SFTP client speaks the protocol over its pipes."""
        import paramiko

        with self._lock:
            if self._sftp is None:
                argv = [*self.options(), "-s", "--", self.host.name, "sftp"]
                pipe = _PipeSocket(self._popen(argv))
                try:
                    self._sftp = paramiko.SFTPClient(pipe)  # type: ignore[arg-type]  # send/recv
                except (paramiko.SSHException, OSError, EOFError):
                    pipe.close()
                    raise transport_error(self.name, pipe.stderr()) from None
            return self._sftp

    def _unsupported(self, what: str) -> NoReturn:
        raise ConnectionLost(self.name, f"{self.name}: {what} is not available over OpenSSH")

    def put_text(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write ``text`` to ``path`` (``mode`` before any byte), creating parent directories."""
        script = 'umask 077 && mkdir -p -- "$(dirname -- "$1")" && : > "$1" && chmod "$2" "$1"'
        script += ' && cat > "$1"'
        done = self.run(["sh", "-c", script, "sh", path, f"{mode:o}"], stdin=text.encode())
        if done.exit_code != 0:
            raise ConnectionLost(self.name, f"{self.name}: cannot write {path}: {done.stderr}")

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_output: OutputFn | None = None,
        cancel: threading.Event | None = None,
    ) -> RemoteResult:
        """Run ``argv`` to the end in one ``ssh`` process, as :meth:`Connection.run` does."""
        started = time.monotonic()
        command = remote_command(argv, env, cwd, report_pid=True)
        child = self._start(command, env)
        run = RunOutput(child, on_output)
        threading.Thread(target=_feed, args=(child, stdin), daemon=True).start()
        return self._finish(run, argv, started, timeout, cancel)

    def _finish(
        self,
        run: RunOutput,
        argv: Sequence[str],
        started: float,
        timeout: float | None,
        cancel: threading.Event | None,
    ) -> RemoteResult:
        """Wait for ``run``'s end (or its timeout, or ``cancel``) and give its outcome."""
        child = run.child
        deadline = None if timeout is None else started + timeout
        status = run.wait(deadline, cancel)
        if status != "done":
            self._end(run)
            if status == "cancelled":
                raise Cancelled(self.name, f"{self.label}: {' '.join(argv)} was stopped")
            raise RemoteTimeout(self.name, f"{self.label}: {argv[0]} timed out after {timeout:g} s")
        out, err = run.text()
        if run.pid is None and child.returncode == 255:
            raise transport_error(self.name, err)
        run.release()
        return RemoteResult(self.name, child.returncode, out, err, time.monotonic() - started)

    def _start(self, command: str, env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
        child = self._popen([*self.options(), "--", self.host.name, command])
        if env:
            with contextlib.suppress(OSError):
                os.write(_stdin_fd(child), env_block(env))
        return child

    def _popen(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` (an ``ssh``) with three pipes, in a session of its own, kept for
        :meth:`close`."""
        try:
            child = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                bufsize=0, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise ConnectionLost(self.name, f"{self.name}: cannot start ssh: {exc}") from None
        with self._children_lock:
            self._children = {c for c in self._children if c.poll() is None} | {child}
        return child

    def _end(self, run: RunOutput) -> None:
        """SIGTERM the remote group (SIGKILL after the grace), then end the local ssh."""
        if run.pid is not None and run.pid > 0:
            self.signal_group(run.pid, "TERM")
            if run.wait(time.monotonic() + KILL_GRACE, None) != "done":
                self.signal_group(run.pid, "KILL")
        end_process(run.child)
        run.join()

    def close(self) -> None:
        """End every ssh process this connection started that is still running."""
        self._closed = True
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        with self._children_lock:
            children, self._children = self._children, set()
        for child in children:
            end_process(child)
        for fn in self._on_close:
            with contextlib.suppress(Exception):
                fn()


class _PipeSocket:
    """An ``ssh -s HOST sftp`` process as the socket Paramiko's SFTPClient talks over."""

    def __init__(self, child: subprocess.Popen[bytes]):
        self.child = child
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        self._in, self._out = child.stdin.fileno(), child.stdout.fileno()

    def send(self, data: bytes) -> int:
        """Write some of ``data`` to ssh's stdin."""
        return os.write(self._in, data)

    def recv(self, size: int) -> bytes:
        """Read up to ``size`` bytes of ssh's stdout (b"" at its end)."""
        return os.read(self._out, size)

    def get_name(self) -> str:
        """The name Paramiko's log lines give the session."""
        return f"ssh-sftp-{self.child.pid}"

    def close(self) -> None:
        """End the ssh process."""
        end_process(self.child)

    def stderr(self) -> str:
        """What ssh said, once it has exited."""
        end_process(self.child)
        assert self.child.stderr is not None
        return self.child.stderr.read().decode(errors="replace")


def _stdin_fd(child: subprocess.Popen[bytes]) -> int:
    assert child.stdin is not None
    return child.stdin.fileno()


def _feed(child: subprocess.Popen[bytes], data: bytes | None) -> None:
    """Write ``data`` to the child's stdin, then close it (from a thread: no deadlock)."""
    assert child.stdin is not None
    with contextlib.suppress(OSError, ValueError):
        if data:
            child.stdin.write(data)
    with contextlib.suppress(OSError, ValueError):
        child.stdin.close()


class RunOutput:
    """One ``ssh`` process's output, read by two threads; the remote pid from the first line."""

    def __init__(
        self, child: subprocess.Popen[bytes], on_output: OutputFn | None, pump: bool = True
    ):
        self.child, self.on_output = child, on_output
        self.pid: int | None = None
        self.out, self.err, self._head = bytearray(), bytearray(), bytearray()
        self._held = bytearray()
        self._lock = threading.Lock()
        pipes = ((child.stdout, "stdout"), (child.stderr, "stderr")) if pump else ()
        self._threads = [  # without ``pump``, whoever has the output gives it to :meth:`take`
            threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
            for pipe, name in pipes
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, pipe: Any, stream: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: os.read(pipe.fileno(), 65536), b""):
                self._take(stream, chunk)
        with contextlib.suppress(OSError):
            pipe.close()

    def take(self, stream: str, data: bytes) -> None:
        """``data`` of ``stream`` (``stdout``/``stderr``), as it came."""
        self._take(stream, data)

    def _take(self, stream: str, data: bytes) -> None:
        with self._lock:
            self._taken(stream, data)

    def _taken(self, stream: str, data: bytes) -> None:
        """Keep ``data``; pass it on, except stderr before the command started: until then it
        is ssh's own (a failure becomes one line, :func:`transport_error`)."""
        if stream == "stderr":
            self.err += data
            if self.pid is None:
                self._held += data
                return
        elif self.pid is None:
            self._head += data
            line, sep, rest = self._head.partition(b"\n")
            if not sep:
                return
            self.pid = int(line) if line.strip().isdigit() else -1
            data = bytes(rest)
            self.out += data
            self.release()
        else:
            self.out += data
        if data and self.on_output:
            self.on_output(stream, data)

    def release(self) -> None:
        """Pass on the stderr held back (the command started, or ended without a word)."""
        held, self._held = bytes(self._held), bytearray()
        if held and self.on_output:
            self.on_output("stderr", held)

    def wait(self, deadline: float | None, cancel: threading.Event | None) -> str:
        """Until the process exited and its output is read: ``done``; or ``timeout`` /
        ``cancelled`` first."""
        while True:
            if cancel is not None and cancel.is_set():
                return "cancelled"
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return "timeout"
            step = POLL if cancel is not None else left  # None: no limit
            step = left if step is None or (left is not None and left < step) else step
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(step)
                self.join()
                return "done"

    def join(self) -> None:
        """Wait for the readers (the pipes end with the process, or with its group)."""
        for thread in self._threads:
            thread.join(5.0)

    def text(self) -> tuple[str, str]:
        """stdout and stderr decoded (UTF-8, undecodable bytes replaced)."""
        return self.out.decode(errors="replace"), self.err.decode(errors="replace")
