"""One host's part of a group operation (:meth:`~poprun_py.ssh.pool.ConnectionPool.each`):
what its worker returned, or the fault it raised (a :class:`~poprun_py.ssh.errors.TransportError`
for a host that cannot be reached, whatever ``fn`` raised otherwise) -- never both.

Example:

    >>> ok, bad = HostResult(3), HostResult(fault=TimeoutError("slow"))
    >>> ok.ok, ok.value, ok.fault, bad.ok, bad.fault
    (True, 3, None, False, TimeoutError('slow'))
    >>> bad.fault or bad.value  # the fault, else the value (a failure reads as its message)
    TimeoutError('slow')
    >>> bad.value
    Traceback (most recent call last):
    ...
    TimeoutError: slow
    >>> values({"h1": ok, "h2": HostResult("x")})
    {'h1': 3, 'h2': 'x'}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class HostResult(Generic[T]):
    """A value (``fault`` None), or a fault: what the host's worker raised."""

    returned: T | None = None
    fault: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when the worker returned (its value may be None)."""
        return self.fault is None

    @property
    def value(self) -> T:
        """What the worker returned; its fault is raised when it did not."""
        if self.fault is not None:
            raise self.fault
        return cast(T, self.returned)


def values(results: Mapping[str, HostResult[T]]) -> dict[str, T]:
    """Every host's value, when every host has one; else the first fault, in host order, is
    raised (for callers that want all or nothing)."""
    return {host: result.value for host, result in results.items()}
