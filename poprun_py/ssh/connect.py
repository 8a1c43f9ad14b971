"""Opening one connection: resolve the host's configuration, reach it (TCP, ``ProxyCommand``, or
a direct-tcpip channel of a ``ProxyJump`` host's connection, shared by every host behind it),
key exchange asking for the host key types known_hosts can check (certificates first when a CA
is trusted), the host key check (:mod:`poprun_py.ssh.known_hosts`), then public-key
authentication: identity files (with their ``-cert.pub`` and any ``CertificateFile``), then the
agent (``IdentityAgent``), then, for the fallback resolver, the default keys. A host whose
transport is OpenSSH (``--ssh-client``, :func:`poprun_py.ssh.openssh.choose`) gets an
:class:`~poprun_py.ssh.openssh.OpenSshConnection` instead: ``ssh`` itself does all of that.

Example::

    ctx = Context(SshSettings(known_hosts=Path("known_hosts")))
    conn = connect(HostSpec("h1"), ctx.settings, ctx)   # TransportError naming h1 on failure

    >>> Context(SshSettings()).resolver.kind in ("openssh", "paramiko")
    True
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poprun_py.core.spec import HostSpec
from poprun_py.ssh.config import Resolver
from poprun_py.ssh.config_parser import load_paramiko
from poprun_py.ssh.connection import Connection
from poprun_py.ssh.errors import (
    AuthError,
    ConfigError,
    ConnectionLost,
    TransportError,
    UnreachableError,
)
from poprun_py.ssh.known_hosts import (
    CERT_SUFFIX,
    HostKey,
    KnownHosts,
    fingerprint,
    preferred_key_types,
    verify_host_key,
)
from poprun_py.ssh.openssh import OpenSshConnection, choose, needs_openssh, require_client
from poprun_py.ssh.settings import Endpoint, Hop, SshSettings, user_home

if TYPE_CHECKING:
    import paramiko

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
MAX_JUMP_DEPTH = 8


class Context:
    """What every connection of a pool shares: the resolver, known_hosts, parsed keys, and the
    jump hosts' connections (one per jump chain, shared by all hosts behind it)."""

    def __init__(self, settings: SshSettings):
        require_client(settings.ssh_client)
        load_paramiko()
        self.settings = settings
        self.resolver = Resolver(settings)
        self.clients: dict[str, tuple[str, str]] = {}  # host -> (transport, why OpenSSH)
        self.known = KnownHosts()
        self.jumps: dict[tuple[Hop, ...], Connection] = {}
        self._jump_errors: dict[tuple[Hop, ...], tuple[float, TransportError]] = {}
        self._keys: dict[tuple[str, str], paramiko.PKey | None] = {}
        self._locks: dict[tuple[Hop, ...], threading.Lock] = {}
        self._lock = threading.Lock()

    def key(self, path: str, cert: str = "") -> paramiko.PKey | None:
        """The private key at ``path`` (with certificate ``cert``; "-" for none; "" for its
        ``-cert.pub`` if there is one), parsed once; None if missing, encrypted or unreadable."""
        with self._lock:
            if (path, cert) not in self._keys:
                self._keys[(path, cert)] = _load_key(path, cert)
            return self._keys[(path, cert)]

    def client_for(self, host: HostSpec) -> tuple[str, str]:
        """``host``'s transport, ``openssh`` or ``paramiko``, and why OpenSSH ('' if not)."""
        with self._lock:
            if host.name in self.clients:
                return self.clients[host.name]
        needs: tuple[str, ...] = ()
        if self.settings.ssh_client == "auto":
            user = host.user or self.settings.user
            needs = needs_openssh(self.resolver.options(host.name, user, host.port))
        chosen = choose(self.settings.ssh_client, needs)
        with self._lock:
            self.clients[host.name] = chosen
        return chosen

    def jump(self, hops: tuple[Hop, ...], depth: int = 0) -> Connection:
        """The connection to the last of ``hops``, through the ones before it (opened once)."""
        if depth > MAX_JUMP_DEPTH:
            raise ConfigError(hops[-1].host, f"ProxyJump chain through {hops[-1]} loops")
        with self._lock:
            lock = self._locks.setdefault(hops, threading.Lock())
        with lock:
            conn = self.jumps.get(hops)
            if conn is not None and conn.alive:
                return conn
            failed_at, error = self._jump_errors.get(hops, (0.0, None))
            if error is not None and time.monotonic() - failed_at < self.settings.connect_timeout:
                raise error  # hosts behind a dead jump host do not each wait for it again
            try:
                conn = self._open_jump(hops, depth)
            except TransportError as exc:
                self._jump_errors[hops] = (time.monotonic(), exc)
                raise
            self.jumps[hops] = conn
            return conn

    def _open_jump(self, hops: tuple[Hop, ...], depth: int) -> Connection:
        ep = self.resolver.hop(hops[-1])
        via = None
        if len(hops) > 1:  # later hops go through the earlier ones, whatever their config says
            ep = replace(ep, jumps=(), proxy_command=None)
            via = self.jump(hops[:-1], depth + 1)
        elif ep.jumps:  # the first hop's own ProxyJump is honoured, as ssh -J does
            via = self.jump(ep.jumps, depth + 1)
        return open_endpoint(HostSpec(hops[-1].host), ep, self, via)

    def close(self) -> None:
        """Close the jump hosts' connections (after the connections they carry)."""
        for conn in reversed(list(self.jumps.values())):
            with contextlib.suppress(Exception):
                conn.close()
        self.jumps.clear()


def _load_key(path: str, cert: str) -> paramiko.PKey | None:
    import paramiko

    try:
        key = paramiko.PKey.from_path(path)
        if cert == "-":
            key.public_blob = None
        elif cert:
            key.load_certificate(cert)
        return key
    except (OSError, paramiko.SSHException, ValueError, TypeError):
        return None


# ---------------------------------------------------------------- connecting


def connect(host: HostSpec, settings: SshSettings, context: Context | None = None) -> Connection:
    """Open, verify and authenticate one connection; raises a :class:`TransportError`."""
    ctx = context or Context(settings)
    ep = ctx.resolver.endpoint(host)
    client, why = ctx.client_for(host)
    if client == "openssh":
        return OpenSshConnection(host, ep, ctx.settings, why)
    via = None
    if ep.jumps:
        try:
            via = ctx.jump(ep.jumps)
        except TransportError as exc:
            chain = ",".join(str(h) for h in ep.jumps)
            raise type(exc)(ep.name, f"{ep.name}: jump host ({chain}): {exc.detail}") from None
    try:
        conn = open_endpoint(host, ep, ctx, via)
    except BaseException:
        if context is None:
            ctx.close()
        raise
    if context is None:  # a connection of its own: its jump hosts close with it
        conn.on_close(ctx.close)
    return conn


def open_endpoint(
    host: HostSpec, ep: Endpoint, ctx: Context, via: Connection | None = None
) -> Connection:
    """Reach ``ep`` (through ``via`` if given), check its host key and authenticate."""
    import paramiko

    timeout = ctx.settings.connect_timeout
    if ep.connect_timeout:
        timeout = min(timeout, ep.connect_timeout)
    sock = _open_socket(ep, timeout, via)
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
    return Connection(host, ep, transport, via)


def _close_quietly(transport: paramiko.Transport | None, sock: Any) -> None:
    with contextlib.suppress(Exception):
        if transport is not None:
            transport.close()
        sock.close()


def _open_socket(ep: Endpoint, timeout: float, via: Connection | None) -> Any:
    """A TCP socket to the host, a ProxyCommand pipe, or a channel of the jump host's connection;
    failures become one line."""
    import paramiko

    if via is not None:
        return _jump_channel(ep, timeout, via)
    if ep.proxy_command:
        try:
            return paramiko.ProxyCommand(ep.proxy_command)
        except paramiko.SSHException as exc:
            raise UnreachableError(ep.name, f"ProxyCommand of {ep.name} failed: {exc}") from None
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
        if exc.errno in (errno.EHOSTUNREACH, errno.EINVAL):
            reason = "no route to host (is it up? does it need a ProxyJump?)"
        raise UnreachableError(ep.name, f"cannot reach {where}: {reason.lower()}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # many small packets, no delay
    return sock


def _jump_channel(ep: Endpoint, timeout: float, via: Connection) -> Any:
    import paramiko

    where = f"{ep.label} port {ep.port} through {via.label}"
    try:
        return via.transport.open_channel(
            "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=timeout
        )
    except paramiko.ChannelException as exc:
        raise UnreachableError(ep.name, f"cannot reach {where}: {exc.text.lower()}") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise UnreachableError(ep.name, f"cannot reach {where}: {exc}") from None


@functools.cache
def _transport_class() -> Any:
    """paramiko's Transport, asking for host key types in the order we give."""
    import paramiko

    class OrderedTransport(paramiko.Transport):
        host_key_order: tuple[str, ...] = ()

        @property
        def preferred_keys(self) -> tuple[str, ...]:
            return self.host_key_order or tuple(super().preferred_keys)

    return OrderedTransport


def _handshake(ep: Endpoint, sock: Any, ctx: Context, timeout: float) -> paramiko.Transport:
    """Key exchange with timeouts of ``timeout``, then the host key check."""
    transport = _transport_class()(sock)
    # One timeout for every phase: a stalled host fails within connect_timeout, not 15-30 s.
    transport.banner_timeout = transport.handshake_timeout = timeout
    transport.auth_timeout = timeout
    known = ctx.known.lookup(ep.known_hosts, ep.key_names)
    transport.host_key_order = tuple(preferred_key_types(known, transport.preferred_keys))
    transport.start_client(timeout=timeout)
    key = transport.get_remote_server_key()
    peer = sock.getpeername()[0] if isinstance(sock, socket.socket) else None
    verify_host_key(ep, _host_key(key), ctx.known, peer)
    return transport  # type: ignore[no-any-return]


def _host_key(key: paramiko.PKey) -> HostKey:
    blob = key.public_blob
    cert = blob.key_blob if blob is not None and blob.key_type.endswith(CERT_SUFFIX) else None
    return HostKey(key.get_name(), key.asbytes(), cert)


# ---------------------------------------------------------------- authenticating


def _authenticate(ep: Endpoint, transport: paramiko.Transport, ctx: Context) -> None:
    """Offer identity files (certificates first); then the agent's keys and the default keys."""
    import paramiko

    tried: list[str] = []
    agent = None if ep.explicit_identity else _agent(ep)
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


def _agent(ep: Endpoint) -> paramiko.Agent | None:
    """The ssh agent: ``$SSH_AUTH_SOCK``, the ``IdentityAgent`` socket, or none."""
    import paramiko

    if ep.identity_agent == "none":
        return None
    if ep.identity_agent is None:
        return paramiko.Agent()
    agent = paramiko.Agent.__new__(paramiko.Agent)  # an Agent on this socket, not $SSH_AUTH_SOCK
    paramiko.agent.AgentSSH.__init__(agent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(ep.identity_agent)
        agent._connect(sock)  # type: ignore[attr-defined]
    except (OSError, paramiko.SSHException):
        sock.close()
        return None
    return agent


def _candidate_keys(
    ep: Endpoint, ctx: Context, agent: paramiko.Agent | None
) -> Iterable[tuple[str, paramiko.PKey]]:
    files = list(ep.identity_files)
    if not files and ctx.resolver.kind == "paramiko" and agent is not None:
        files = [str(Path(user_home(), ".ssh", n)) for n in DEFAULT_KEYS]
    for path in files:
        if not os.path.exists(path):
            continue
        yield from _file_keys(path, ep, ctx)
    if agent is None:
        return
    for agent_key in agent.get_keys():
        yield f"agent key {fingerprint(agent_key.asbytes())}", agent_key


def _file_keys(path: str, ep: Endpoint, ctx: Context) -> Iterable[tuple[str, paramiko.PKey]]:
    """The identity at ``path``: with each matching CertificateFile, its own ``-cert.pub``,
    then the plain key, as ssh offers them."""
    for cert in ep.certificate_files:
        key = ctx.key(path, cert) if os.path.exists(cert) else None
        if key is not None:
            yield f"{path} with {cert}", key
    key = ctx.key(path)
    if key is None:
        return
    if key.public_blob is not None:
        yield f"{path}-cert.pub", key
        key = ctx.key(path, "-")
        if key is None:
            return
    yield path, key
