"""Resolving a host's ssh configuration with OpenSSH's semantics, once per host per launch.

When the OpenSSH client is installed, OpenSSH itself answers: ``ssh -G [-F FILE] [-l USER]
[-p PORT] HOST`` prints the fully resolved configuration (``Include``, ``Host``/``Match`` with
every criterion, the system file after the user's, first-obtained-value-wins, accumulating
``IdentityFile``/``CertificateFile``, ``ProxyJump``) in a few milliseconds; hosts are resolved
in parallel, each in its own pool worker. Where ``ssh`` is missing (or
``POPRUN_SSH_RESOLVER=paramiko``) the fallback parser in :mod:`poprun_py.ssh.config_parser`
reads the files (Paramiko's parser plus ``Include`` and the system file). Either way the
options become an :class:`Endpoint` (:func:`endpoint_from`), expanding ``%`` tokens where
OpenSSH does (``ssh -G`` prints ``IdentityFile``, ``CertificateFile``, ``IdentityAgent``,
known-hosts files and ``ProxyCommand`` unexpanded).

Example:

    >>> from poprun_py.core.spec import HostSpec
    >>> opts = {"hostname": ["10.0.0.5"], "port": ["2222"], "user": ["ops"],
    ...         "identityfile": ["/keys/id_%h"], "proxycommand": ["nc %h %p"]}
    >>> ep = endpoint_from(HostSpec("n1"), SshSettings(), opts)
    >>> ep.hostname, ep.port, ep.user, ep.identity_files, ep.proxy_command
    ('10.0.0.5', 2222, 'ops', ('/keys/id_10.0.0.5',), 'nc 10.0.0.5 2222')
    >>> ep.key_names
    ('[10.0.0.5]:2222', '[n1]:2222')
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from poprun_py.core.spec import HostSpec
from poprun_py.errors import UsageError
from poprun_py.ssh.settings import Endpoint, Hop, SshSettings, tilde, user_home

Options = Mapping[str, Sequence[str]]
"""Lower-case option name -> its values, one per ``ssh -G`` line (IdentityFile accumulates)."""

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
RESOLVER_ENV = "POPRUN_SSH_RESOLVER"
_TOKEN = re.compile(r"%(.)")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STRICT = {"yes": "yes", "ask": "yes", "true": "yes", "accept-new": "accept-new"}
_STRICT |= {"no": "no", "off": "no", "false": "no"}
_PARAMIKO_EXPANDS = frozenset({"identityfile"})  # the fallback's lookup expanded these already
_NOISE = ("Pseudo-terminal will not be allocated",)


def resolver_kind() -> str:
    """``openssh`` when the ssh client is installed (unless overridden), else ``paramiko``."""
    wanted = os.environ.get(RESOLVER_ENV, "auto").strip().lower()
    if wanted not in ("auto", "openssh", "paramiko"):
        raise UsageError(f"{RESOLVER_ENV} must be auto, openssh or paramiko, not {wanted!r}")
    if wanted == "paramiko" or (wanted == "auto" and shutil.which("ssh") is None):
        return "paramiko"
    return "openssh"


# ---------------------------------------------------------------- asking OpenSSH


def openssh_options(
    name: str, config: Path | None, user: str | None, port: int | None, timeout: float = 30.0
) -> dict[str, list[str]]:
    """``ssh -G`` for one host, as a dict of option -> values; UsageError on a bad config."""
    argv = ["ssh", "-G"]
    if config is not None:
        argv += ["-F", str(config)]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    try:
        done = subprocess.run(
            [*argv, "--", name],
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot resolve the ssh configuration of {name}: {exc}") from None
    if done.returncode != 0:
        message = _first_error(done.stderr, done.returncode)
        if re.search(r"(unknown|illegal|invalid) option", message):  # an OpenSSH before 6.8
            raise OldOpenSsh(message)
        if " line " not in message:  # e.g. an Include loop: find the file and line ourselves
            _locate(config)
        raise UsageError(f"ssh config: {message}")
    options: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key.lower(), []).append(value)
    return options


class OldOpenSsh(Exception):
    """This ssh has no ``-G``: the fallback reader is used instead."""


def _locate(config: Path | None) -> None:
    """Raise the fallback reader's error (which names file and line) for ``config``, if any."""
    from poprun_py.ssh.config_parser import FallbackConfig

    FallbackConfig.load(config)


def _first_error(stderr: str, code: int) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(_NOISE)]
    return lines[0] if lines else f"ssh -G exited with {code}"


# ---------------------------------------------------------------- options -> endpoint


def _first(options: Options, key: str) -> str | None:
    values = options.get(key)
    if not values:
        return None
    value = values[0]
    return (
        None if value == "none" and key not in ("stricthostkeychecking", "identityagent") else value
    )


def tokens(name: str, hostname: str, port: int, user: str, alias: str | None) -> dict[str, str]:
    """The values of OpenSSH's ``%`` tokens for one connection."""
    local = socket.gethostname()
    home = user_home()
    hashed = hashlib.sha1(f"{local}{hostname}{port}{user}".encode(), usedforsecurity=False)
    return {
        "%": "%",
        "h": hostname,
        "p": str(port),
        "r": user,
        "n": name,
        "u": getpass.getuser(),
        "l": local,
        "L": local.split(".")[0],
        "d": home,
        "i": str(os.getuid()),
        "k": alias or name,
        "C": hashed.hexdigest(),
    }


def expand(text: str, values: Mapping[str, str], *, env: bool = False) -> str:
    """``%`` tokens (unknown ones kept as written), a leading ``~``, and ``${VAR}`` if ``env``."""
    out = _TOKEN.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    if env:
        out = _ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), out)
    return tilde(out)


def endpoint_from(
    host: HostSpec, settings: SshSettings, options: Options, *, expanded: bool = False
) -> Endpoint:
    """Combine a host, the settings and its resolved ssh ``options`` into an Endpoint.

    ``expanded`` says Paramiko's lookup already expanded the tokens of IdentityFile,
    ProxyCommand and HostName (the fallback).
    """
    hostname = host.address or _first(options, "hostname") or host.name
    port = int(host.port or _first(options, "port") or 22)
    user = host.user or settings.user or _first(options, "user") or getpass.getuser()
    alias = _first(options, "hostkeyalias")
    values = tokens(host.name, hostname, port, user, alias)

    def paths(key: str) -> tuple[str, ...]:
        items = options.get(key) or ()
        done = expanded and key in _PARAMIKO_EXPANDS
        return tuple(tilde(v) if done else expand(v, values) for v in items)

    explicit = host.identity_file or settings.identity_file
    only = (_first(options, "identitiesonly") or "").lower() == "yes"
    strict = _STRICT.get((_first(options, "stricthostkeychecking") or "ask").lower(), "yes")
    if settings.accept_new_host_keys and strict == "yes":
        strict = "accept-new"
    proxy = _first(options, "proxycommand")
    jump = _first(options, "proxyjump")
    timeout = _first(options, "connecttimeout")
    names = (alias,) if alias else tuple(dict.fromkeys((hostname, host.name)))
    key_names, known, record_to = _host_key_files(names, port, settings, paths)
    return Endpoint(
        name=host.name,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=(tilde(explicit),) if explicit else paths("identityfile"),
        explicit_identity=bool(explicit) or only,
        key_names=key_names,
        known_hosts=known,
        record_to=record_to,
        strict=strict,
        proxy_command=(proxy if expanded else expand(proxy, values)) if proxy else None,
        jumps=tuple(Hop.parse(h) for h in jump.split(",")) if jump and not proxy else (),
        certificate_files=paths("certificatefile"),
        identity_agent=_agent(_first(options, "identityagent"), values),
        connect_timeout=float(timeout) if timeout and timeout.isdigit() else None,
        host_key_alias=alias,
    )


def _host_key_files(
    names: tuple[str, ...],
    port: int,
    settings: SshSettings,
    paths: Callable[[str], tuple[str, ...]],
) -> tuple[tuple[str, ...], tuple[Path, ...], Path | None]:
    """An Endpoint's ``key_names``, ``known_hosts`` and ``record_to``."""
    user_files = _known_files(paths("userknownhostsfile"), Path(user_home(), ".ssh", "known_hosts"))
    system_files = _known_files(paths("globalknownhostsfile"), SYSTEM_KNOWN_HOSTS)
    extra = (settings.known_hosts,) if settings.known_hosts else ()
    return (
        tuple(n if port == 22 else f"[{n}]:{port}" for n in names),
        tuple(dict.fromkeys((*extra, *user_files, *system_files))),
        settings.known_hosts or (user_files[0] if user_files else None),
    )


def _known_files(words: Sequence[str], default: Path) -> tuple[Path, ...]:
    """Files of a known-hosts option (``/dev/null`` and ``none`` mean none); default if unset."""
    if not words:
        return (default,)
    split = [w for value in words for w in value.split()]
    return tuple(Path(w) for w in split if w not in ("/dev/null", "none"))


def _agent(value: str | None, values: Mapping[str, str]) -> str | None:
    if value is None or value == "SSH_AUTH_SOCK":
        return None
    if value == "none":
        return "none"
    if value.startswith("$"):
        return os.environ.get(value[1:]) or "none"
    return expand(value, values, env=True)


# ---------------------------------------------------------------- the resolver


class Resolver:
    """Resolves hosts (and jump hosts) once each, thread-safe; remembers what each cost."""

    def __init__(self, settings: SshSettings, kind: str | None = None):
        self.settings = settings
        self.kind = kind or resolver_kind()
        self.seconds: dict[str, float] = {}
        self._done: dict[tuple[str, str | None, int | None], Any] = {}
        self._locks: dict[tuple[str, str | None, int | None], threading.Lock] = {}
        self._lock = threading.Lock()
        self._fallback: Callable[[str, str | None], dict[str, list[str]]] | None = None

    def endpoint(self, host: HostSpec) -> Endpoint:
        """The host's Endpoint (computed once)."""
        user = host.user or self.settings.user
        options = self.options(host.name, user, host.port)
        return endpoint_from(host, self.settings, options, expanded=self.kind == "paramiko")

    def hop(self, hop: Hop) -> Endpoint:
        """A jump host's Endpoint: its own configuration, with the hop's user and port first
        (like ``ssh -l U -J hop``, ``--user`` is the target's, not the jump host's)."""
        host = HostSpec(hop.host, user=hop.user, port=hop.port)
        options = self.options(hop.host, hop.user, hop.port)
        plain = SshSettings(
            known_hosts=self.settings.known_hosts,
            accept_new_host_keys=self.settings.accept_new_host_keys,
            connect_timeout=self.settings.connect_timeout,
            ssh_config=self.settings.ssh_config,
        )  # --identity and --user are for the hosts; a jump host has its own (as with ssh -J)
        return endpoint_from(host, plain, options, expanded=self.kind == "paramiko")

    def options(self, name: str, user: str | None, port: int | None) -> Any:
        """The resolved options of ``name`` (as ``user``, on ``port``), computed once."""
        key = (name, user, port)
        with self._lock:
            if key in self._done:
                return self._done[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._done:
                started = time.perf_counter()
                value = self._resolve(name, user, port)
                with self._lock:
                    self._done[key] = value
                    self.seconds[name] = time.perf_counter() - started
            return self._done[key]

    def _resolve(self, name: str, user: str | None, port: int | None) -> dict[str, list[str]]:
        if self.kind == "openssh":
            timeout = self.settings.connect_timeout + 20.0
            try:
                return openssh_options(name, self.settings.ssh_config, user, port, timeout)
            except OldOpenSsh:
                self.kind = "paramiko"
        from poprun_py.ssh.config_parser import FallbackConfig

        with self._lock:
            if self._fallback is None:
                self._fallback = FallbackConfig.load(self.settings.ssh_config).lookup
            lookup = self._fallback
        return lookup(name, user)
