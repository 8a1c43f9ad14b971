"""Readiness of a supervision's descriptors (:mod:`poprun_py.process.supervise`): a
:class:`Poller` over epoll (else poll) that gives back each ready descriptor's data, and the
:class:`Pipe` that pairs a child's open pipe with the :class:`~poprun_py.process.children.Feed`
its bytes go to.

Example:

    >>> import os
    >>> r, w = os.pipe()
    >>> poller = Poller()
    >>> poller.register(r, "mine")
    >>> poller.ready(0), os.write(w, b"x"), poller.ready(1)
    ([], 1, ['mine'])
    >>> poller.unregister(r); poller.close(); os.close(r); os.close(w)
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import IO, Any

from poprun_py.process.children import Feed


@dataclass(frozen=True)
class Pipe:
    """One open pipe and the Feed its bytes go to."""

    file: IO[bytes]
    feed: Feed

    def close(self) -> None:
        """Close the pipe and flush the feed."""
        self.file.close()
        self.feed.close()


class Poller:
    """Readiness of many descriptors, each with its data: epoll (else poll) used directly, as
    the selectors module's own bookkeeping cost ~60 us a child (three descriptors each
    registered and unregistered; 16 x ``true``: ~1 ms of a 14 ms launch)."""

    def __init__(self) -> None:
        self._epoll = hasattr(select, "epoll")
        self._poll: Any = select.epoll() if self._epoll else select.poll()
        self.data: dict[int, Any] = {}

    def register(self, fd: int, data: Any) -> None:
        """Watch ``fd`` for input (or its end); :meth:`ready` gives ``data`` back for it."""
        self._poll.register(fd, select.EPOLLIN if self._epoll else select.POLLIN)
        self.data[fd] = data

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed)."""
        self._poll.unregister(fd)
        del self.data[fd]

    def ready(self, timeout: float | None) -> list[Any]:
        """The data of every descriptor ready within ``timeout`` seconds (None: no limit)."""
        if self._epoll:
            events = self._poll.poll(-1 if timeout is None else timeout)
        else:
            events = self._poll.poll(None if timeout is None else timeout * 1000)
        return [self.data[fd] for fd, _ in events if fd in self.data]

    def close(self) -> None:
        """Release the epoll descriptor."""
        if self._epoll:
            self._poll.close()
