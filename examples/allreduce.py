"""A small TCP allreduce (sum) among the instances of one job, for programs without MPI.

Rank 0 listens on ``MASTER_PORT`` (all interfaces); every other rank connects to
``MASTER_ADDR:MASTER_PORT``, retrying until ``timeout``. Each call sends a float64 vector to
rank 0, which sums the vectors in rank order and sends the sum back, so every rank gets the
same bits. Every wait has a timeout, and every failure is an :class:`AllreduceError` naming the
rank and the peer.

Example (each instance, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set):

    with TcpAllreduce.from_env(timeout=30) as comm:
        total = comm.allreduce(np.array([1.0, 2.0]))
"""

from __future__ import annotations

import os
import socket
import struct
import time
from types import TracebackType

import numpy as np

_HEADER = struct.Struct("!Q")
_HELLO = struct.Struct("!II")


class AllreduceError(RuntimeError):
    """The allreduce could not complete (peer missing, gone, slow or inconsistent)."""


class TcpAllreduce:
    """A star allreduce: rank 0 sums, everyone receives the sum."""

    def __init__(self, rank: int, world: int, addr: str, port: int, timeout: float = 30.0):
        if not 0 <= rank < world:
            raise AllreduceError(f"rank {rank} is outside a world of {world}")
        self.rank, self.world, self.addr, self.port = rank, world, addr, port
        self.timeout = timeout
        self.peers: list[socket.socket] = []
        self.master: socket.socket | None = None
        if world > 1 and rank == 0:
            self._accept_all()
        elif world > 1:
            self._connect()

    @classmethod
    def from_env(cls, timeout: float = 30.0) -> TcpAllreduce:
        """Build from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a world of 1 if unset)."""
        env = os.environ
        return cls(
            int(env.get("RANK", "0")),
            int(env.get("WORLD_SIZE", "1")),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", "29500")),
            timeout,
        )

    def _accept_all(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", self.port))
        except OSError as err:
            raise AllreduceError(f"rank 0: cannot listen on port {self.port}: {err}") from err
        server.listen(self.world)
        server.settimeout(self.timeout)
        by_rank: dict[int, socket.socket] = {}
        try:
            while len(by_rank) < self.world - 1:
                conn = self._accept_one(server, len(by_rank))
                rank, world = _HELLO.unpack(_recv_exact(conn, _HELLO.size, "hello"))
                if world != self.world or not 0 < rank < self.world or rank in by_rank:
                    conn.close()
                    raise AllreduceError(f"rank 0: bad hello from rank {rank} (world {world})")
                by_rank[rank] = conn
        finally:
            server.close()
        self.peers = [by_rank[r] for r in range(1, self.world)]

    def _accept_one(self, server: socket.socket, have: int) -> socket.socket:
        try:
            conn, _ = server.accept()
        except TimeoutError as err:
            raise AllreduceError(
                f"rank 0: only {have} of {self.world - 1} peers connected within {self.timeout} s"
            ) from err
        conn.settimeout(self.timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _connect(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection((self.addr, self.port), timeout=self.timeout)
                break
            except OSError as err:
                if time.monotonic() >= deadline:
                    raise AllreduceError(
                        f"rank {self.rank}: cannot reach rank 0 at {self.addr}:{self.port} "
                        f"within {self.timeout} s: {err}"
                    ) from err
                time.sleep(0.05)
        conn.settimeout(self.timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(_HELLO.pack(self.rank, self.world))
        self.master = conn

    def allreduce(self, vector: np.ndarray) -> np.ndarray:
        """The elementwise sum of ``vector`` over all ranks (float64), on every rank."""
        data = np.ascontiguousarray(vector, dtype=np.float64)
        if self.world == 1:
            return data.copy()
        if self.rank == 0:
            total = data.copy()
            for rank, peer in enumerate(self.peers, start=1):
                total += _recv_vector(peer, data.size, f"rank {rank}")
            payload = _frame(total)
            for peer in self.peers:
                peer.sendall(payload)
            return total
        assert self.master is not None
        self.master.sendall(_frame(data))
        return _recv_vector(self.master, data.size, "rank 0")

    def close(self) -> None:
        """Close every connection."""
        for sock in [*self.peers, *([self.master] if self.master else [])]:
            sock.close()
        self.peers, self.master = [], None

    def __enter__(self) -> TcpAllreduce:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _frame(vector: np.ndarray) -> bytes:
    body = vector.tobytes()
    return _HEADER.pack(len(body)) + body


def _recv_vector(sock: socket.socket, size: int, peer: str) -> np.ndarray:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, peer))
    if length != size * 8:
        raise AllreduceError(f"{peer} sent {length // 8} values, expected {size}")
    return np.frombuffer(_recv_exact(sock, length, peer), dtype=np.float64)


def _recv_exact(sock: socket.socket, count: int, peer: str) -> bytes:
    chunks, have = [], 0
    while have < count:
        try:
            chunk = sock.recv(min(count - have, 1 << 20))
        except TimeoutError as err:
            raise AllreduceError(f"timed out waiting for {peer}") from err
        except OSError as err:
            raise AllreduceError(f"lost {peer}: {err}") from err
        if not chunk:
            raise AllreduceError(f"{peer} closed the connection")
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)
