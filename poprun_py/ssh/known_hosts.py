"""Host keys checked as OpenSSH checks them: known_hosts files (plain and hashed patterns,
``[host]:port``, negation, ``@revoked``, ``@cert-authority``) and OpenSSH host certificates.

:func:`verify_host_key` takes the server's key (and its certificate, when it presented one):

- a certificate signed by a CA that a matching ``@cert-authority`` line trusts is accepted when
  the CA's signature verifies, it is a host certificate, the host name is among its principals
  and now is within its validity (as ``ssh`` does); a certificate no CA line matches falls back
  to its plain key, as ``ssh`` does;
- a plain key is accepted when known_hosts holds it for the host;
- a key marked ``@revoked`` (or a certificate signed by a revoked CA) is refused;
- a key different from the one known_hosts holds is refused whatever StrictHostKeyChecking says
  (stricter than OpenSSH, which lets ``StrictHostKeyChecking no`` through with restrictions);
- a key unknown under ``[host]:port`` but known for the host itself is accepted (as ``ssh``
  does, unless a HostKeyAlias is set);
- an unknown key is refused, unless the endpoint accepts new keys (``accept-new``, ``no``, or
  ``--accept-new-host-keys``): then it is recorded in the user known_hosts file (nowhere when
  that is ``/dev/null``).

Example:

    >>> line = "@cert-authority *.lab ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPs="
    >>> key = parse_known_hosts(line)[0]
    >>> key.marker, key.matches("n1.lab"), key.matches("n1.lab.org")
    ('cert-authority', True, False)
"""

from __future__ import annotations

import base64
import fcntl
import hmac
import os
import re
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from hashlib import sha1, sha256
from pathlib import Path

from poprun_py.ssh.errors import HostKeyError
from poprun_py.ssh.settings import Endpoint

HOST_CERT = 2  # SSH_CERT_TYPE_HOST
_KEY_FIELDS = {"ssh-ed25519": 1, "ecdsa-sha2": 2, "ssh-rsa": 2, "ssh-dss": 4}
CERT_SUFFIX = "-cert-v01@openssh.com"


@dataclass(frozen=True)
class KnownKey:
    """One known_hosts line: host patterns, key type, key blob and its marker, if any."""

    patterns: tuple[str, ...]
    key_type: str
    blob: bytes
    marker: str = ""  # "", "revoked" or "cert-authority"

    @property
    def revoked(self) -> bool:
        """True for an ``@revoked`` line."""
        return self.marker == "revoked"

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


@dataclass(frozen=True)
class HostKey:
    """The key a server proved it holds, and the certificate it came in (if any)."""

    key_type: str
    blob: bytes  # the plain public key
    cert: bytes | None = None


@dataclass(frozen=True)
class Certificate:
    """The fields of an OpenSSH certificate that a host check needs."""

    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical: bytes
    ca_blob: bytes
    signature: bytes
    signed: bytes  # everything the CA signed


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
    """Parse known_hosts text; malformed lines and unknown markers are skipped."""
    keys = []
    for raw in text.splitlines():
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = ""
        if fields[0].startswith("@"):
            marker = fields[0][1:]
            if marker not in ("revoked", "cert-authority"):
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        keys.append(KnownKey(tuple(fields[0].split(",")), fields[1], blob, marker))
    return keys


class KnownHosts:
    """known_hosts files, each read once; thread-safe lookups and appends."""

    def __init__(self) -> None:
        self._files: dict[Path, _Indexed] = {}
        self._lock = threading.Lock()

    def _keys(self, path: Path) -> _Indexed:
        with self._lock:
            if path not in self._files:
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    text = ""
                self._files[path] = _Indexed(parse_known_hosts(text))
            return self._files[path]

    def lookup(self, files: Iterable[Path], names: Iterable[str]) -> list[KnownKey]:
        """Every key recorded for any of ``names`` in any of ``files``, in file order."""
        names = tuple(names)
        found = []
        for path in files:
            indexed = self._keys(path)
            with self._lock:  # record() may be adding to it
                keys = [indexed.keys[i] for i in indexed.candidates(names)]
            found += [k for k in keys if any(k.matches(n) for n in names)]
        return found

    def record(self, path: Path, names: Sequence[str], key_type: str, blob: bytes) -> None:
        """Append one line for ``names`` to ``path`` (created 0600, parent 0700)."""
        line = f"{','.join(names)} {key_type} {base64.b64encode(blob).decode()}\n"
        with self._lock:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.write(line)
            self._files.setdefault(path, _Indexed([])).add(KnownKey(tuple(names), key_type, blob))


class _Indexed:
    """One file's keys, with the lines whose patterns are all plain names indexed by name: a
    lookup looks at those lines of its names and at every other line (wildcards, negations,
    hashed names) -- not at every line, which made connecting to N hosts listed in one
    known_hosts file cost N x N pattern matches."""

    def __init__(self, keys: Iterable[KnownKey]):
        self.keys: list[KnownKey] = []
        self.plain: dict[str, list[int]] = {}
        self.other: list[int] = []
        for key in keys:
            self.add(key)

    def add(self, key: KnownKey) -> None:
        index = len(self.keys)
        self.keys.append(key)
        if any(p.startswith(("!", "|")) or "*" in p or "?" in p for p in key.patterns):
            self.other.append(index)
            return
        for pattern in dict.fromkeys(p.lower() for p in key.patterns):
            self.plain.setdefault(pattern, []).append(index)

    def candidates(self, names: Sequence[str]) -> list[int]:
        """The lines that may match one of ``names``, in file order."""
        found = set(self.other)
        for name in names:
            found.update(self.plain.get(name.lower(), ()))
        return sorted(found)


def preferred_key_types(known: Sequence[KnownKey], offered: Sequence[str]) -> list[str]:
    """Ask first for what known_hosts can check for this host, as OpenSSH does: certificate
    types when a CA is trusted for it, then the plain types it has keys of, then the rest."""
    plain = [t for t in offered if not t.endswith(CERT_SUFFIX)]
    certs = [t for t in offered if t.endswith(CERT_SUFFIX)]
    wanted = {k.key_type for k in known if not k.marker}
    if "ssh-rsa" in wanted:
        wanted |= {"rsa-sha2-512", "rsa-sha2-256"}
    first = [t for t in plain if t in wanted]
    if any(k.marker == "cert-authority" for k in known):
        first = certs + first
    return first + [t for t in plain + certs if t not in first]


def fingerprint(blob: bytes) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a key blob."""
    return "SHA256:" + base64.b64encode(sha256(blob).digest()).decode().rstrip("=")


# ---------------------------------------------------------------- certificates


class _Reader:
    """SSH wire format: uint32-length strings, uint32 and uint64."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated certificate")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def string(self) -> bytes:
        return self.take(struct.unpack(">I", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def uint64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])


def parse_certificate(blob: bytes) -> Certificate:
    """The fields of an OpenSSH ``*-cert-v01@openssh.com`` blob; ValueError if malformed."""
    r = _Reader(blob)
    cert_type = r.string().decode()
    base = cert_type.removesuffix(CERT_SUFFIX)
    fields = next((n for prefix, n in _KEY_FIELDS.items() if base.startswith(prefix)), None)
    if fields is None or base == cert_type:
        raise ValueError(f"unsupported certificate type {cert_type}")
    r.string()  # nonce
    for _ in range(fields):
        r.string()  # the public key's numbers (mpints are strings on the wire)
    r.uint64()  # serial
    kind = r.uint32()
    key_id = r.string().decode(errors="replace")
    principals_blob = _Reader(r.string())
    principals = []
    while principals_blob.pos < len(principals_blob.data):
        principals.append(principals_blob.string().decode(errors="replace"))
    after, before = r.uint64(), r.uint64()
    critical = r.string()
    r.string()  # extensions
    r.string()  # reserved
    ca_blob = r.string()
    signed = blob[: r.pos]
    signature = r.string()
    return Certificate(
        kind, key_id, tuple(principals), after, before, critical, ca_blob, signature, signed
    )


def _ca_signature_ok(cert: Certificate) -> bool:
    import paramiko

    try:
        ca_type = _Reader(cert.ca_blob).string().decode()
        ca = paramiko.PKey.from_type_string(ca_type, cert.ca_blob)
        return bool(ca.verify_ssh_sig(cert.signed, paramiko.Message(cert.signature)))
    except (paramiko.SSHException, ValueError, TypeError, struct.error):
        return False


def _check_certificate(ep: Endpoint, label: str, blob: bytes, cas: Sequence[KnownKey]) -> None:
    """Raise HostKeyError unless a trusted, unrevoked CA signed a valid host certificate."""
    try:
        cert = parse_certificate(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HostKeyError(ep.name, f"host certificate of {label} is malformed: {exc}") from None
    trusted = [k for k in cas if k.marker == "cert-authority" and k.blob == cert.ca_blob]
    problem = _certificate_problem(ep, cert, trusted)
    if problem:
        raise HostKeyError(ep.name, f"host certificate of {label} refused: {problem}")


def _certificate_problem(ep: Endpoint, cert: Certificate, trusted: Sequence[KnownKey]) -> str:
    name = ep.key_names[0].partition("]")[0].lstrip("[") if ep.key_names else ep.hostname
    checks = (
        (bool(trusted), f"signed by CA {fingerprint(cert.ca_blob)}, which no line trusts"),
        (cert.cert_type == HOST_CERT, "it is not a host certificate"),
        (cert.valid_after <= time.time() < cert.valid_before, "it is expired or not yet valid"),
        (
            not cert.principals or name in cert.principals,
            f"{name} is not among its principals ({', '.join(cert.principals)})",
        ),
        (not cert.critical, "it has critical options, which host certificates may not carry"),
    )
    failed = next((why for ok, why in checks if not ok), "")
    if not failed and not _ca_signature_ok(cert):
        return "the CA's signature does not verify"
    return failed


# ---------------------------------------------------------------- the check


def verify_host_key(ep: Endpoint, key: HostKey, known: KnownHosts, peer: str | None = None) -> None:
    """Accept the server's key or certificate as described in the module; else raise."""
    label = ep.label if peer in (None, ep.hostname) else f"{ep.name} ({peer})"
    keys = known.lookup(ep.known_hosts, ep.key_names)
    revoked = {k.blob for k in keys if k.revoked}
    if key.blob in revoked:
        raise HostKeyError(ep.name, f"host key for {label} is marked @revoked in known_hosts")
    if key.cert is not None and any(k.marker == "cert-authority" for k in keys):
        with_ca = _cert_ca(key.cert)
        if with_ca in revoked:
            raise HostKeyError(ep.name, f"the CA that signed {label}'s certificate is @revoked")
        _check_certificate(ep, label, key.cert, keys)
        return
    plain = [k for k in keys if not k.marker]
    if any(k.blob == key.blob for k in plain):
        return
    if plain:
        raise HostKeyError(
            ep.name,
            f"host key for {label} does not match known_hosts: possible man-in-the-middle "
            "(refused whatever StrictHostKeyChecking says; remove the old key to go on)",
        )
    if _known_on_port_22(ep, key, known):
        return
    if not ep.accept_new:
        raise HostKeyError(
            ep.name,
            f"host key for {label} is not in known_hosts ({key.key_type} "
            f"{fingerprint(key.blob)}); check it, then pass --accept-new-host-keys to record it",
        )
    if ep.record_to is not None:
        known.record(ep.record_to, ep.key_names, key.key_type, key.blob)


def _known_on_port_22(ep: Endpoint, key: HostKey, known: KnownHosts) -> bool:
    """A key new under ``[host]:port`` is accepted if known for the host itself, as ssh does
    ("checking without port identifier"), unless a HostKeyAlias is set."""
    if ep.port == 22 or ep.host_key_alias:
        return False
    plain = replace(ep, port=22, key_names=ep.plain_names, strict="yes", record_to=None)
    try:
        verify_host_key(plain, key, known)
    except HostKeyError:
        return False
    return True


def _cert_ca(blob: bytes) -> bytes:
    try:
        return parse_certificate(blob).ca_blob
    except (ValueError, UnicodeDecodeError):
        return b""
