"""Input files from ``--input GLOB`` (repeatable), ``--input DIR`` and ``--input @manifest``: the
I/O edge of sharding. Globs are expanded and sized with ``stat`` (``**`` spans directories); a
directory means every file under it, recursively, hidden ones (names starting with ``.``, and
whatever is under such directories) left out, as ``DIR/**`` matches them; manifests may carry
sizes (then nothing is stat-ed, so a manifest can describe data that lives only on the hosts).

Example:

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.rec").write_bytes(b"xx"); _ = (d / "b.rec").write_bytes(b"y")
    >>> files = collect_inputs([str(d / "*.rec")])
    >>> [pathlib.Path(p).name for p in files.paths], files.sizes
    (['a.rec', 'b.rec'], (2, 1))
    >>> len(collect_inputs([str(d)]))
    2
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import cast

from poprun_py.core.shard import InputSet, parse_manifest_columns
from poprun_py.errors import InputError


def collect_inputs(patterns: Sequence[str], cwd: str | None = None) -> InputSet:
    """Expand every pattern (glob or ``@manifest``) into one InputSet of absolute paths."""
    base = cwd or os.getcwd()
    paths: list[str] = []
    sizes: list[int] = []
    for pattern in patterns:
        if pattern.startswith("@"):
            more_paths, more_sizes = _from_manifest(pattern[1:], base)
        else:
            more_paths, more_sizes = _from_glob(pattern, base)
        paths.extend(more_paths)
        sizes.extend(more_sizes)
    return InputSet(tuple(paths), tuple(sizes))


def _from_glob(pattern: str, base: str) -> tuple[list[str], list[int]]:
    if not pattern:
        raise InputError("--input needs a glob pattern, a directory or @manifest")
    full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
    if not glob.has_magic(full) and os.path.isdir(full):  # a directory: every file under it
        found = glob.glob(os.path.join(glob.escape(full), "**"), recursive=True)
        matches = sorted(p for p in found if os.path.isfile(p))
        if not matches:
            raise InputError(_empty_directory(pattern, full))
        return matches, [os.path.getsize(p) for p in matches]
    if not glob.has_magic(full) and not os.path.lexists(full):
        raise InputError(f"--input {pattern!r}: no such file or directory")
    found = glob.glob(full, recursive=True)
    matches = sorted(p for p in found if os.path.isfile(p))
    if not matches:
        raise InputError(_no_files(pattern, full, base, found))
    return matches, [os.path.getsize(p) for p in matches]


def _empty_directory(pattern: str, full: str) -> str:
    """Why directory ``full`` gave no files: it has none, or only hidden ones."""
    hidden = sorted(os.path.join(d, f) for d, _, names in os.walk(full) for f in names)
    if not hidden:
        return f"--input {pattern!r} is a directory with no files in it"
    example = os.path.join(pattern, os.path.relpath(hidden[0], full))
    return (
        f"--input {pattern!r} is a directory whose {len(hidden)} file(s) are all hidden "
        f"(under names starting with '.'), which a directory leaves out: name them, e.g. "
        f"--input {example!r}"
    )


def _no_files(pattern: str, full: str, base: str, found: list[str]) -> str:
    """Why glob ``full`` matched no files: only directories, or its directory is missing."""
    dirs = [p for p in found if os.path.isdir(p)]
    if dirs:
        return (
            f"--input {pattern!r} matches only directories ({len(dirs)}, e.g. "
            f"{os.path.relpath(dirs[0], base)}): give a directory alone for every file "
            "under it, or a pattern that matches files"
        )
    missing = _missing_directory(full)
    if missing is not None:
        where = missing if os.path.isabs(pattern) else os.path.relpath(missing, base)
        return f"--input {pattern!r} matches no files: directory {where!r} does not exist"
    return f"--input {pattern!r} matches no files"


def _missing_directory(full: str) -> str | None:
    """The first directory on the fixed part of glob ``full`` (before any wildcard) that does
    not exist, if any."""
    parts = full.split(os.sep)[:-1]
    for k in range(2, len(parts) + 1):
        if glob.has_magic(parts[k - 1]):
            return None
        there = os.sep.join(parts[:k])
        if not os.path.isdir(there):
            return there
    return None


def _from_manifest(path: str, base: str) -> tuple[list[str], list[int]]:
    if not path:
        raise InputError("'@' must be followed by a manifest path")
    full = path if os.path.isabs(path) else os.path.join(base, path)
    try:
        with open(full, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise InputError(f"manifest {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read manifest {path!r}: {exc}") from None
    root = os.path.dirname(os.path.abspath(full))
    entries, known = parse_manifest_columns(text, path)
    if text.startswith("/") + text.count("\n/") < len(entries):  # some path is relative
        entries = [p if p.startswith("/") else os.path.join(root, p) for p in entries]
    if None not in known:
        return entries, cast("list[int]", known)
    return entries, [_stat(path, e, s) for e, s in zip(entries, known, strict=True)]


def _stat(manifest: str, path: str, size: int | None) -> int:
    """``size`` when the manifest gave it, else the file's size on disk."""
    if size is not None:
        return size
    try:
        return os.path.getsize(path)
    except OSError:
        raise InputError(
            f"{manifest}: input file {os.path.basename(path)!r} does not exist"
        ) from None
