"""How to reach hosts: :class:`SshSettings` (the command line's and spec's side, built by
:func:`settings_for` alone) and :class:`Endpoint` (one host after the host spec, the settings and
its ssh configuration).

Precedence for user, port and identity: the :class:`~poprun_py.core.spec.HostSpec`, then
:class:`SshSettings`, then the ssh configuration (OpenSSH's own ``ssh -G`` or the fallback parser,
:mod:`poprun_py.ssh.config`).

Example:

    >>> SshSettings.of(connect_timeout=5.0, user="me").user
    'me'
    >>> from poprun_py.core.spec import ClusterSpec, Defaults, SshOptions
    >>> spec = ClusterSpec("lab", (), known_hosts="/lab/kh", defaults=Defaults(connect_timeout=4))
    >>> s = settings_for(spec, SshOptions(user="ops"))
    >>> str(s.known_hosts), s.user, s.connect_timeout
    ('/lab/kh', 'ops', 4.0)
    >>> settings_for(spec, SshOptions(connect_timeout=2.5)).connect_timeout
    2.5
    >>> Hop.parse("admin@bastion:2222")
    Hop(host='bastion', user='admin', port=2222)
    >>> Hop.parse("[fe80::1]:22").host
    'fe80::1'
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from poprun_py.errors import UsageError

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec, SshOptions


def user_home() -> str:
    """This user's home as OpenSSH knows it: the passwd entry's directory (``ssh`` never reads
    ``$HOME``: its ``~``, ``%d``, ``~/.ssh/config`` and ``~/.ssh/known_hosts`` all come from
    there); ``$HOME`` only for a uid with no passwd entry."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return str(Path.home())


def tilde(path: str) -> str:
    """``path`` with a leading ``~`` expanded as OpenSSH does (:func:`user_home`; ``~user``
    from that user's passwd entry)."""
    if path == "~" or path.startswith("~/"):
        return user_home() + path[1:]
    return os.path.expanduser(path) if path.startswith("~") else path


STRICT_VALUES = ("yes", "accept-new", "no")
CLIENTS = ("auto", "paramiko", "openssh")
"""``--ssh-client``: ``auto`` takes OpenSSH for a host whose configuration needs it."""
DEFAULT_CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class SshSettings:
    """How to reach hosts; the command-line side of the ssh settings."""

    known_hosts: Path | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    ssh_config: Path | None = None
    identity_file: str | None = None
    user: str | None = None
    ssh_client: str = "auto"  # --ssh-client: auto | paramiko | openssh (CLIENTS)
    fanout: int | None = None  # --fanout K: a tree of K gateways (poprun_py.ssh.tree); None flat

    @staticmethod
    def of(
        *,
        known_hosts: str | None = None,
        ssh_config: str | None = None,
        accept_new_host_keys: bool = False,
        connect_timeout: float = 10.0,
        identity_file: str | None = None,
        user: str | None = None,
        ssh_client: str | None = None,
        fanout: int | None = None,
    ) -> SshSettings:
        """Settings from the plain strings specs and flags carry (empty means not given);
        UsageError for an ``ssh_client`` not among :data:`CLIENTS`."""
        return SshSettings(
            known_hosts=Path(known_hosts) if known_hosts else None,
            accept_new_host_keys=accept_new_host_keys,
            connect_timeout=connect_timeout,
            ssh_config=Path(ssh_config) if ssh_config else None,
            identity_file=identity_file,
            user=user,
            ssh_client=check_client(ssh_client),
            fanout=check_fanout(fanout),
        )


def check_client(client: str | None) -> str:
    """``--ssh-client`` (or the spec's ``ssh.client``) as given: ``auto`` when not given;
    UsageError (exit 2, one line) for anything but :data:`CLIENTS`."""
    if not client:
        return "auto"
    if client not in CLIENTS:
        raise UsageError(f"--ssh-client must be auto, paramiko or openssh, not {client!r}")
    return client


def check_fanout(fanout: int | None) -> int | None:
    """``--fanout`` as given: not given (None, a flat launch) or 1 and more; UsageError (exit
    2, one line) otherwise."""
    if fanout is not None and fanout < 1:
        raise UsageError(f"--fanout must be 1 or more (the gateways to connect to), not {fanout}")
    return fanout


def check_connect_timeout(seconds: float | None) -> float | None:
    """``--connect-timeout`` as given: not given (None) or a positive number of seconds;
    UsageError (exit 2, one line) otherwise. The one check of it, wherever it is given."""
    if seconds is not None and seconds <= 0:
        raise UsageError(f"--connect-timeout must be more than 0, got {seconds}")
    return seconds


def connect_timeout_for(spec: ClusterSpec, given: float | None) -> float | None:
    """``--connect-timeout`` (checked), else the spec's ``defaults.connect_timeout``; None
    when neither says (the caller's own default applies)."""
    seconds = check_connect_timeout(given)
    return spec.defaults.connect_timeout if seconds is None else seconds


def settings_for(
    spec: ClusterSpec, flags: SshOptions, *, fallback_timeout: float = DEFAULT_CONNECT_TIMEOUT
) -> SshSettings:
    """How to reach ``spec``'s hosts: the SSH flags first, then the spec's ``ssh:`` files and
    ``defaults.connect_timeout``, then ``fallback_timeout`` (identity and user otherwise come
    with each host, then from the ssh configuration). The one builder of :class:`SshSettings`
    from a spec and flags: every command, backend and provider gets its settings here."""
    seconds = connect_timeout_for(spec, flags.connect_timeout)
    return SshSettings.of(
        known_hosts=flags.known_hosts or spec.known_hosts,  # an empty path is not given
        ssh_config=flags.ssh_config or spec.ssh_config,
        accept_new_host_keys=flags.accept_new_host_keys,
        connect_timeout=float(fallback_timeout if seconds is None else seconds),
        identity_file=flags.identity,
        user=flags.user,
        ssh_client=flags.ssh_client or spec.ssh_client,
        fanout=flags.fanout,
    )


@dataclass(frozen=True)
class Hop:
    """One ``ProxyJump`` hop as written: ``[user@]host[:port]``."""

    host: str
    user: str | None = None
    port: int | None = None

    @staticmethod
    def parse(text: str) -> Hop:
        """``user@host:port``, ``host``, ``[v6addr]:port``; ``ssh://`` URIs too."""
        spec = text.strip().removeprefix("ssh://").rstrip("/")
        user, _, rest = spec.rpartition("@")
        host, port = rest, ""
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port = tail.removeprefix(":")
        elif rest.count(":") == 1:
            host, port = rest.split(":")
        if not host or (port and not port.isdigit()):
            raise UsageError(f"bad ProxyJump hop {text!r}: use [user@]host[:port]")
        return Hop(host, user or None, int(port) if port else None)

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.host}{port}"


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
    record_to: Path | None
    strict: str = "yes"  # StrictHostKeyChecking: yes | accept-new | no
    proxy_command: str | None = None
    jumps: tuple[Hop, ...] = ()
    certificate_files: tuple[str, ...] = ()
    identity_agent: str | None = None  # None: $SSH_AUTH_SOCK; "none": no agent; else a path
    connect_timeout: float | None = None  # the config's ConnectTimeout
    host_key_alias: str | None = None

    @property
    def plain_names(self) -> tuple[str, ...]:
        """The known_hosts names without the ``[...]:port`` form."""
        return tuple(n[1:].rpartition("]:")[0] if n.startswith("[") else n for n in self.key_names)

    @property
    def label(self) -> str:
        """``h2 (198.18.0.12)``, or the name alone when it is the address."""
        return self.name if self.hostname == self.name else f"{self.name} ({self.hostname})"

    @property
    def accept_new(self) -> bool:
        """True if a key never seen for this host is accepted (and recorded where possible)."""
        return self.strict in ("accept-new", "no")

    @property
    def key(self) -> tuple[str, str, int, str]:
        """What makes two endpoints the same login (jump connections are shared by it)."""
        return (self.name, self.hostname, self.port, self.user)
