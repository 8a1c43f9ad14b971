"""The per-node wire (poprun_py/pernode/wire.py) and the socket transport
(poprun_py/agent/stream.py's SocketStream) over socket pairs: the mutual handshake, a wrong
secret refused on either side, garbage and silence, orders, and the stream's end."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from poprun_py.agent.stream import SocketStream
from poprun_py.pernode import wire

SECRET = b"0123456789abcdef-secret"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_both_sides_prove_the_secret_and_the_hello_arrives(pair: Any) -> None:
    node, coord = pair
    thread, out = in_thread(lambda: wire.accept_node(coord, wire.Lines(coord), SECRET))
    wire.join_coordinator(node, wire.Lines(node), SECRET, wire.Hello(3, "d" * 64))
    thread.join(5)
    assert out == {"value": wire.Hello(3, "d" * 64)}


def test_a_node_with_a_wrong_secret_is_refused_by_both_sides(pair: Any) -> None:
    node, coord = pair
    thread, out = in_thread(lambda: wire.accept_node(coord, wire.Lines(coord), SECRET, 2.0))
    with pytest.raises(wire.Refused, match="did not prove the shared secret"):
        wire.join_coordinator(node, wire.Lines(node), b"another-secret-16b", wire.Hello(1, "x"))
    node.close()  # the node gives up: the coordinator sees no proof
    thread.join(5)
    assert isinstance(out["error"], wire.Refused)
    assert "wrong secret" in str(out["error"])


def test_a_forged_node_proof_is_refused(pair: Any) -> None:
    node, coord = pair
    thread, out = in_thread(lambda: wire.accept_node(coord, wire.Lines(coord), SECRET, 2.0))
    lines = wire.Lines(node)
    wire.send_line(node, wire.MAGIC + b" " + wire.nonce())
    lines.line(wire.deadline_in(2.0))  # the coordinator's proof: answered with a made-up one
    wire.send_line(node, b"node " + b"0" * 64 + b' {"rank": 0, "digest": "x"}')
    thread.join(5)
    assert isinstance(out["error"], wire.Refused) and "wrong secret" in str(out["error"])


def test_something_else_than_a_node_is_refused(pair: Any) -> None:
    node, coord = pair
    node.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(wire.Refused, match="not a poprun-py node"):
        wire.accept_node(coord, wire.Lines(coord), SECRET, 2.0)


def test_silence_is_a_timeout_not_a_hang(pair: Any) -> None:
    _, coord = pair
    with pytest.raises(wire.WireError, match="no answer in time"):
        wire.accept_node(coord, wire.Lines(coord), SECRET, 0.2)


def test_the_verdict_and_orders(pair: Any) -> None:
    node, coord = pair
    lines = wire.Lines(node)
    wire.send_line(coord, b"no your plan differs from node 0's")
    with pytest.raises(wire.Refused, match="your plan differs"):
        wire.expect_ok(lines, wire.deadline_in(1.0))
    wire.send_line(coord, b"h")
    wire.send_line(coord, wire.order("start", ["sh", "-c", "x y"]))
    coord.sendall(b"agent bytes")
    assert wire.read_order(lines, wire.deadline_in(1.0)) == ("h", None)
    assert wire.read_order(lines, wire.deadline_in(1.0)) == ("start", ["sh", "-c", "x y"])
    assert lines.rest == b"agent bytes"  # the agent's first bytes, kept for it


def test_a_closed_coordinator_ends_the_wait(pair: Any) -> None:
    node, coord = pair
    coord.close()
    with pytest.raises(wire.WireError, match="closed"):
        wire.read_order(wire.Lines(node), wire.deadline_in(1.0))


def test_the_socket_stream_reads_writes_and_ends(pair: Any) -> None:
    a, b = pair
    stream = SocketStream(a)
    assert stream.read() == b"" and not stream.ready() and not stream.ended()
    b.sendall(b"p 0 4\n")
    import select

    select.select([stream], [], [], 2.0)
    assert stream.ready() and stream.read() == b"p 0 4\n"
    stream.write(b"h\n")
    assert b.recv(10) == b"h\n"
    stream.send_eof()
    assert b.recv(10) == b""  # the far side reads the end
    b.sendall(b"last")
    b.close()
    select.select([stream], [], [], 2.0)
    assert stream.ended() and stream.read() == b"last" and not stream.ready()
    stream.said = "node 2's launcher ended"
    assert stream.last_words() == "node 2's launcher ended"
    stream.close()
    with pytest.raises(OSError):
        stream.write(b"x")
