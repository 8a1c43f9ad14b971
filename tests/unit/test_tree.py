"""The tree of SSH (``--fanout K``, poprun_py/ssh/tree.py) at its seam: the placement of hosts
under gateways, the gateway's frames, and :class:`GatewayLink` over a real gateway process run
here (:class:`~poprun_py.testing.streams.LocalGatewayHost`): what a child on the gateway gets
and gives, its end, a gateway lost, a program fed once per gateway."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from poprun_py.errors import UsageError
from poprun_py.hostside.bundle import payload
from poprun_py.hostside.gateway import frame, frames
from poprun_py.ssh.errors import ConnectionLost
from poprun_py.ssh.settings import SshSettings, check_fanout
from poprun_py.ssh.streams import ProcessStream, end_process
from poprun_py.ssh.tree import GatewayLink, RemoteChild, subtrees
from poprun_py.testing.streams import LocalGatewayHost


@pytest.fixture
def link() -> GatewayLink:
    host = LocalGatewayHost()
    link = GatewayLink(host)  # type: ignore[arg-type]  # a Connection at the seam
    yield link
    link.close()
    for process in host.processes:
        process.wait(10)


def test_the_first_k_hosts_are_gateways_and_the_rest_follow_in_blocks() -> None:
    names = [f"n{i}" for i in range(1, 11)]
    tree = subtrees(names, 3)
    assert tree == {
        "n4": "n1", "n5": "n1", "n6": "n1",
        "n7": "n2", "n8": "n2",
        "n9": "n3", "n10": "n3",
    }  # fmt: skip
    assert subtrees(names, None) == subtrees(names, 10) == subtrees(names, 12) == {}
    assert set(subtrees([f"n{i}" for i in range(1024)], 32).values()) == {
        f"n{i}" for i in range(32)
    }


@pytest.mark.parametrize("fanout", [0, -1])
def test_a_fanout_below_one_is_a_usage_error(fanout: int) -> None:
    with pytest.raises(UsageError, match=f"--fanout must be 1 or more .*, not {fanout}"):
        SshSettings.of(fanout=fanout)
    assert check_fanout(None) is None and check_fanout(1) == 1


def test_frames_are_read_whole_however_they_are_cut() -> None:
    data = frame(b"o", 1, b'["true"]') + frame(b"i", 1, b"x" * 70000) + frame(b"e", 1)
    got, rest = [], bytearray()
    for at in range(0, len(data), 4099):
        more, rest = frames(rest + data[at : at + 4099])
        got += more
    assert got == [(b"o", 1, b'["true"]'), (b"i", 1, b"x" * 70000), (b"e", 1, b"")]
    assert rest == bytearray()


def test_a_child_gets_its_stdin_and_gives_its_output_and_exit_code(link: GatewayLink) -> None:
    child = link.spawn("h1", ["sh", "-c", "cat; echo said >&2; exit 3"])
    assert isinstance(child, RemoteChild)
    child.stdin.write(b"one\ntwo\n")
    child.stdin.close()
    assert child.wait(10) == 3
    assert child.stdout.read() == b"one\ntwo\n"
    assert child.stderr.read() == b"said\n"


def test_much_both_ways_at_once_does_not_stall(link: GatewayLink) -> None:
    """300 kB out before the child reads its 200 kB in, for ten children at once: neither side
    waits on the other (the regression: a child's output left unpassed after its exit)."""
    children = [
        link.spawn(f"h{i}", ["sh", "-c", "head -c 300000 /dev/zero; wc -c"]) for i in range(10)
    ]

    def write(child: RemoteChild) -> None:
        child.stdin.write(b"x" * 200000)
        child.stdin.close()

    writers = [threading.Thread(target=write, args=(c,)) for c in children]
    for thread in writers:
        thread.start()
    outputs = [c.stdout.read() for c in children]
    assert [c.wait(10) for c in children] == [0] * 10
    assert all(len(out) == 300000 + len(b"200000\n") for out in outputs)
    assert all(out.endswith(b"200000\n") for out in outputs)


def test_end_process_ends_a_child_on_the_gateway_by_signals_sent_there(
    link: GatewayLink,
) -> None:
    stubborn = link.spawn("h1", ["sh", "-c", 'trap "" TERM; echo up; while :; do sleep 0.1; done'])
    assert stubborn.stdout.readline() == b"up\n"
    plain = link.spawn("h2", ["sleep", "60"])
    started = time.monotonic()
    end_process(plain)  # SIGTERM there: no local process group is signalled
    assert plain.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5
    end_process(stubborn, grace=0.3)  # SIGKILL once the grace is over
    assert stubborn.returncode == -signal.SIGKILL


def test_a_child_that_cannot_start_says_why_and_exits_255(link: GatewayLink) -> None:
    child = link.spawn("h1", ["/nonexistent/ssh", "h1"])
    assert child.wait(10) == 255
    assert b"poprun-py gateway: cannot start /nonexistent/ssh" in child.stderr.read()


def test_a_lost_gateway_ends_its_children_and_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = LocalGatewayHost()
    link = GatewayLink(host)  # type: ignore[arg-type]
    mark = f"tree-test-{uuid.uuid4().hex}"  # like ssh, each ends with its stdin
    children = [link.spawn(f"h{i}", ["sh", "-c", "cat >/dev/null", mark]) for i in (2, 3, 4)]
    stream = link.stream
    assert isinstance(stream, ProcessStream)
    deadline = time.monotonic() + 10
    while len(marked(mark)) < 3:  # every child runs on the gateway
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING, logger="poprun_py"):
        os.kill(host.processes[0].pid, signal.SIGKILL)  # the gateway's host is gone
        codes = [c.wait(10) for c in children]
    assert codes == [255, 255, 255]
    assert all(c.stderr.read() == b"ssh: lost with gateway gw\n" for c in children)
    warnings = [r.getMessage() for r in caplog.records if "gateway gw lost" in r.getMessage()]
    assert warnings == ["gateway gw lost (its connection closed): h[2-4] lost with it"]
    with pytest.raises(ConnectionLost, match="h5: through gateway gw: gateway gw lost"):
        link.spawn("h5", ["true"])
    deadline = time.monotonic() + 10  # the gateway's children went with their stdin
    while left := marked(mark):
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"children of the lost gateway are left: {left}")
        time.sleep(0.05)


def marked(mark: str) -> list[int]:
    """Live processes here whose command line has ``mark`` (from /proc: no pgrep needed)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark.encode() in words and state != "Z":
            found.append(int(entry.name))
    return found


def test_a_program_goes_to_the_gateway_once_and_to_each_child_from_there(
    link: GatewayLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[bytes] = []
    send = link.send
    monkeypatch.setattr(
        link, "send", lambda kind, n, data=b"": (sent.append(kind), send(kind, n, data))
    )
    children = [link.spawn(f"h{i}", ["wc", "-c"]) for i in (1, 2)]
    for child in children:
        link.feed(child, "hostops")
        child.stdin.close()
    size = len(payload("hostops").data)
    assert [int(c.stdout.read()) for c in children] == [size, size]
    assert sent.count(b"c") == 1 and sent.count(b"f") == 2


def test_a_silent_child_holds_its_connect_slot_only_until_the_hold_ends(
    link: GatewayLink, monkeypatch: pytest.MonkeyPatch
) -> None:
    import poprun_py.ssh.tree as tree

    monkeypatch.setattr(tree, "START_HOLD", 0.3)
    window = threading.Semaphore(1)
    window.acquire()
    silent = link.spawn("h1", ["sleep", "30"])
    silent.on_started = window.release
    link.hold(silent)
    assert not window.acquire(timeout=0.1)  # held while it says nothing
    assert window.acquire(timeout=5)  # released once the hold is over
    talking = link.spawn("h2", ["echo", "hi"])
    talking.on_started = window.release
    link.hold(talking)
    assert window.acquire(timeout=5)  # released at its first word
    end_process(silent)


def test_preflight_names_a_trees_hosts_with_their_gateways_once() -> None:
    from poprun_py.core.spec import HostSpec
    from poprun_py.ssh.openssh import over_openssh
    from poprun_py.ssh.tree import TreeConnection, plain_endpoint

    settings = SshSettings()

    class Link:
        name = ""
        alive = True

    conns = []
    for i in range(3, 9):
        link = Link()
        link.name = "n1" if i < 6 else "n2"
        host = HostSpec(f"n{i}")
        conns.append(TreeConnection(host, plain_endpoint(host, settings), settings, link))  # type: ignore[arg-type]
    assert over_openssh(conns) == "over OpenSSH's ssh: n[3-8] (on their gateways n[1-2]: --fanout)"


def test_hosts_fed_at_once_each_get_the_program_that_went_to_the_gateway_once(
    link: GatewayLink,
) -> None:
    """The first feed's c frame is queued before any other host's f (the race: a host whose
    f passed the c got no program, and its agent never answered)."""
    children = [link.spawn(f"h{i}", ["wc", "-c"]) for i in range(16)]
    start = threading.Barrier(len(children))

    def feed(child: RemoteChild) -> None:
        start.wait()
        link.feed(child, "check_instance")
        child.stdin.close()

    threads = [threading.Thread(target=feed, args=(c,)) for c in children]
    for thread in threads:
        thread.start()
    size = len(payload("check_instance").data)
    assert [int(c.stdout.read()) for c in children] == [size] * len(children)
