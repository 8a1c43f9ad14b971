"""SSH transport: one paramiko Transport per host, opened in parallel and reused for everything
(preflight, sync, exec, launch).

Like OpenSSH it honours ``~/.ssh/config`` (``HostName``, ``User``, ``Port``, ``IdentityFile``,
``IdentitiesOnly``, ``HostKeyAlias``, ``UserKnownHostsFile``, ``GlobalKnownHostsFile``,
``ProxyCommand``, ``StrictHostKeyChecking accept-new``), the ssh agent and identity files, and
checks host keys against the system, user and extra known_hosts files: a changed key is always
refused, an unknown key only accepted (and recorded) on request. Precedence for user, port and
identity: the :class:`~poprun_py.core.spec.HostSpec`, then :class:`SshSettings` (the command line),
then the ssh config.

Remote command lines are built in one place, :func:`remote_command`, which shell-quotes every
word. Environment values never appear in any command line: they travel on the channel's stdin
(:func:`env_block`), where a short POSIX-shell preamble reads them before ``exec``, so a secret is
neither in the remote process's argv nor in the login shell's.

Example:

    >>> remote_command(["echo", "a b", "$HOME"], cwd="/srv/x y")
    "cd -- '/srv/x y' || exit 1; exec echo 'a b' '$HOME'"
    >>> env_block({"LR": "0.1"})
    b'1\\nexport LR=0.1\\n'

Against real hosts::

    with ConnectionPool(hosts, SshSettings(known_hosts=Path("known_hosts"))) as pool:
        pool.open_all()          # PreflightError listing every host that cannot be used
        outcomes = pool.map(lambda conn: conn.run(["hostname"]))
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import getpass
import hmac
import os
import posixpath
import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from hashlib import sha1
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from poprun_py.core.spec import HostSpec, check_env_name
from poprun_py.errors import BackendError, Fault, PreflightError, UsageError

if TYPE_CHECKING:
    import paramiko

T = TypeVar("T")
OutputFn = Callable[[str, bytes], None]
"""``on_output(stream, data)``: ``stream`` is ``"stdout"`` or ``"stderr"``; data as it arrives."""

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
KILL_GRACE = 2.0
CANCEL_POLL = 0.1
_INLINE_STDIN = 64 * 1024
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE | re.MULTILINE)

# Reads the environment block written by env_block() from stdin, one byte at a time (the shell's
# `read` never consumes past a newline on a pipe), so the program still gets the rest of stdin.
_ENV_READER = (
    "IFS= read -r __pr_n || exit 255; __pr_s=; "
    'while [ "$__pr_n" -gt 0 ]; do IFS= read -r __pr_l || exit 255; '
    '__pr_s="$__pr_s$__pr_l\n"; __pr_n=$((__pr_n - 1)); done; '
    'eval "$__pr_s"; unset __pr_n __pr_s __pr_l'
)


# ---------------------------------------------------------------- settings, results, errors


@dataclass(frozen=True)
class SshSettings:
    """How to reach hosts; the command-line side of the ssh settings."""

    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    ssh_config: Path | None = None
    identity_file: str | None = None
    user: str | None = None

    @staticmethod
    def of(
        *,
        known_hosts: str | None = None,
        ssh_config: str | None = None,
        accept_new_host_keys: bool = False,
        connect_timeout: float = 10.0,
        identity_file: str | None = None,
        user: str | None = None,
    ) -> SshSettings:
        """Settings from the plain strings specs and flags carry (empty means not given)."""
        return SshSettings(
            known_hosts=Path(known_hosts) if known_hosts else None,
            accept_new_host_keys=accept_new_host_keys,
            connect_timeout=connect_timeout,
            ssh_config=Path(ssh_config) if ssh_config else None,
            identity_file=identity_file,
            user=user,
        )


@dataclass(frozen=True)
class RemoteResult:
    """How one remote command ended, with its whole output."""

    host: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float


class TransportError(BackendError):
    """A host that cannot be used over SSH; ``detail`` is one line naming the host."""

    check = "ssh"

    def __init__(self, host: str, detail: str):
        self.host = host
        self.detail = detail
        super().__init__(detail)

    def fault(self) -> Fault:
        """This error as a preflight fault."""
        return Fault(self.host, self.check, self.detail)


class UnreachableError(TransportError):
    """No TCP connection (name unresolvable, refused, no route, timeout)."""

    check = "reachable"


class HostKeyError(TransportError):
    """The host's key is unknown (and not to be accepted) or differs from known_hosts."""

    check = "host key"


class AuthError(TransportError):
    """The host refused every key offered for the user."""

    check = "auth"


class ConnectionLost(TransportError):
    """The connection broke while in use."""

    check = "connection"


class RemoteTimeout(TransportError):
    """A command outlived its timeout and was stopped."""

    check = "timeout"


class Cancelled(TransportError):
    """A command was stopped on request (Ctrl-C)."""

    check = "cancelled"


# ---------------------------------------------------------------- remote command lines


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


# ---------------------------------------------------------------- where to connect


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to reach one host, after the host spec, settings and ssh config."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    explicit_identity: bool
    key_names: tuple[str, ...]
    known_hosts: tuple[Path, ...]
    record_to: Path
    accept_new: bool
    proxy_command: str | None = None

    @property
    def label(self) -> str:
        """``h2 (198.18.0.12)``, or the name alone when it is the address."""
        return self.name if self.hostname == self.name else f"{self.name} ({self.hostname})"


def resolve_endpoint(
    host: HostSpec, settings: SshSettings, options: Mapping[str, Any], home: Path | None = None
) -> Endpoint:
    """Combine a host, the settings and its ssh-config ``options`` (``SSHConfig.lookup``)."""
    home = home or Path.home()
    hostname = host.address or str(options.get("hostname") or host.name)
    port = int(host.port or options.get("port") or 22)
    explicit = host.identity_file or settings.identity_file
    configured = tuple(os.path.expanduser(p) for p in options.get("identityfile") or ())
    identities = (os.path.expanduser(explicit),) if explicit else configured
    default_user = home / ".ssh" / "known_hosts"
    user_files = _paths(options.get("userknownhostsfile"), default_user)
    system_files = _paths(options.get("globalknownhostsfile"), SYSTEM_KNOWN_HOSTS)
    extra = (settings.known_hosts,) if settings.known_hosts else ()
    alias = options.get("hostkeyalias")
    names = (alias,) if alias else tuple(dict.fromkeys((hostname, host.name)))
    strict = str(options.get("stricthostkeychecking", "")).lower()
    only = bool(explicit) or str(options.get("identitiesonly", "")).lower() == "yes"
    proxy = options.get("proxycommand")
    return Endpoint(
        name=host.name,
        hostname=hostname,
        port=port,
        user=host.user or settings.user or str(options.get("user") or getpass.getuser()),
        identity_files=identities,
        explicit_identity=only,
        key_names=tuple(n if port == 22 else f"[{n}]:{port}" for n in names),
        known_hosts=tuple(dict.fromkeys((*extra, *user_files, *system_files))),
        record_to=settings.known_hosts or (user_files[0] if user_files else default_user),
        accept_new=settings.accept_new_host_keys or strict == "accept-new",
        proxy_command=None if proxy in (None, "none") else str(proxy),
    )


def _paths(value: object, default: Path) -> tuple[Path, ...]:
    """Files of a known-hosts option (``/dev/null`` means none); ``default`` when unset."""
    if not value:
        return (default,)
    words = value if isinstance(value, list) else str(value).split()
    return tuple(Path(os.path.expanduser(w)) for w in words if w != "/dev/null")


# ---------------------------------------------------------------- known_hosts


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts line: host patterns, key type and key blob."""

    patterns: tuple[str, ...]
    key_type: str
    blob: bytes
    revoked: bool = False

    def matches(self, name: str) -> bool:
        """True if ``name`` matches a pattern and no negated pattern."""
        hit = False
        for pattern in self.patterns:
            negated = pattern.startswith("!")
            if _pattern_matches(pattern.lstrip("!"), name):
                if negated:
                    return False
                hit = True
        return hit


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            salt, digest = (base64.b64decode(p) for p in pattern[3:].split("|", 1))
        except ValueError:
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), sha1).digest(), digest)
    if "*" not in pattern and "?" not in pattern:
        return name.lower() == pattern.lower()
    # OpenSSH wildcards are only * and ? ('[host]:port' is literal, unlike fnmatch)
    regex = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name.lower()) is not None


def parse_known_hosts(text: str) -> list[KnownKey]:
    """Parse known_hosts text; ``@cert-authority`` lines and malformed lines are skipped."""
    keys = []
    for raw in text.splitlines():
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        revoked = fields[0] == "@revoked"
        if fields[0].startswith("@"):
            if not revoked:
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        keys.append(KnownKey(tuple(fields[0].split(",")), fields[1], blob, revoked))
    return keys


class KnownHosts:
    """known_hosts files, each read once; thread-safe lookups and appends."""

    def __init__(self) -> None:
        self._files: dict[Path, list[KnownKey]] = {}
        self._lock = threading.Lock()

    def _keys(self, path: Path) -> list[KnownKey]:
        with self._lock:
            if path not in self._files:
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    text = ""
                self._files[path] = parse_known_hosts(text)
            return self._files[path]

    def lookup(self, files: Iterable[Path], names: Iterable[str]) -> list[KnownKey]:
        """Every key recorded for any of ``names`` in any of ``files``."""
        names = tuple(names)
        return [k for f in files for k in self._keys(f) if any(k.matches(n) for n in names)]

    def record(self, path: Path, names: Sequence[str], key_type: str, blob: bytes) -> None:
        """Append one line for ``names`` to ``path`` (created 0600, parent 0700)."""
        line = f"{','.join(names)} {key_type} {base64.b64encode(blob).decode()}\n"
        with self._lock:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.write(line)
            self._files.setdefault(path, []).append(KnownKey(tuple(names), key_type, blob))


def _preferred_key_types(known: Sequence[KnownKey], offered: Sequence[str]) -> list[str]:
    """Ask first for the key types known_hosts has for this host (as OpenSSH does)."""
    wanted = {k.key_type for k in known if not k.revoked}
    if "ssh-rsa" in wanted:
        wanted |= {"rsa-sha2-512", "rsa-sha2-256"}
    return [t for t in offered if t in wanted] + [t for t in offered if t not in wanted]


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a key blob."""
    from hashlib import sha256

    return "SHA256:" + base64.b64encode(sha256(blob).digest()).decode().rstrip("=")


def verify_host_key(
    ep: Endpoint, key_type: str, blob: bytes, known: KnownHosts, peer: str | None = None
) -> None:
    """Accept the server key if known_hosts has it; record it if new and allowed; else raise."""
    label = ep.label if peer in (None, ep.hostname) else f"{ep.name} ({peer})"
    keys = known.lookup(ep.known_hosts, ep.key_names)
    if any(k.revoked and k.blob == blob for k in keys):
        raise HostKeyError(ep.name, f"host key for {label} is marked @revoked in known_hosts")
    if any(k.blob == blob for k in keys if not k.revoked):
        return
    if any(not k.revoked for k in keys):
        raise HostKeyError(
            ep.name,
            f"host key for {label} does not match known_hosts: possible man-in-the-middle",
        )
    if not ep.accept_new:
        raise HostKeyError(
            ep.name,
            f"host key for {label} is not in known_hosts ({key_type} {fingerprint(blob)}); "
            "check it, then pass --accept-new-host-keys to record it",
        )
    known.record(ep.record_to, ep.key_names, key_type, blob)


# ---------------------------------------------------------------- shared per-pool state


class _Context:
    """What every connection of a pool shares: ssh config, known_hosts, parsed keys."""

    def __init__(self, settings: SshSettings):
        load_paramiko()
        self.settings = settings
        self.known = KnownHosts()
        self._keys: dict[str, paramiko.PKey | None] = {}
        self._lock = threading.Lock()
        self._config = _load_ssh_config(settings.ssh_config)

    def endpoint(self, host: HostSpec) -> Endpoint:
        options = self._config.lookup(host.name) if self._config else {}
        return resolve_endpoint(host, self.settings, options)

    def key(self, path: str) -> paramiko.PKey | None:
        """The private key at ``path``, parsed once; None if missing, encrypted or unreadable."""
        with self._lock:
            if path not in self._keys:
                self._keys[path] = _load_key(path)
            return self._keys[path]


def load_paramiko() -> Any:
    """Import paramiko without invoke, which ``paramiko.config`` imports at load time only for
    ``Match exec`` (it costs ~0.2 s of start-up: asyncio, unittest.mock, yaml)."""
    import sys

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
    return paramiko


def _load_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    pm = load_paramiko()
    if path is None:
        default = Path.home() / ".ssh" / "config"
        if not default.is_file():
            return None
        path = default
    try:
        text = path.read_text()
        if _MATCH_EXEC.search(text):  # give paramiko the invoke it skipped at import
            import invoke
            import paramiko.config

            paramiko.config.invoke = invoke  # type: ignore[attr-defined]
        config: paramiko.SSHConfig = pm.SSHConfig.from_text(text)
    except (OSError, ImportError, pm.ConfigParseError) as exc:
        raise UsageError(f"cannot read ssh config {path}: {exc}") from None
    return config


def _load_key(path: str) -> paramiko.PKey | None:
    import paramiko

    try:
        return paramiko.PKey.from_path(path)
    except (OSError, paramiko.SSHException, ValueError):
        return None


# ---------------------------------------------------------------- connecting


def connect(host: HostSpec, settings: SshSettings, context: _Context | None = None) -> Connection:
    """Open, verify and authenticate one connection; raises a :class:`TransportError`."""
    load_paramiko()
    import paramiko

    ctx = context or _Context(settings)
    ep = ctx.endpoint(host)
    timeout = settings.connect_timeout
    sock = _open_socket(ep, timeout)
    transport: paramiko.Transport | None = None
    try:
        transport = _handshake(ep, sock, ctx, timeout)
        _authenticate(ep, transport, ctx)
    except paramiko.SSHException as exc:
        _close_quietly(transport, sock)
        raise TransportError(ep.name, f"SSH to {ep.label} failed: {exc}") from None
    except (OSError, EOFError) as exc:
        _close_quietly(transport, sock)
        raise ConnectionLost(ep.name, f"{ep.label} closed the connection: {exc}") from None
    except BaseException:
        _close_quietly(transport, sock)
        raise
    return Connection(host, ep, transport)


def _close_quietly(transport: paramiko.Transport | None, sock: Any) -> None:
    with contextlib.suppress(Exception):
        if transport is not None:
            transport.close()
        sock.close()


def _open_socket(ep: Endpoint, timeout: float) -> Any:
    """A TCP socket to the host (or a ProxyCommand pipe), mapping failures to one line."""
    if ep.proxy_command:
        import paramiko

        return paramiko.ProxyCommand(ep.proxy_command)
    where = f"{ep.label} port {ep.port}"
    try:
        sock = socket.create_connection((ep.hostname, ep.port), timeout=timeout)
    except socket.gaierror as exc:
        raise UnreachableError(ep.name, f"cannot resolve {ep.hostname}: {exc.strerror}") from None
    except TimeoutError:
        raise UnreachableError(
            ep.name, f"cannot reach {where}: no answer within {timeout:g} s"
        ) from None
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno == errno.EHOSTUNREACH:
            reason = "no route to host (is it up?)"
        raise UnreachableError(ep.name, f"cannot reach {where}: {reason.lower()}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # many small packets, no delay
    return sock


def _handshake(ep: Endpoint, sock: Any, ctx: _Context, timeout: float) -> paramiko.Transport:
    """Key exchange with timeouts of ``timeout``, then the host key check."""
    import paramiko

    transport = paramiko.Transport(sock)
    # One timeout for every phase: a stalled host fails within connect_timeout, not 15-30 s.
    transport.banner_timeout = transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    options = transport.get_security_options()
    known = ctx.known.lookup(ep.known_hosts, ep.key_names)
    options.key_types = _preferred_key_types(known, options.key_types)
    transport.start_client(timeout=timeout)
    key = transport.get_remote_server_key()
    peer = sock.getpeername()[0] if isinstance(sock, socket.socket) else None
    verify_host_key(ep, key.get_name(), key.asbytes(), ctx.known, peer)
    return transport


def _authenticate(ep: Endpoint, transport: paramiko.Transport, ctx: _Context) -> None:
    """Offer identity files; without one, the agent's keys then the default keys."""
    import paramiko

    tried: list[str] = []
    agent = None if ep.explicit_identity else paramiko.Agent()
    try:
        for label, key in _candidate_keys(ep, ctx, agent):
            tried.append(label)
            try:
                transport.auth_publickey(ep.user, key)
            except paramiko.BadAuthenticationType as exc:
                allowed = ", ".join(exc.allowed_types) or "none"
                raise AuthError(
                    ep.name, f"{ep.user}@{ep.label} does not accept keys (allows: {allowed})"
                ) from None
            except paramiko.AuthenticationException:
                continue
            if transport.is_authenticated():
                return
    finally:
        if agent is not None:
            agent.close()
    offered = ", ".join(tried) if tried else "no usable key found"
    raise AuthError(ep.name, f"{ep.user}@{ep.label} refused every key (offered: {offered})")


def _candidate_keys(
    ep: Endpoint, ctx: _Context, agent: paramiko.Agent | None
) -> Iterable[tuple[str, paramiko.PKey]]:
    for path in ep.identity_files:
        key = ctx.key(path)
        if key is not None:
            yield path, key
    if agent is None:
        return
    for agent_key in agent.get_keys():
        yield f"agent key {fingerprint(agent_key.asbytes())}", agent_key
    if not ep.identity_files:
        for name in DEFAULT_KEYS:
            path = str(Path.home() / ".ssh" / name)
            key = ctx.key(path) if os.path.exists(path) else None
            if key is not None:
                yield path, key


# ---------------------------------------------------------------- one connection


class Connection:
    """One host's authenticated SSH connection; every channel goes over its one Transport."""

    def __init__(self, host: HostSpec, endpoint: Endpoint, transport: paramiko.Transport):
        self.host = host
        self.endpoint = endpoint
        self.transport = transport
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Connection({self.endpoint.user}@{self.endpoint.label})"

    @property
    def name(self) -> str:
        """The host's name (the pool's key)."""
        return self.host.name

    @property
    def alive(self) -> bool:
        """True while the transport is up."""
        return self.transport.is_active()

    def open_channel(self) -> paramiko.Channel:
        """A new session channel (for streaming); raises ConnectionLost if the host is gone."""
        import paramiko

        try:
            return self.transport.open_session(timeout=self.endpoint_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(self.name, f"lost the connection to {self.label}: {exc}") from None

    @property
    def label(self) -> str:
        """``h2 (198.18.0.12)``."""
        return self.endpoint.label

    @property
    def endpoint_timeout(self) -> float:
        """The handshake timeout, reused for opening channels."""
        return float(self.transport.handshake_timeout)

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        report_pid: bool = False,
    ) -> paramiko.Channel:
        """Start ``argv`` on a new channel (env sent on stdin first); stdin stays open."""
        import paramiko

        chan = self.open_channel()
        try:
            chan.exec_command(remote_command(argv, env, cwd, report_pid=report_pid))
            if env:
                chan.sendall(env_block(env))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise ConnectionLost(self.name, f"lost the connection to {self.label}: {exc}") from None
        return chan

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
        """Run ``argv`` to the end and return its exit code and output.

        ``on_output`` sees output as it arrives. After ``timeout`` seconds, or once ``cancel`` is
        set, the command's process group is sent SIGTERM (SIGKILL 2 s later) and RemoteTimeout
        or Cancelled is raised.
        """
        started = time.monotonic()
        watched = timeout is not None or cancel is not None
        chan = self.start(argv, env=env, cwd=cwd, report_pid=watched)
        with contextlib.closing(chan):
            reader = _Reader(chan, on_output, expect_pid=watched, cancel=cancel)
            _send_stdin(chan, stdin)
            deadline = None if timeout is None else started + timeout
            status = reader.pump(deadline)
            if status != "done":
                self._stop(reader)
                raise self._stopped_error(status, argv, timeout)
            code = chan.exit_status
        if code < 0 and not self.alive:
            raise ConnectionLost(self.name, f"lost the connection to {self.label}")
        code = code if code >= 0 else 255  # killed by a signal: no exit status, 255 like ssh
        out, err = reader.text()
        return RemoteResult(self.name, code, out, err, time.monotonic() - started)

    def _stopped_error(
        self, status: str, argv: Sequence[str], timeout: float | None
    ) -> TransportError:
        if status == "cancelled":
            return Cancelled(self.name, f"{self.label}: {shlex.join(argv)} was stopped")
        return RemoteTimeout(
            self.name, f"{self.label}: {shlex.join(argv)} timed out after {timeout:g} s"
        )

    def signal_group(self, pgid: int, signame: str = "TERM") -> None:
        """Send ``signame`` to the remote process group ``pgid`` (over a new channel)."""
        with contextlib.suppress(TransportError):
            self.run(["kill", "-s", signame, "--", f"-{pgid}"], timeout=None)

    def _stop(self, reader: _Reader) -> None:
        """SIGTERM the command's process group; SIGKILL if it is still there after the grace."""
        if reader.pid is None or reader.pid <= 0:
            return
        self.signal_group(reader.pid, "TERM")
        reader.cancel = None
        if reader.pump(time.monotonic() + KILL_GRACE) != "done":
            self.signal_group(reader.pid, "KILL")

    def sftp(self) -> paramiko.SFTPClient:
        """This connection's SFTP session, opened once."""
        import paramiko

        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(self.transport)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise ConnectionLost(self.name, f"no SFTP on {self.label}: {exc}") from None
                if self._sftp is None:
                    raise ConnectionLost(self.name, f"no SFTP on {self.label}")
            return self._sftp

    def put_text(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write ``text`` to the remote ``path`` with ``mode`` (set before any byte is written),
        creating parent directories."""
        sftp = self.sftp()
        makedirs(sftp, posixpath.dirname(path))
        with sftp.open(path, "w") as handle:
            handle.chmod(mode)
            handle.write(text.encode("utf-8", "surrogateescape"))

    def close(self) -> None:
        """Close SFTP and the transport."""
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self.transport.close()


def makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP."""
    if path in ("", "/", "."):
        return
    try:
        sftp.stat(path)
        return
    except OSError:
        pass
    makedirs(sftp, posixpath.dirname(path))
    with contextlib.suppress(OSError):  # created meanwhile by another writer
        sftp.mkdir(path)


def _send_stdin(chan: paramiko.Channel, data: bytes | None) -> None:
    """Send ``data`` then EOF; large inputs go from a thread so output cannot deadlock."""
    if not data:
        chan.shutdown_write()
        return
    if len(data) <= _INLINE_STDIN:
        chan.sendall(data)
        chan.shutdown_write()
        return

    def send() -> None:
        with contextlib.suppress(OSError, EOFError):
            chan.sendall(data)
            chan.shutdown_write()

    threading.Thread(target=send, daemon=True, name="poprun-stdin").start()


@dataclass
class _Reader:
    """Collects a channel's stdout and stderr; strips the pid line when one is expected."""

    chan: paramiko.Channel
    on_output: OutputFn | None
    expect_pid: bool
    cancel: threading.Event | None = None
    pid: int | None = None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    _head: bytearray = field(default_factory=bytearray)

    def pump(self, deadline: float | None) -> str:
        """Read until EOF and the exit status: ``done``, or ``timeout`` / ``cancelled`` first."""
        chan = self.chan
        while not (chan.eof_received or chan.closed):
            wait = self._wait(deadline)
            if wait is not None and wait <= 0:
                return self._why()
            select.select([chan], [], [], wait)
            self.drain()
        self.drain()
        while not (chan.status_event.is_set() or chan.closed):
            wait = self._wait(deadline)
            if wait is not None and wait <= 0:
                return self._why()
            chan.status_event.wait(wait)
        return "done"

    def _wait(self, deadline: float | None) -> float | None:
        """How long to block: until the deadline, in short steps while cancellable."""
        if self.cancel is not None and self.cancel.is_set():
            return 0.0
        wait = None if deadline is None else deadline - time.monotonic()
        if self.cancel is not None:
            wait = CANCEL_POLL if wait is None else min(wait, CANCEL_POLL)
        return wait

    def _why(self) -> str:
        return "cancelled" if self.cancel is not None and self.cancel.is_set() else "timeout"

    def drain(self) -> None:
        """Take whatever output has arrived."""
        while self.chan.recv_ready():
            self._stdout(self.chan.recv(65536))
        while self.chan.recv_stderr_ready():
            data = self.chan.recv_stderr(65536)
            self.err += data
            if self.on_output:
                self.on_output("stderr", data)

    def _stdout(self, data: bytes) -> None:
        if self.expect_pid and self.pid is None:
            self._head += data
            line, sep, rest = self._head.partition(b"\n")
            if not sep:
                return
            self.pid = int(line) if line.strip().isdigit() else -1
            data = bytes(rest)
        if data:
            self.out += data
            if self.on_output:
                self.on_output("stdout", data)

    def text(self) -> tuple[str, str]:
        """stdout and stderr decoded (UTF-8, undecodable bytes replaced)."""
        return self.out.decode(errors="replace"), self.err.decode(errors="replace")


# ---------------------------------------------------------------- many hosts


class ConnectionPool:
    """Connections to many hosts, opened in parallel and reused; a context manager."""

    def __init__(self, hosts: Sequence[HostSpec], settings: SshSettings, max_workers: int = 64):
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise UsageError("a host is listed twice")
        self.hosts = tuple(hosts)
        self.settings = settings
        self.connections: dict[str, Connection] = {}
        self.errors: dict[str, TransportError] = {}
        self._context = _Context(settings)
        self._workers = max(1, min(max_workers, len(self.hosts)))
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _parallel(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | BaseException]:
        if not items:
            return []
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="poprun-ssh")
        futures = [self._executor.submit(fn, item) for item in items]
        outcomes: list[T | BaseException] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except BaseException as exc:  # keep every host's outcome
                outcomes.append(exc)
        return outcomes

    def _open(self, host: HostSpec) -> Connection:
        """The host's connection, opened now if needed; failures are remembered in ``errors``."""
        with self._lock:
            conn = self.connections.get(host.name)
        if conn is not None:
            return conn
        try:
            conn = connect(host, self.settings, self._context)
        except TransportError as exc:
            with self._lock:
                self.errors[host.name] = exc
            raise
        with self._lock:
            self.connections[host.name] = conn
            self.errors.pop(host.name, None)
        return conn

    def connect_all(self) -> dict[str, TransportError]:
        """Open every host not yet open; return the hosts that failed, with why."""
        todo = [h for h in self.hosts if h.name not in self.connections]
        failed: dict[str, TransportError] = {}
        for host, outcome in zip(todo, self._parallel(self._open, todo), strict=True):
            if isinstance(outcome, TransportError):
                failed[host.name] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        return failed

    def open_all(self) -> dict[str, Connection]:
        """Open every host; raise PreflightError with one fault per host that cannot be used."""
        failed = self.connect_all()
        if failed:
            raise PreflightError([failed[h.name].fault() for h in self.hosts if h.name in failed])
        return dict(self.connections)

    def map(
        self,
        fn: Callable[[Connection], T],
        hosts: Iterable[str] | None = None,
        *,
        connect: bool = False,
    ) -> dict[str, T | BaseException]:
        """``fn`` on every open connection (or those of ``hosts``) in parallel; every outcome.

        With ``connect``, hosts not yet open are connected first, each in its own worker (so a
        host starts ``fn`` as soon as it is up); a host that cannot be reached yields its
        TransportError.
        """
        wanted = set(hosts) if hosts is not None else None
        todo = [
            h
            for h in self.hosts
            if (connect or h.name in self.connections) and (wanted is None or h.name in wanted)
        ]
        outcomes = self._parallel(lambda host: fn(self._open(host)), todo)
        return {h.name: out for h, out in zip(todo, outcomes, strict=True)}

    def close(self) -> None:
        """Close every connection and the worker threads."""
        for conn in self.connections.values():
            with contextlib.suppress(Exception):
                conn.close()
        self.connections.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
