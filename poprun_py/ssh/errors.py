"""Typed SSH failures: each names its host and says in one line why it cannot be used.

Example:

    >>> err = HostKeyError("h2", "host key for h2 does not match known_hosts")
    >>> err.fault().check
    'host key'
"""

from __future__ import annotations

from poprun_py.errors import BackendError, Fault


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


class ConfigError(TransportError):
    """The host's ssh configuration cannot be used (a jump host that cannot be resolved...)."""

    check = "ssh config"
