"""The program ``poprun-py check`` launches on every planned instance: a short real check of the
network and devices each instance will have, run with the instance's own binding and
environment, through whichever backend the launch uses (standard library only).

Every instance (rank 0 included) connects to ``MASTER_ADDR:MASTER_PORT``, where rank 0 serves,
and measures latency there, all at once (the fastest of ``ROUNDS`` 8-byte round trips); then,
one instance at a time (a link's bandwidth is not shared), bandwidth (the fastest of
``TRANSFERS`` times ``BYTES`` sent and acknowledged); then all of them take part in a sum
all-reduce of a vector (rank 0 sums the contributions once every rank has sent one, and sends
the sum back; the answer is checked). Each instance also checks that the device variables it
got list its planned devices (``POPRUN_DEVICES``) and that its host has those devices. With
``--torch 1``, where torch is importable, a Gloo all-reduce follows (its store on
``MASTER_PORT + 1``).

Sixteen instances starting at once on a host of 2 cores wait for each other's imports, so this
module imports only C modules of the standard library (``_socket``, ``_thread``, ``struct``,
``math``) and writes its JSON itself (:func:`dumps`); ``poprun-py check`` runs it through
the one bootstrap of :mod:`poprun_py.hostside.bundle` (no runpy, whose imports it skips). The
hosts need nothing of poprun-py: the bundle ships in each instance's environment (by the
variable's name, never in an argv), and runs on Python 3.7 or later.

Each instance prints one line ``POPRUN-CHECK {json}`` and exits 0 whether the check passed or
not (so that the launch's fail-fast does not stop the others before they report); it exits 1
only when it could not report. ``poprun_py.launch.check`` reads the lines.

Example (one instance on its own: it serves and checks itself)::

    >>> import os, subprocess, sys
    >>> env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
    ...        "MASTER_PORT": "0", "POPRUN_HOST_NAME": "h1"}
    >>> out = subprocess.run([sys.executable, "-m", "poprun_py.hostside.check_instance"], env=env,
    ...                      capture_output=True, text=True, timeout=20).stdout
    >>> import json; report = json.loads(out.split(" ", 1)[1])
    >>> report["ok"], report["allreduce"], report["rank"]
    (True, True, 0)
"""

from __future__ import annotations

import _socket  # not socket, threading, json: their imports were most of each instance's start
import _thread
import math
import os
import struct
import sys
import time

TYPE_CHECKING = False  # not typing's (nor collections.abc): each costs every instance's start
if TYPE_CHECKING:
    from collections.abc import Mapping

    Socket = _socket.socket

MARK = "POPRUN-CHECK"
ROUNDS = 10
BYTES = 1 << 20
TRANSFERS = 3
VECTOR = 1024
DEFAULT_TIMEOUT = 5.0
ANSWER_GRACE = 2.0
RETRY = 0.01  # between connection attempts while rank 0 is not listening yet
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}


def dumps(value: object) -> str:
    """``json.dumps(value, sort_keys=True)`` for a report (str, int, float, bool, None, lists,
    dicts), without importing json (and re, enum) in every instance.

    >>> dumps({"b": [1, 2.5, None], "a": "x", "ok": True})
    '{"a": "x", "b": [1, 2.5, null], "ok": true}'
    """
    if isinstance(value, str):
        return '"' + "".join(_escape(c) for c in value) + '"'
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ", ".join(f"{dumps(str(k))}: {dumps(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):  # not list | tuple: Python 3.7 runs this too
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return _scalar(value)


def _scalar(value: object) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float.__repr__(value)
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    raise TypeError(f"cannot report a {type(value).__name__}")


def _escape(c: str) -> str:
    if " " <= c <= "~":
        return _ESCAPES.get(c, c)
    if c in _ESCAPES:
        return _ESCAPES[c]
    code = ord(c)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def _recv_exact(sock: Socket, n: int) -> bytes:
    buffer = bytearray(n)
    _recv_into(sock, memoryview(buffer))
    return bytes(buffer)


def _recv_into(sock: Socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (no allocation, no copy: a transfer's bytes land in place)."""
    while len(view):
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("connection closed")
        view = view[got:]


def _recv_transfer(sock: Socket, scratch: bytearray) -> bytearray:
    """Receive one message into ``scratch`` (grown when too small) and discard it."""
    (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
    if len(scratch) < size:
        scratch = bytearray(size)
    _recv_into(sock, memoryview(scratch)[:size])
    return scratch


def _send_msg(sock: Socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def _recv_msg(sock: Socket) -> bytes:
    (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
    return _recv_exact(sock, size)


def _nodelay(sock: Socket) -> Socket:
    """No Nagle: a message's last segment would otherwise wait for the peer's delayed ACK
    (40 ms on loopback for the first 1 MiB transfer of a connection)."""
    sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    return sock


def _host(address: str) -> str | bytes:
    """An ASCII name as bytes: getaddrinfo then skips the idna codec (and its import)."""
    return address.encode() if address.isascii() else address


class Server:
    """Rank 0's side: an echo for every latency probe at once, a turn at a time for bandwidth, a
    barrier for the all-reduce; a thread (``_thread``) per connection."""

    def __init__(self, address: str, port: int, world: int, deadline: float):
        self.sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        self.sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((address, port))
        except OSError:
            self.sock.bind(("", port))  # MASTER_ADDR is not an address of this host
        self.sock.listen(max(world, 16))
        self.port: int = self.sock.getsockname()[1]
        self.world, self.deadline = world, deadline
        self.turn = _thread.allocate_lock()
        self.lock = _thread.allocate_lock()
        self.all_in = _thread.allocate_lock()  # held until every rank's vector is in
        self.all_in.acquire()
        self.idle = _thread.allocate_lock()  # held until every session ended
        self.idle.acquire()
        self.sessions, self.accepting = 0, True
        self.sums: list[float] = [0.0] * VECTOR
        self.ranks: set[int] = set()

    def start(self) -> None:
        """Serve on a thread of its own (:meth:`serve`)."""
        _thread.start_new_thread(self.serve, ())

    def serve(self) -> None:
        """Accept every rank's connection until the deadline; one thread each."""
        self.sock.settimeout(0.1)
        accepted = 0
        try:
            while accepted < self.world and time.monotonic() < self.deadline:
                try:
                    fd, _ = self.sock._accept()  # type: ignore[attr-defined]  # socket.accept's
                except (TimeoutError, _socket.timeout):  # one class from 3.10 on, not on 3.7-3.9
                    continue
                with self.lock:
                    self.sessions += 1
                _thread.start_new_thread(self._client, (_nodelay(_socket.socket(fileno=fd)),))
                accepted += 1
        finally:
            self.sock.close()
            self._ended(session=False)

    def wait(self, timeout: float) -> None:
        """Until every session has ended (the others' answers are sent), at most ``timeout``."""
        if self.idle.acquire(timeout=max(0.0, timeout)):
            self.idle.release()

    def _ended(self, session: bool) -> None:
        """A session ended, or accepting did; the last of them lets :meth:`wait` return."""
        with self.lock:
            if session:
                self.sessions -= 1
            else:
                self.accepting = False
            if not self.sessions and not self.accepting:
                self.idle.release()

    def _client(self, conn: Socket) -> None:
        try:
            conn.settimeout(max(0.1, self.deadline - time.monotonic()))
            self._session(conn)
        except (OSError, ValueError, struct.error):
            pass
        finally:
            conn.close()
            self._ended(session=True)

    def _session(self, conn: Socket) -> None:
        rank = int(_recv_msg(conn))
        for _ in range(ROUNDS):  # every instance at once: 8 bytes do not share a link
            conn.sendall(_recv_exact(conn, 8))
        with self.turn:  # bandwidth one instance at a time: figures per host, not shared
            _send_msg(conn, b"go")
            scratch = bytearray()
            for _ in range(TRANSFERS):
                scratch = _recv_transfer(conn, scratch)
                _send_msg(conn, b"ok")
        values = struct.unpack(f"!{VECTOR}d", _recv_msg(conn))
        with self.lock:
            self.sums = [a + b for a, b in zip(self.sums, values)]  # noqa: B905 (3.7)
            self.ranks.add(rank)
            if len(self.ranks) == self.world:
                self.all_in.release()
        if not self.all_in.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            with self.lock:
                missing = sorted(set(range(self.world)) - self.ranks)
            _send_msg(conn, ("missing " + ",".join(map(str, missing))).encode())
            return
        self.all_in.release()  # the next waiting session passes too
        _send_msg(conn, struct.pack(f"!{VECTOR}d", *self.sums))
        conn.recv(1)  # the client closes first: its side keeps TIME_WAIT, not MASTER_PORT


def connect(address: str, port: int, deadline: float) -> Socket:
    """Connect, retrying until the deadline (rank 0 may not be listening yet)."""
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            left = max(0.05, min(1.0, deadline - time.monotonic()))
            return _connect_once(address, port, left)
        except OSError as exc:
            last = exc
            time.sleep(RETRY)
    raise ConnectionError(f"cannot reach MASTER_ADDR {address}:{port}: {last or 'timed out'}")


def _connect_once(address: str, port: int, timeout: float) -> Socket:
    """What ``socket.create_connection`` does: each of the name's addresses in turn."""
    last: OSError = OSError(f"no address for {address}")
    for family, kind, proto, _, where in _socket.getaddrinfo(
        _host(address), port, 0, _socket.SOCK_STREAM
    ):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            return _nodelay(sock)
        except OSError as exc:
            sock.close()
            last = exc
    raise last


def measure(sock: Socket, rank: int, nbytes: int) -> dict[str, object]:
    """Latency, bandwidth and the all-reduce, as rank ``rank``."""
    _send_msg(sock, str(rank).encode())
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        sock.sendall(b"pingpong")
        _recv_exact(sock, 8)
        best = min(best, time.perf_counter() - t0)
    message = struct.pack("!Q", nbytes) + bytes(nbytes)  # made once: copied by no transfer
    _recv_msg(sock)  # our turn
    seconds = float("inf")
    for _ in range(TRANSFERS):  # the best of a few: one may lose the CPU to another process
        t0 = time.perf_counter()
        sock.sendall(message)
        _recv_msg(sock)
        seconds = min(seconds, time.perf_counter() - t0)
    _send_msg(sock, struct.pack(f"!{VECTOR}d", *([float(rank + 1)] * VECTOR)))
    answer = _recv_msg(sock)
    report: dict[str, object] = {
        "latency_ms": round(best * 1000, 3),
        "bandwidth_MBps": round(nbytes / seconds / 1e6, 1),
    }
    if answer.startswith(b"missing"):
        missing = [int(r) for r in answer.split()[1].split(b",")] if b" " in answer else []
        report.update(error=f"all-reduce incomplete: ranks {missing} missing", missing=missing)
        report["allreduce"] = False
        return report
    return {**report, "allreduce": True, "sum": struct.unpack(f"!{VECTOR}d", answer)[0]}


DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
VENDOR_OF = {"CUDA_VISIBLE_DEVICES": "0x10de", "ROCR_VISIBLE_DEVICES": "0x1002"}


def check_devices(env: Mapping[str, str], sys_root: str = "") -> tuple[bool, str]:
    """Whether the device variables list the planned devices and the host has them."""
    planned = env.get("POPRUN_DEVICES", "")
    for name in DEVICE_VARS:
        if name not in env:
            continue
        if env[name] != planned:
            return False, f"{name}={env[name]} but the plan gives {planned or 'none'}"
        have = _count_gpus(VENDOR_OF[name], sys_root)
        ids = [int(x) for x in planned.split(",") if x]
        if ids and max(ids) >= have:
            return False, f"{name}={planned} but this host has {have} such GPU(s)"
    return True, planned


def _count_gpus(vendor: str, sys_root: str) -> int:
    base = f"{sys_root}/sys/bus/pci/devices"
    count = 0
    for entry in os.listdir(base) if os.path.isdir(base) else ():
        try:
            with open(f"{base}/{entry}/class") as c, open(f"{base}/{entry}/vendor") as v:
                if c.read().startswith("0x03") and v.read().strip() == vendor:
                    count += 1
        except OSError:
            continue
    return count


def torch_gloo(rank: int, world: int, addr: str, port: int, timeout: float) -> dict[str, object]:
    """A sum all-reduce through torch.distributed's Gloo (its sockets follow
    GLOO_SOCKET_IFNAME); ``gloo`` is None where torch is not importable."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {"gloo": None}
    from datetime import timedelta

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
        )
        try:
            value = torch.ones(4) * (rank + 1)
            dist.all_reduce(value)
            if value.tolist() != [world * (world + 1) / 2] * 4:
                return {"gloo": False, "error": "torch Gloo all-reduce gave a wrong sum"}
        finally:
            dist.destroy_process_group()
    except (RuntimeError, ValueError) as exc:
        return {"gloo": False, "error": f"torch Gloo: {str(exc).splitlines()[0]}"}
    return {"gloo": True}


def run(
    env: Mapping[str, str],
    timeout: float = DEFAULT_TIMEOUT,
    nbytes: int = BYTES,
    torch: bool = False,
) -> dict[str, object]:
    """This instance's check; the report it prints."""
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
    deadline = time.monotonic() + timeout
    report: dict[str, object] = {"rank": rank, "host": env.get("POPRUN_HOST_NAME", "")}
    ok_devices, seen = check_devices(env)
    report.update(devices=seen, devices_ok=ok_devices)
    server = None
    if rank == 0:
        server = Server(addr, port, world, deadline)
        port = server.port
        server.start()
    t0 = time.monotonic()
    try:
        sock = connect(addr, port, deadline)
        try:
            report["connect_ms"] = round((time.monotonic() - t0) * 1000, 1)
            # past the deadline: rank 0 answers "ranks missing" at the deadline, before this
            sock.settimeout(max(0.1, deadline - time.monotonic()) + ANSWER_GRACE)
            report.update(measure(sock, rank, nbytes))
        finally:
            sock.close()
    except (OSError, ValueError, struct.error) as exc:
        report.setdefault("error", str(exc) or type(exc).__name__)
        report["allreduce"] = False
    if server is not None:  # the others' answers are sent before rank 0 exits
        server.wait(max(0.0, deadline - time.monotonic()) + 2.0)
    expected = world * (world + 1) / 2
    if report.get("allreduce") and report.pop("sum", None) != expected:
        report.update(allreduce=False, error="all-reduce gave a wrong sum")
    if torch and report.get("allreduce"):
        report.update(
            torch_gloo(rank, world, addr, port + 1, max(1.0, deadline - time.monotonic()))
        )
    report["ok"] = bool(report.get("allreduce")) and ok_devices and "error" not in report
    if not ok_devices:
        report.setdefault("error", seen)
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m poprun_py.hostside.check_instance [--timeout S] [--bytes N] [--torch 1]``
    (or this module's bundle, run by :mod:`poprun_py.hostside.bundle`'s bootstrap)."""
    args = sys.argv[1:] if argv is None else argv
    opts = dict(zip(args[::2], args[1::2]))  # noqa: B905 (no strict= on Python 3.7)
    report = run(
        os.environ,
        float(opts.get("--timeout", DEFAULT_TIMEOUT)),
        int(opts.get("--bytes", BYTES)),
        opts.get("--torch") == "1",
    )
    sys.stdout.write(f"{MARK} {dumps(report)}\n")
    sys.stdout.flush()
    return 0


def program() -> None:
    """The check program: :func:`main`, then exit without the interpreter's teardown (a few ms
    of CPU for each of the instances that end together on a host)."""
    code = main()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    program()
