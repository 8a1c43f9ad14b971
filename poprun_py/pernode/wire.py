"""The per-node wire: how a node's launcher and the coordinator (node 0) prove to each other
that they share the secret, and the lines they exchange before an agent takes over the
connection.

Every connection starts with a mutual HMAC-SHA256 challenge-response; the secret itself never
travels (nor is it in any argv). The node speaks first::

    node  -> coord   poprun-node/1 NONCE_N
    coord -> node    coord NONCE_C MAC(secret, "coordinator", NONCE_N, NONCE_C)
    node  -> coord   node MAC(secret, "node", NONCE_C, NONCE_N, HELLO) HELLO
    coord -> node    ok | no REASON

HELLO is ``{"rank": K, "digest": PLAN_DIGEST}``. Fresh nonces on both sides: a recorded
exchange proves nothing on a later connection. Then the coordinator sends one order: ``start
ARGV`` (JSON; the socket becomes the agent's stdin and stdout, relayed by the node), ``done
[RC, REASON]`` (the job is over: exit with RC; :class:`Done`) or ``no REASON``; ``h`` lines
(heartbeats) come while the node waits.

Example (a node and a coordinator over a socket pair)::

    >>> import socket, threading
    >>> a, b = socket.socketpair()
    >>> got = {}
    >>> t = threading.Thread(target=lambda: got.update(h=accept_node(b, Lines(b), b"s" * 16)))
    >>> t.start()
    >>> join_coordinator(a, Lines(a), b"s" * 16, Hello(2, "ab12"))
    >>> t.join(); got["h"]
    Hello(rank=2, digest='ab12')
    >>> send_line(b, b"ok"); expect_ok(Lines(a), deadline_in(1.0))
    >>> send_line(b, order("done", 0)); read_order(Lines(a), deadline_in(1.0))
    ('done', 0)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import select
import socket
import time
from dataclasses import dataclass
from typing import Any

from poprun_py.errors import EXIT_PREFLIGHT, PoprunError

MAGIC = b"poprun-node/1"
HANDSHAKE_TIMEOUT = 10.0  # seconds for a whole handshake, either side
MAX_LINE = 1 << 20  # bytes: a longer line is no poprun-py peer's
ORDERS = ("start", "done", "no")


class WireError(PoprunError):
    """The peer broke the protocol, closed, or was too slow; one line."""

    exit_code = EXIT_PREFLIGHT


class Refused(WireError):
    """The peer did not prove the secret, or refused this side (``no REASON``)."""


@dataclass(frozen=True)
class Hello:
    """What a node says once the coordinator proved the secret."""

    rank: int
    digest: str


def deadline_in(seconds: float) -> float:
    """A monotonic deadline ``seconds`` from now."""
    return time.monotonic() + seconds


def mac(secret: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 over ``parts`` (length-prefixed: no two splits give the same input)."""
    message = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def send_line(sock: socket.socket, line: bytes) -> None:
    """One line; OSError when the connection is broken."""
    sock.sendall(line + b"\n")


class Lines:
    """Lines from a blocking socket, each within a deadline; what came after the last line
    read stays in :attr:`rest` (an agent's first bytes, after ``start``)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.rest = b""

    def line(self, deadline: float) -> bytes:
        """The next line (without its newline); WireError on the end, a timeout or garbage."""
        while b"\n" not in self.rest:
            if len(self.rest) > MAX_LINE:
                raise WireError("a line too long: not a poprun-py peer")
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise WireError("no answer in time")
            ready, _, _ = select.select([self.sock], [], [], wait)
            if not ready:
                continue
            try:
                chunk = self.sock.recv(65536)
            except OSError as exc:
                raise WireError(f"the connection broke: {exc.strerror or exc}") from None
            if not chunk:
                raise WireError("the connection closed")
            self.rest += chunk
        line, _, self.rest = self.rest.partition(b"\n")
        return line


def nonce() -> bytes:
    """A fresh challenge (hex)."""
    return os.urandom(16).hex().encode()


def join_coordinator(
    sock: socket.socket, lines: Lines, secret: bytes, hello: Hello, within: float = 10.0
) -> None:
    """The node's half up to its hello: challenge the coordinator, check its proof, prove the
    secret with ``hello``. Refused when the coordinator does not prove the secret."""
    deadline = deadline_in(within)
    mine = nonce()
    send_line(sock, MAGIC + b" " + mine)
    words = lines.line(deadline).split()
    if len(words) != 3 or words[0] != b"coord":
        raise WireError("the coordinator's answer is not poprun-py's")
    theirs, proof = words[1], words[2].decode("ascii", "replace")
    if not hmac.compare_digest(proof, mac(secret, b"coordinator", mine, theirs)):
        raise Refused("the coordinator did not prove the shared secret (not the same secret?)")
    body = json.dumps({"rank": hello.rank, "digest": hello.digest}, sort_keys=True).encode()
    send_line(sock, b"node " + mac(secret, b"node", theirs, mine, body).encode() + b" " + body)


def expect_ok(lines: Lines, deadline: float) -> None:
    """The coordinator's verdict on the hello: Refused with its reason unless ``ok``."""
    line = lines.line(deadline)
    if line != b"ok":
        reason = line.partition(b" ")[2].decode("utf-8", "replace") or "no reason given"
        raise Refused(f"the coordinator refused this node: {reason}")


def accept_node(sock: socket.socket, lines: Lines, secret: bytes, within: float = 10.0) -> Hello:
    """The coordinator's half up to the verdict: answer the node's challenge, challenge it,
    check its proof; its hello. Refused (to be logged) when it does not prove the secret."""
    deadline = deadline_in(within)
    words = lines.line(deadline).split()
    if len(words) != 2 or words[0] != MAGIC:
        raise Refused("not a poprun-py node")
    theirs, mine = words[1], nonce()
    send_line(sock, b"coord " + mine + b" " + mac(secret, b"coordinator", theirs, mine).encode())
    try:
        kind, proof, body = lines.line(deadline).split(b" ", 2)
    except WireError as exc:
        raise Refused(f"no proof of the secret ({exc}: a wrong secret?)") from None
    except ValueError:
        raise Refused("a garbled hello") from None
    good = mac(secret, b"node", mine, theirs, body)
    if kind != b"node" or not hmac.compare_digest(proof.decode("ascii", "replace"), good):
        raise Refused("a wrong secret")
    return _hello(body)


def _hello(body: bytes) -> Hello:
    try:
        data = json.loads(body)
        rank, digest = data["rank"], data["digest"]
    except (ValueError, KeyError, TypeError):
        raise Refused("a garbled hello") from None
    if not isinstance(rank, int) or not isinstance(digest, str):
        raise Refused("a garbled hello")
    return Hello(rank, digest)


@dataclass(frozen=True)
class Done:
    """The job's end as the coordinator tells a node: its exit code, and why (the root cause
    node 0's launcher names; empty when it succeeded)."""

    code: int
    reason: str = ""

    @classmethod
    def of(cls, value: Any) -> Done:
        """A ``done`` order's value: ``RC`` or ``[RC, REASON]``; WireError for anything else."""
        if isinstance(value, list) and len(value) == 2:
            code, reason = value
            if isinstance(code, int) and isinstance(reason, str):
                return cls(code, reason)
        if isinstance(value, int):
            return cls(value)
        raise WireError(f"a done order poprun-py does not know: {value!r:.40}")


def order(kind: str, value: Any) -> bytes:
    """An order line: ``start`` with an argv, ``done`` with an exit code, ``no`` a reason."""
    if kind == "no":
        return b"no " + str(value).encode()
    return kind.encode() + b" " + json.dumps(value).encode()


def read_order(lines: Lines, deadline: float) -> tuple[str, Any]:
    """The next line as an order: ``("start", argv)``, ``("done", rc)``, ``("no", reason)``,
    or ``("h", None)`` for a heartbeat (the caller moves its deadline). WireError when the
    coordinator goes (closed, or silent until ``deadline``) or says something else."""
    line = lines.line(deadline)
    if line == b"h":
        return ("h", None)
    kind, _, rest = line.partition(b" ")
    name = kind.decode("ascii", "replace")
    if name == "no":
        return ("no", rest.decode("utf-8", "replace"))
    if name in ORDERS:
        try:
            return (name, json.loads(rest))
        except ValueError:
            pass
    raise WireError(f"an order poprun-py does not know: {line[:40]!r}")
