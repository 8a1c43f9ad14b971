"""Sync: push the program's directory (or named paths) to every host, in parallel.

Each path goes to the same absolute path on every host (or under ``dest``). Where ``rsync`` exists
on both ends it is used, over ``ssh -F <generated config>``: the config repeats this pool's
address, port, user, identity, jump hosts and ProxyCommand for each host, and pins the host key
paramiko already verified
(``HostKeyAlias`` + a one-line known_hosts, ``StrictHostKeyChecking yes``), so rsync trusts
exactly what the transport trusts. A host reached through OpenSSH (``--ssh-client``) gets rsync
over ``ssh`` with its own configuration, and SFTP over an ``ssh -s HOST sftp`` process.
Elsewhere SFTP over the pool's own connection, skipping files
whose size and mtime already match and setting mtime and mode after each upload. Either way an
unchanged file is not sent again, and nothing is deleted on the hosts.

Example::

    with ConnectionPool(hosts, SshSettings()) as pool:
        report = sync(pool, ["/home/me/job"], progress=lambda host, done, total: ...)
        report.files_sent            # 0 the second time

    >>> [e.rel for e in scan([__file__])][:1] == [os.path.basename(__file__)]
    True
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from poprun_py.errors import BackendError, Fault, PreflightError, UsageError
from poprun_py.ssh.openssh import OpenSshConnection

if TYPE_CHECKING:
    import paramiko

    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.hostresult import HostResult
    from poprun_py.ssh.pool import ConnectionPool

ProgressFn = Callable[[str, int, int], None]
"""``progress(host, bytes_done, bytes_total)``; unchanged files count as done."""

RSYNC_MISSING = "rsync not found on PATH; install rsync (Debian: rsync), or --method auto"
METHODS = ("auto", "rsync", "sftp")
_PROBE = 'mkdir -p -- "$@" && if command -v rsync >/dev/null 2>&1; then echo rsync; fi'


@dataclass(frozen=True)
class Entry:
    """One local file, directory or symlink and where it goes on the hosts."""

    local: str
    remote: str
    rel: str
    kind: str  # "dir", "file" or "link"
    size: int = 0
    mtime: int = 0
    mode: int = 0o644
    target: str = ""


@dataclass(frozen=True)
class HostSync:
    """What one host received."""

    host: str
    method: str
    files_sent: int
    bytes_sent: int
    duration: float


@dataclass(frozen=True)
class SyncReport:
    """Every host's transfer, and the size of what was pushed."""

    hosts: tuple[HostSync, ...]
    files_total: int
    bytes_total: int

    @property
    def files_sent(self) -> int:
        """Files transferred, summed over the hosts."""
        return sum(h.files_sent for h in self.hosts)


# ---------------------------------------------------------------- what to send


def destination(path: str, dest: str | None) -> str:
    """Where ``path`` goes: the same absolute path, or ``dest/<its name>``."""
    absolute = os.path.abspath(path)
    if dest is None:
        return absolute
    return posixpath.join(dest, os.path.basename(absolute.rstrip("/")) or "root")


def scan(paths: Sequence[str], dest: str | None = None) -> list[Entry]:
    """Every directory, file and symlink under ``paths``, parents before children."""
    entries: list[Entry] = []
    for path in paths:
        if not os.path.lexists(path):
            raise UsageError(f"cannot sync {path}: no such file or directory")
        root = os.path.abspath(path)
        remote_root = destination(root, dest)
        entries.append(_entry(root, remote_root, os.path.basename(root)))
        if os.path.isdir(root) and not os.path.islink(root):
            entries += _walk(root, remote_root)
    return entries


def _walk(root: str, remote_root: str) -> Iterator[Entry]:
    for here, dirs, files in os.walk(root):
        dirs.sort()
        rel_here = os.path.relpath(here, root)
        for name in [*dirs, *sorted(files)]:
            rel = os.path.normpath(os.path.join(rel_here, name))
            remote = posixpath.join(remote_root, rel.replace(os.sep, "/"))
            yield _entry(os.path.join(here, name), remote, rel)


def _entry(local: str, remote: str, rel: str) -> Entry:
    info = os.lstat(local)
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return Entry(local, remote, rel, "link", target=os.readlink(local))
    if stat.S_ISDIR(info.st_mode):
        return Entry(local, remote, rel, "dir", mode=mode)
    return Entry(local, remote, rel, "file", info.st_size, int(info.st_mtime), mode)


# ---------------------------------------------------------------- sync


def sync(
    pool: ConnectionPool,
    paths: Sequence[str],
    dest: str | None = None,
    progress: ProgressFn | None = None,
    *,
    method: str = "auto",
    timeout: float | None = None,
) -> SyncReport:
    """Push ``paths`` to every host of ``pool`` in parallel; see the module docstring.

    ``method`` is ``auto`` (rsync where both ends have it), ``rsync`` or ``sftp``; a push
    still running ``timeout`` seconds after the start is stopped (that host fails). Raises
    PreflightError naming every host that could not be reached or written.
    """
    if method not in METHODS:
        raise UsageError(f"unknown sync method {method!r}; choose one of: {', '.join(METHODS)}")
    entries = scan(paths, dest)
    if method == "rsync" and shutil.which("rsync") is None:  # before any host is contacted
        raise PreflightError([Fault("localhost", "rsync", RSYNC_MISSING)])
    conns = pool.open_all()
    total = sum(e.size for e in entries if e.kind == "file")
    parents = sorted({posixpath.dirname(destination(p, dest)) for p in paths})
    use_rsync = method != "sftp" and shutil.which("rsync") is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="poprun-sync-") as tmp:
        pinned = [c for c in conns.values() if not isinstance(c, OpenSshConnection)]
        config = write_ssh_config(Path(tmp), pinned) if use_rsync else None

        def push(conn: Connection) -> HostSync:
            started = time.monotonic()
            if _remote_rsync(conn, parents, method, use_rsync) and config is not None:
                shell = _openssh_shell(conn)  # OpenSSH hosts: ssh with their own config
                argv = rsync_argv(config, conn.name, paths, dest, shell=shell)
                sent = _rsync(argv, conn.name, total, progress, deadline)
                return HostSync(conn.name, "rsync", *sent, time.monotonic() - started)
            sent = _sftp_push(conn, parents, entries, total, progress, deadline=deadline)
            return HostSync(conn.name, "sftp", *sent, time.monotonic() - started)

        try:
            outcomes = pool.each(push)
        except BaseException:  # interrupted: no rsync outlives the sync
            stop_rsyncs()
            raise
    return _report(pool, outcomes, entries, total)


def _remote_rsync(conn: Connection, parents: Sequence[str], method: str, local: bool) -> bool:
    """Create the parent directories and say whether the host has rsync (one round trip)."""
    if not local:
        if method == "rsync":
            raise PreflightError([Fault("localhost", "rsync", RSYNC_MISSING)])
        return False
    has_rsync = "rsync" in conn.run(["sh", "-c", _PROBE, "sh", *parents]).stdout
    if method == "rsync" and not has_rsync:
        raise PreflightError([Fault(conn.name, "rsync", "rsync not found on the host")])
    return has_rsync


def _report(
    pool: ConnectionPool,
    outcomes: dict[str, HostResult[HostSync]],
    entries: Sequence[Entry],
    total: int,
) -> SyncReport:
    from poprun_py.ssh.errors import TransportError

    faults = []
    for host in pool.hosts:
        outcome = outcomes.get(host.name)
        match outcome.fault if outcome is not None else None:
            case TransportError(detail=detail):
                faults.append(Fault(host.name, "sync", detail))
            case PreflightError(faults=theirs):
                faults.extend(theirs)
            case BaseException() as fault:
                faults.append(Fault(host.name, "sync", str(fault) or type(fault).__name__))
    if faults:
        raise PreflightError(faults)
    done = tuple(o.value for o in outcomes.values())
    return SyncReport(done, sum(1 for e in entries if e.kind == "file"), total)


# ---------------------------------------------------------------- rsync


def write_ssh_config(directory: Path, conns: Sequence[Connection]) -> Path:
    """An ssh_config (and known_hosts) making ``ssh -F`` reach each host as ``conns`` do, through
    the same jump hosts (as ``ProxyCommand ssh -F <this config> -W``) or ProxyCommand."""
    config = directory / "ssh_config"
    known = directory / "known_hosts"
    names: dict[int, str] = {}
    ordered: list[Connection] = []
    for conn in conns:
        for hop in conn.jumps:
            if id(hop) not in names:
                names[id(hop)] = f"poprun-jump-{len(names) + 1}"
                ordered.append(hop)
    for conn in conns:
        names[id(conn)] = conn.name
        ordered.append(conn)
    known.write_text(
        "".join(
            f"{names[id(c)]} {key.get_name()} {key.get_base64()}\n"
            for c in ordered
            for key in [c.transport.get_remote_server_key()]
        )
    )
    config.write_text("".join(_host_block(c, names, known, config) for c in ordered))
    return config


def _quoted(value: str) -> str:
    if '"' in value or "\n" in value:
        raise UsageError(f"cannot use {value!r} in an ssh config")
    return f'"{value}"'


def _host_block(conn: Connection, names: dict[int, str], known: Path, config: Path) -> str:
    ep = conn.endpoint
    name = names[id(conn)]
    lines = [
        f"Host {name}",
        f"  HostName {ep.hostname}",
        f"  Port {ep.port}",
        f"  User {_quoted(ep.user)}",
        f"  HostKeyAlias {name}",  # the key below is pinned under the host's name
        f"  UserKnownHostsFile {_quoted(str(known))}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",  # the transport verified this key; accept nothing else
        "  BatchMode yes",  # never prompt
        f"  ConnectTimeout {max(1, round(conn.transport.handshake_timeout))}",
        "  ControlMaster no",  # no stray multiplexing from a user's habits
        "  Compression no",  # local networks: compression costs more than it saves
        "  LogLevel ERROR",
    ]
    lines += [f"  IdentityFile {_quoted(path)}" for path in ep.identity_files]
    lines += [f"  CertificateFile {_quoted(path)}" for path in ep.certificate_files]
    if ep.explicit_identity:
        lines.append("  IdentitiesOnly yes")
    if ep.identity_agent is not None:
        lines.append(f"  IdentityAgent {_quoted(ep.identity_agent)}")
    if conn.via is not None:  # through the jump host's own block, with this same config
        hop = shlex.quote(names[id(conn.via)])
        lines.append(f"  ProxyCommand ssh -F {shlex.quote(str(config))} -W [%h]:%p {hop}")
    elif ep.proxy_command:
        lines.append(f"  ProxyCommand {ep.proxy_command.replace('%', '%%')}")
    return "\n".join(lines) + "\n\n"


def _openssh_shell(conn: Connection) -> str | None:
    """``rsync -e`` for a host reached through OpenSSH: its ssh and options, quoted (rsync
    splits the string as a shell would); None for a Paramiko one."""
    if not isinstance(conn, OpenSshConnection):
        return None
    return shlex.join(conn.options())


def rsync_argv(
    config: Path, host: str, paths: Sequence[str], dest: str | None, *, shell: str | None = None
) -> list[str]:
    """The rsync command: archive mode, one line per changed item, over ``ssh -F config``
    (or over ``shell``, the ``-e`` of a host reached through OpenSSH)."""
    sources = [os.path.abspath(p) for p in paths]
    shell = shell or f"ssh -F {_quoted(str(config))}"
    base = ["rsync", "-a", "--out-format=%i %l %n", "-e", shell]
    if dest is None:  # full paths; the parents were created by the probe, leave them alone
        return [*base, "--relative", "--no-implied-dirs", *sources, f"{host}:/"]
    return [*base, *sources, f"{host}:{dest.rstrip('/')}/"]


def _rsync(
    argv: Sequence[str],
    host: str,
    total: int,
    progress: ProgressFn | None,
    deadline: float | None = None,
) -> tuple[int, int]:
    """Run rsync; count the files it sent (``<f`` items) and their bytes. Its stdout and stderr
    are read together (rsync blocks once a pipe nobody reads is full), until ``deadline``
    (``time.monotonic()``; rsync is killed then)."""
    counter = _Sent(host, total, progress)
    err = _Tail()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None and proc.stderr is not None
    with proc, _running(proc):
        finished = _drain(
            {proc.stdout.fileno(): counter.feed, proc.stderr.fileno(): err.feed}, deadline
        )
        if not finished:
            proc.kill()
        proc.wait()
    if not finished:
        raise BackendError(f"rsync to {host} did not finish in time (it was stopped)")
    if proc.returncode != 0:
        last = (err.text().strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise BackendError(f"rsync to {host} failed: {last}")
    if progress:
        progress(host, total, total)
    return counter.files, counter.sent


def _drain(readers: dict[int, Callable[[bytes], None]], deadline: float | None) -> bool:
    """Read every fd in ``readers`` to its end, each chunk to its reader; False once
    ``deadline`` passed first."""
    import selectors

    with selectors.DefaultSelector() as sel:
        for fd in readers:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            for key, _ in sel.select(wait):
                data = os.read(key.fd, 65536)
                if data:
                    readers[key.fd](data)
                else:
                    sel.unregister(key.fd)
    return True


class _Sent:
    """rsync's ``--out-format`` lines: the files sent (``<f`` items) and their bytes."""

    def __init__(self, host: str, total: int, progress: ProgressFn | None):
        self.host, self.total, self.progress = host, total, progress
        self.files = self.sent = 0
        self._rest = b""

    def feed(self, data: bytes) -> None:
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            flags, _, rest = line.decode("utf-8", "replace").partition(" ")
            if flags.startswith("<f"):  # a file sent to the host
                self.files += 1
                self.sent += int(rest.split(" ", 1)[0] or 0)
                if self.progress:
                    self.progress(self.host, min(self.sent, self.total), self.total)


class _Tail:
    """The last 64 KiB of a stream (rsync's errors: the last line is the one shown)."""

    KEEP = 1 << 16

    def __init__(self) -> None:
        self._data = b""

    def feed(self, data: bytes) -> None:
        self._data = (self._data + data)[-self.KEEP :]

    def text(self) -> str:
        return self._data.decode("utf-8", "replace")


_RSYNCS: set[subprocess.Popen[bytes]] = set()
_RSYNCS_LOCK = threading.Lock()


@contextlib.contextmanager
def _running(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Track a running rsync, so an interrupted sync can stop it (see :func:`stop_rsyncs`)."""
    with _RSYNCS_LOCK:
        _RSYNCS.add(proc)
    try:
        yield
    finally:
        with _RSYNCS_LOCK:
            _RSYNCS.discard(proc)


def stop_rsyncs() -> None:
    """Terminate every rsync still running (an interrupted sync)."""
    with _RSYNCS_LOCK:
        procs = list(_RSYNCS)
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.terminate()


# ---------------------------------------------------------------- SFTP


def _sftp_push(
    conn: Connection,
    parents: Sequence[str],
    entries: Sequence[Entry],
    total: int,
    progress: ProgressFn | None,
    *,
    deadline: float | None = None,
) -> tuple[int, int]:
    """Send what differs in size or mtime; return (files sent, bytes sent). Past ``deadline``
    (``time.monotonic()``) no further file is started: BackendError."""
    from poprun_py.ssh.connection import makedirs

    sftp = conn.sftp()
    for parent in parents:
        makedirs(sftp, parent)
    listings: dict[str, dict[str, paramiko.SFTPAttributes]] = {}
    files = sent = done = 0
    for entry in entries:
        if deadline is not None and time.monotonic() > deadline:
            raise BackendError(f"sftp to {conn.name} did not finish in time (it was stopped)")
        parent, name = posixpath.split(entry.remote)
        if parent not in listings:
            listings[parent] = _listing(sftp, parent)
        have = listings[parent].get(name)
        if entry.kind == "dir":
            if _ensure_dir(sftp, entry, have):
                listings[entry.remote] = {}  # just created: nothing to list
            continue
        if entry.kind == "link":
            _ensure_link(sftp, entry, have)
            continue
        if not _unchanged(entry, have):
            _upload(sftp, entry)
            files, sent = files + 1, sent + entry.size
        done += entry.size
        if progress:
            progress(conn.name, done, total)
    return files, sent


def _listing(sftp: paramiko.SFTPClient, path: str) -> dict[str, paramiko.SFTPAttributes]:
    """The entries of a remote directory in one round trip ({} if it does not exist)."""
    try:
        return {a.filename: a for a in sftp.listdir_attr(path)}
    except OSError:
        return {}


def _unchanged(entry: Entry, have: paramiko.SFTPAttributes | None) -> bool:
    if have is None or have.st_mode is None or not stat.S_ISREG(have.st_mode):
        return False
    return have.st_size == entry.size and have.st_mtime == entry.mtime


def _ensure_dir(
    sftp: paramiko.SFTPClient, entry: Entry, have: paramiko.SFTPAttributes | None
) -> bool:
    """Create the directory unless it exists; True if it was created."""
    if have is not None and have.st_mode is not None and stat.S_ISDIR(have.st_mode):
        return False
    from poprun_py.ssh.connection import makedirs

    makedirs(sftp, entry.remote)
    sftp.chmod(entry.remote, entry.mode)
    return True


def _ensure_link(
    sftp: paramiko.SFTPClient, entry: Entry, have: paramiko.SFTPAttributes | None
) -> None:
    if have is not None:
        is_link = have.st_mode is not None and stat.S_ISLNK(have.st_mode)
        if is_link and sftp.readlink(entry.remote) == entry.target:
            return
        with contextlib.suppress(OSError):
            sftp.remove(entry.remote)
    sftp.symlink(entry.target, entry.remote)


def _upload(sftp: paramiko.SFTPClient, entry: Entry) -> None:
    """Upload to a temporary name, set mode and mtime, then rename over the old file."""
    name = f".{posixpath.basename(entry.remote)}.poprun-{secrets.token_hex(4)}"
    tmp = posixpath.join(posixpath.dirname(entry.remote), name)
    sftp.put(entry.local, tmp, confirm=False)
    sftp.chmod(tmp, entry.mode)
    sftp.utime(tmp, (entry.mtime, entry.mtime))
    sftp.posix_rename(tmp, entry.remote)
