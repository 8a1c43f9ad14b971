"""``launch`` past a thousand hosts (issue 24) without a thousand hosts: the heartbeat grows with
the number of hosts (keeping ``--host-timeout``'s meaning), known_hosts lookups look at a
host's own lines (not at every line of a file listing every host), and an established Paramiko
connection's reader thread wakes every :data:`~poprun_py.ssh.pool.IDLE_WAKE` seconds when idle,
not ten times a second. Each at its seam, with fakes."""

from __future__ import annotations

import base64
import socket
import threading
from pathlib import Path

import paramiko

from poprun_py.hostside.protocol import HEARTBEAT_HOSTS, heartbeat_for
from poprun_py.ssh.known_hosts import KnownHosts, parse_known_hosts
from poprun_py.ssh.pool import IDLE_WAKE, quiet

KEY_A = base64.b64encode(b"\0\0\0\x0bssh-ed25519" + b"\0\0\0\x20" + b"a" * 32).decode()
KEY_B = base64.b64encode(b"\0\0\0\x0bssh-ed25519" + b"\0\0\0\x20" + b"b" * 32).decode()


def test_heartbeat_is_unchanged_up_to_64_hosts_then_grows_with_them() -> None:
    assert [heartbeat_for(n, 0.5, 180.0) for n in (1, 2, HEARTBEAT_HOSTS)] == [0.5] * 3
    assert heartbeat_for(128, 0.5, 180.0) == 1.0
    assert heartbeat_for(1024, 0.5, 180.0) == 8.0  # 128 lines a second each way, as at 64


def test_heartbeat_keeps_the_host_timeout_meaning() -> None:
    # a host is still heard at least four times within --host-timeout ...
    assert heartbeat_for(1024, 0.5, 10.0) == 2.5
    assert heartbeat_for(8192, 0.5, 180.0) == 45.0  # not 64 s
    # ... and a heartbeat asked for (tests: 0.05 s) is never shortened
    assert heartbeat_for(1024, 0.5, 1.0) == 0.5
    assert heartbeat_for(3, 0.05, 0.4) == 0.05


def many_hosts(count: int) -> str:
    """A known_hosts file as bench_scale writes it: one line per host (name and address)."""
    return "".join(f"sc{i},198.19.0.{i % 250} ssh-ed25519 {KEY_A}\n" for i in range(count))


def test_lookup_finds_what_a_scan_of_every_line_finds(tmp_path: Path) -> None:
    hashed = paramiko.HostKeys.hash_host("sc7")
    text = many_hosts(50) + (
        f"{hashed} ssh-ed25519 {KEY_B}\n"
        f"*.example,!bad.example ssh-ed25519 {KEY_B}\n"
        f"[SC8]:2222 ssh-ed25519 {KEY_B}\n"
        f"@cert-authority sc* ssh-ed25519 {KEY_B}\n"
        f"@revoked sc9 ssh-ed25519 {KEY_B}\n"
        f"sc7,!sc7 ssh-ed25519 {KEY_B}\n"
        f"sc9 ssh-ed25519 {KEY_B}\n"
    )
    path = tmp_path / "known_hosts"
    path.write_text(text)
    every = parse_known_hosts(text)
    known = KnownHosts()
    for names in (["sc7"], ["sc9", "198.19.0.9"], ["[sc8]:2222"], ["ok.example"],
                  ["bad.example"], ["SC12"], ["nowhere"]):  # fmt: skip
        scanned = [k for k in every if any(k.matches(n) for n in names)]
        assert known.lookup([path], names) == scanned, names


def test_lookup_sees_a_key_recorded_after_the_file_was_read(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(many_hosts(3))
    known = KnownHosts()
    assert known.lookup([path], ["new"]) == []
    known.record(path, ["new", "198.18.0.9"], "ssh-ed25519", b"k")
    assert [k.patterns for k in known.lookup([path], ["198.18.0.9"])] == [("new", "198.18.0.9")]


def test_lookup_does_not_match_every_line_for_every_host(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(many_hosts(2000))
    known, calls = KnownHosts(), [0]
    known.lookup([path], ["sc0"])  # read once
    original = type(parse_known_hosts(many_hosts(1))[0]).matches

    def counting(self: object, name: str) -> bool:
        calls[0] += 1
        return original(self, name)  # type: ignore[arg-type]

    type(parse_known_hosts(many_hosts(1))[0]).matches = counting  # type: ignore[method-assign]
    try:
        assert len(known.lookup([path], ["sc1999", "198.19.0.249"])) == 1 + 7
    finally:
        type(parse_known_hosts(many_hosts(1))[0]).matches = original  # type: ignore[method-assign]
    assert calls[0] < 30, calls  # the host's own lines, not 2,000 lines x 2 names


class FakeConnection:
    """A Connection's ``transport.sock``, as quiet sees it."""

    def __init__(self, sock: object):
        self.transport = type("T", (), {"sock": sock})()


def test_an_open_connection_s_reader_sleeps_longer_when_idle() -> None:
    left, right = socket.socketpair()
    try:
        left.settimeout(0.1)  # what Paramiko's Transport sets
        quiet(FakeConnection(left))  # type: ignore[arg-type]
        assert left.gettimeout() == IDLE_WAKE >= 1.0
        # anything that arrives still wakes the reader at once
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(left.recv(10)))
        reader.start()
        right.sendall(b"x")
        reader.join(IDLE_WAKE / 2)
        assert got == [b"x"]
    finally:
        left.close()
        right.close()


def test_quiet_leaves_what_has_no_socket_alone() -> None:
    quiet(FakeConnection(None))  # type: ignore[arg-type]  # e.g. an OpenSSH connection
    quiet(object())  # type: ignore[arg-type]
