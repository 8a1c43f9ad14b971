"""A small strict schema checker for YAML data: the types of a cluster spec, unknown keys
refused, defaults filled in, every fault reported with its key path.

It replaces a general validation library on purpose: a cluster spec needs eight kinds of value,
and importing and building a general validator cost more than the rest of ``poprun-py launch``.
Checked objects come back as read-only attribute namespaces.

Example:

    >>> spec = Obj({"name": Str(), "port": Int(ge=1, le=65535, default=22)}, required=("name",))
    >>> checked = check(spec, {"name": "h1"})
    >>> checked.name, checked.port
    ('h1', 22)
    >>> check(spec, {"name": "h1", "prot": 2})
    Traceback (most recent call last):
    ...
    poprun_py.core.schema.SchemaFault: prot: unknown key
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Path = tuple[str | int, ...]


class SchemaFault(ValueError):
    """A value that does not fit the schema, with the key path where it was found."""

    def __init__(self, path: Path, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{'.'.join(map(str, path))}: {message}" if path else message)


class Record(Mapping[str, Any]):
    """A checked object: its keys as attributes and as a read-only mapping."""

    def __init__(self, values: Mapping[str, Any]):
        self.__dict__["_values"] = MappingProxyType(dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Record({dict(self._values)!r})"


def _got(value: Any) -> str:
    return (
        f"got {value!r}" if not isinstance(value, dict | list) else f"got a {type(value).__name__}"
    )


@dataclass(frozen=True)
class Spec:
    """Base of every value kind; ``default`` is used when an object's key is absent."""

    default: Any = field(default=None, kw_only=True)

    def check(self, value: Any, path: Path) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class Str(Spec):
    """A string, optionally non-empty and matching ``pattern``."""

    min_len: int = 0
    pattern: str | None = None

    def check(self, value: Any, path: Path) -> Any:
        if not isinstance(value, str):
            raise SchemaFault(path, f"expected a string, {_got(value)}")
        if len(value) < self.min_len:
            raise SchemaFault(path, "must not be empty")
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise SchemaFault(path, f"{value!r} is not allowed here (pattern {self.pattern})")
        return value


@dataclass(frozen=True)
class Int(Spec):
    """An integer (not a bool, not a string of digits) within optional bounds."""

    ge: int | None = None
    le: int | None = None

    def check(self, value: Any, path: Path) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaFault(path, f"expected an integer, {_got(value)}")
        return _bounded(value, self.ge, self.le, path)


@dataclass(frozen=True)
class Float(Spec):
    """A number (int or float, not a bool) within optional bounds; ``gt`` is exclusive."""

    ge: float | None = None
    gt: float | None = None

    def check(self, value: Any, path: Path) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaFault(path, f"expected a number, {_got(value)}")
        if self.gt is not None and value <= self.gt:
            raise SchemaFault(path, f"must be greater than {self.gt}, got {value!r}")
        return _bounded(float(value), self.ge, None, path)


def _bounded(value: Any, ge: float | None, le: float | None, path: Path) -> Any:
    if ge is not None and value < ge:
        raise SchemaFault(path, f"must be at least {ge}, got {value!r}")
    if le is not None and value > le:
        raise SchemaFault(path, f"must be at most {le}, got {value!r}")
    return value


@dataclass(frozen=True)
class Bool(Spec):
    """``true`` or ``false`` (not ``yes``, ``1`` or a string)."""

    def check(self, value: Any, path: Path) -> Any:
        if not isinstance(value, bool):
            raise SchemaFault(path, f"expected true or false, {_got(value)}")
        return value


@dataclass(frozen=True)
class OneOf(Spec):
    """One of a fixed set of strings."""

    values: tuple[str, ...] = ()

    def check(self, value: Any, path: Path) -> Any:
        if value not in self.values:
            raise SchemaFault(path, f"expected one of {', '.join(self.values)}, {_got(value)}")
        return value


@dataclass(frozen=True)
class ListOf(Spec):
    """A list whose items all fit ``item``."""

    item: Spec = field(default_factory=Spec)
    min_len: int = 0

    def check(self, value: Any, path: Path) -> Any:
        if not isinstance(value, list):
            raise SchemaFault(path, f"expected a list, {_got(value)}")
        if len(value) < self.min_len:
            raise SchemaFault(path, f"needs at least {self.min_len} item(s)")
        return tuple(self.item.check(v, (*path, i)) for i, v in enumerate(value))


@dataclass(frozen=True)
class MapOf(Spec):
    """A mapping from string keys to values that fit ``value``."""

    value: Spec = field(default_factory=Spec)

    def check(self, value: Any, path: Path) -> Any:
        if not isinstance(value, dict):
            raise SchemaFault(path, f"expected a mapping, {_got(value)}")
        for key in value:
            if not isinstance(key, str):
                raise SchemaFault((*path, str(key)), "keys must be strings")
        return MappingProxyType({k: self.value.check(v, (*path, k)) for k, v in value.items()})


@dataclass(frozen=True)
class Either(Spec):
    """The first of ``options`` whose kind matches; their faults when none does."""

    options: tuple[Spec, ...] = ()

    def check(self, value: Any, path: Path) -> Any:
        faults = []
        for option in self.options:
            try:
                return option.check(value, path)
            except SchemaFault as fault:
                if fault.path != path:  # the right kind, a fault inside it
                    raise
                faults.append(fault.message)
        raise SchemaFault(path, " or ".join(faults))


@dataclass(frozen=True)
class Obj(Spec):
    """A mapping with known keys only; absent optional keys take their spec's default."""

    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: Sequence[str] = ()

    def check(self, value: Any, path: Path) -> Any:
        if not isinstance(value, dict):
            raise SchemaFault(path, f"expected a mapping, {_got(value)}")
        for key in value:
            if key not in self.fields:
                raise SchemaFault((*path, str(key)), "unknown key")
        for key in self.required:
            if key not in value:
                raise SchemaFault((*path, key), "required key is missing")
        return Record(
            {
                key: spec.check(value[key], (*path, key)) if key in value else _default(spec, path)
                for key, spec in self.fields.items()
            }
        )


def _default(spec: Spec, path: Path) -> Any:
    if isinstance(spec, Obj) and spec.default is None:
        return spec.check({}, path)
    return spec.default


def check(spec: Spec, value: Any) -> Any:
    """Check ``value`` against ``spec``; raise SchemaFault naming the first fault's path."""
    return spec.check(value, ())
