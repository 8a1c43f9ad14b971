"""tests/ports.py: a port the test holds is the program's, whoever else wants a port meanwhile;
a port found free and let go is not (issue 26, item 6: "free_port() can race").

Shown in a network namespace of its own whose ephemeral range is 10 ports: every bind to port 0
and every outgoing connection there then takes one of those 10, so "the kernel would hand it to
someone else" is certain, not a matter of luck."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

IN_A_NAMESPACE = """
import json, socket
from tests.ports import held_port

RANGE = range(40000, 40010)
open("/proc/sys/net/ipv4/ip_local_port_range", "w").write("40000 40009")

def takers(reuse):
    # what others get meanwhile: binds to port 0 (with and without SO_REUSEADDR), then
    # outgoing connections, until the range is used up
    got, server = [], socket.socket()
    server.bind(("127.0.0.2", 5000))
    server.listen(64)
    for kind in ("bind", "connect"):
        while True:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            try:
                sock.bind(("127.0.0.1", 0)) if kind == "bind" else sock.connect(("127.0.0.2", 5000))
            except OSError:
                sock.close()
                break
            got.append(sock)
    ports = [s.getsockname()[1] for s in got]
    for sock in got + [server]:
        sock.close()
    return ports

def found_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

def program_listens(port):
    program = socket.socket()
    program.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    program.bind(("0.0.0.0", port))
    program.listen()
    socket.create_connection(("127.0.0.1", port)).close()
    program.close()
    return True

def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
    except ConnectionRefusedError:
        return True
    return False

def thief(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True

report = {}
port = found_free()
report["free"] = {"port": port, "taken": port in takers(0)}
for reuse in (0, 1):
    with held_port() as port:
        taken = takers(reuse)
        report[f"held{reuse}"] = {
            "port": port, "in_range": port in RANGE, "taken": port in taken,
            "others": len(taken), "refused": refused(port), "thief": thief(port),
            "program": program_listens(port),
        }
print(json.dumps(report))
"""


@pytest.mark.requires("root", "unshare", "ip")
def test_a_held_port_goes_to_no_one_else_and_to_the_program() -> None:
    up = 'ip link set lo up && exec "$@"'
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", up, "sh", sys.executable, "-c", IN_A_NAMESPACE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["free"]["taken"], report  # the race: a port found free goes to the next taker
    for reuse in (0, 1):  # SO_REUSEADDR on the others' sockets or not
        held = report[f"held{reuse}"]
        assert held["in_range"] and held["others"] == 9, held  # the other 9 went to others
        assert not held["taken"] and not held["thief"], held  # none had the held one
        assert held["refused"] and held["program"], held


def test_the_modules_example_runs() -> None:
    import doctest

    from tests import ports

    results = doctest.testmod(ports)
    assert results.attempted == 2 and results.failed == 0  # the import and the block
