"""TCP ports for a program a test starts, which the test keeps until the program has bound them.

A port found free (bind to port 0, close) and bound later by the program can be taken in
between (issue 26): by any bind to port 0, which the kernel may answer with it again, or as an
outgoing connection's local port. :func:`held_port` closes that window: the test keeps the
port bound, with ``SO_REUSEADDR`` and never listening, while the block runs. The kernel then
hands it to no one (not to a bind to port 0, not to a connection, not to a bind without
``SO_REUSEADDR``), while the program, which binds it with ``SO_REUSEADDR`` -- as rank 0's
listeners here do (examples/allreduce.py, poprun_py/hostside/check_instance.py) and slurmctld --
still can, and listens on it. Until the program listens, a connection to the port is refused.
(A program that bound without ``SO_REUSEADDR`` would fail at once with "Address already in use",
every time: never a silent pass.)

Example:

    >>> import socket
    >>> with held_port() as port:
    ...     program = socket.socket()
    ...     program.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ...     program.bind(("0.0.0.0", port))
    ...     program.listen()
    ...     socket.create_connection(("127.0.0.1", port)).close()
    ...     program.close()
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_port(address: str = "127.0.0.1") -> Iterator[int]:
    """A TCP port on ``address`` that stays this test's (bound, not listening) in the block."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        yield int(sock.getsockname()[1])
