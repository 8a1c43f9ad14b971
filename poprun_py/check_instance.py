"""The program ``poprun-py check`` launches on every planned instance: a short real check of the
network and devices each instance will have, run with the instance's own binding and
environment, through whichever backend the launch uses (standard library only).

Every instance (rank 0 included) connects to ``MASTER_ADDR:MASTER_PORT``, where rank 0 serves;
then, one instance at a time, measures latency (the fastest of ``ROUNDS`` 8-byte round trips)
and bandwidth (the fastest of ``TRANSFERS`` times ``BYTES`` sent and acknowledged); then all
of them take part in a sum all-reduce of a vector (rank 0 sums the contributions once every
rank has sent one, and sends the sum back; the answer is checked). Each instance also checks
that the device variables it got list its planned devices (``POPRUN_DEVICES``) and that its
host has those devices. With ``--torch 1``, where torch is importable, a Gloo all-reduce
follows (its store on ``MASTER_PORT + 1``).

Each instance prints one line ``POPRUN-CHECK {json}`` and exits 0 whether the check passed or
not (so that the launch's fail-fast does not stop the others before they report); it exits 1
only when it could not report. ``poprun_py.launch.check`` reads the lines.

Example (one instance on its own: it serves and checks itself)::

    >>> import os, subprocess, sys
    >>> env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
    ...        "MASTER_PORT": "0", "POPRUN_HOST_NAME": "h1"}
    >>> out = subprocess.run([sys.executable, "-m", "poprun_py.check_instance"], env=env,
    ...                      capture_output=True, text=True, timeout=20).stdout
    >>> import json; report = json.loads(out.split(" ", 1)[1])
    >>> report["ok"], report["allreduce"], report["rank"]
    (True, True, 0)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping

MARK = "POPRUN-CHECK"
ROUNDS = 10
BYTES = 1 << 20
TRANSFERS = 3
VECTOR = 1024
DEFAULT_TIMEOUT = 5.0
ANSWER_GRACE = 2.0
_CHUNK = 1 << 16


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = sock.recv(min(left, _CHUNK * 16))
        if not chunk:
            raise ConnectionError("connection closed")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _send_msg(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def _recv_msg(sock: socket.socket) -> bytes:
    (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
    return _recv_exact(sock, size)


class Server:
    """Rank 0's side: a turn at a time for measurements, a barrier for the all-reduce."""

    def __init__(self, address: str, port: int, world: int, deadline: float):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((address, port))
        except OSError:
            self.sock.bind(("", port))  # MASTER_ADDR is not an address of this host
        self.sock.listen(max(world, 16))
        self.port = self.sock.getsockname()[1]
        self.world, self.deadline = world, deadline
        self.turn = threading.Lock()
        self.cond = threading.Condition()
        self.sums: list[float] = [0.0] * VECTOR
        self.ranks: set[int] = set()

    def serve(self) -> None:
        """Accept every rank's connection until the deadline; one thread each."""
        self.sock.settimeout(0.1)
        threads: list[threading.Thread] = []
        while len(threads) < self.world and time.monotonic() < self.deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._client, args=(conn,), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(max(0.0, self.deadline - time.monotonic()) + 1.0)
        self.sock.close()

    def _client(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(max(0.1, self.deadline - time.monotonic()))
            with contextlib.suppress(OSError, ValueError):
                self._session(conn)

    def _session(self, conn: socket.socket) -> None:
        rank = int(_recv_msg(conn))
        with self.turn:  # one instance measures at a time: figures per host, not shared
            _send_msg(conn, b"go")
            for _ in range(ROUNDS):
                conn.sendall(_recv_exact(conn, 8))
            for _ in range(TRANSFERS):
                _recv_msg(conn)
                _send_msg(conn, b"ok")
        values = struct.unpack(f"!{VECTOR}d", _recv_msg(conn))
        with self.cond:
            self.sums = [a + b for a, b in zip(self.sums, values, strict=True)]
            self.ranks.add(rank)
            self.cond.notify_all()
            while len(self.ranks) < self.world:
                if not self.cond.wait(max(0.0, self.deadline - time.monotonic())):
                    break
            if len(self.ranks) < self.world:
                missing = sorted(set(range(self.world)) - self.ranks)
                _send_msg(conn, json.dumps({"missing": missing}).encode())
                return
            result = struct.pack(f"!{VECTOR}d", *self.sums)
        _send_msg(conn, result)
        conn.recv(1)  # the client closes first: its side keeps TIME_WAIT, not MASTER_PORT


def connect(address: str, port: int, deadline: float) -> socket.socket:
    """Connect, retrying until the deadline (rank 0 may not be listening yet)."""
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            left = max(0.05, min(1.0, deadline - time.monotonic()))
            return socket.create_connection((address, port), timeout=left)
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise ConnectionError(f"cannot reach MASTER_ADDR {address}:{port}: {last or 'timed out'}")


def measure(sock: socket.socket, rank: int, nbytes: int) -> dict[str, object]:
    """Latency, bandwidth and the all-reduce, as rank ``rank``."""
    _send_msg(sock, str(rank).encode())
    _recv_msg(sock)  # our turn
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        sock.sendall(b"pingpong")
        _recv_exact(sock, 8)
        best = min(best, time.perf_counter() - t0)
    payload = bytes(nbytes)
    seconds = float("inf")
    for _ in range(TRANSFERS):  # the best of a few: one may lose the CPU to another process
        t0 = time.perf_counter()
        _send_msg(sock, payload)
        _recv_msg(sock)
        seconds = min(seconds, time.perf_counter() - t0)
    _send_msg(sock, struct.pack(f"!{VECTOR}d", *([float(rank + 1)] * VECTOR)))
    answer = _recv_msg(sock)
    report: dict[str, object] = {
        "latency_ms": round(best * 1000, 3),
        "bandwidth_MBps": round(nbytes / seconds / 1e6, 1),
    }
    if answer.startswith(b"{"):
        missing = json.loads(answer)["missing"]
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
    serving = None
    if rank == 0:
        server = Server(addr, port, world, deadline)
        port = server.port
        serving = threading.Thread(target=server.serve, daemon=True)
        serving.start()
    t0 = time.monotonic()
    try:
        with connect(addr, port, deadline) as sock:
            report["connect_ms"] = round((time.monotonic() - t0) * 1000, 1)
            # past the deadline: rank 0 answers "ranks missing" at the deadline, before this
            sock.settimeout(max(0.1, deadline - time.monotonic()) + ANSWER_GRACE)
            report.update(measure(sock, rank, nbytes))
    except (OSError, ValueError, struct.error) as exc:
        report.setdefault("error", str(exc) or type(exc).__name__)
        report["allreduce"] = False
    if serving is not None:  # the others' answers are sent before rank 0 exits
        serving.join(max(0.0, deadline - time.monotonic()) + 2.0)
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
    """``python -m poprun_py.check_instance [--timeout S] [--bytes N] [--torch 1]``."""
    args = sys.argv[1:] if argv is None else argv
    opts = dict(zip(args[::2], args[1::2], strict=False))
    report = run(
        os.environ,
        float(opts.get("--timeout", DEFAULT_TIMEOUT)),
        int(opts.get("--bytes", BYTES)),
        opts.get("--torch") == "1",
    )
    sys.stdout.write(f"{MARK} {json.dumps(report, sort_keys=True)}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
