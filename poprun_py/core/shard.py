"""Input shards: each instance gets a disjoint, balanced, deterministic set of input files.

Files are ordered by size (largest first, then path), then dealt out in rounds: each round gives
one file to every shard, the largest file of the round to the lightest shard. So counts differ by
at most one, the heaviest shard exceeds the lightest by at most the largest single file, and the
result does not depend on the order the files were listed in.

``eval_pad=B`` pads every shard to the same whole number of batches of ``B`` entries, repeating
the shard's own files at its end; ``Shard.padding`` says how many trailing entries are padding.

Balanced is not even: fewer files than shards leave shards empty, and one big file outweighs many
small ones. :func:`uneven_shards` says so, in one line each: an instance that gets no files, or a
heaviest shard over :data:`UNEVEN_FACTOR` times the lightest (the plan's notes; refused with
``--strict-shards``).

Example:

    >>> files = [InputFile("a", 50), InputFile("b", 40), InputFile("c", 30), InputFile("d", 5)]
    >>> [s.files for s in assign_shards(files, 2)]
    [('a', 'd'), ('b', 'c')]
    >>> assign_shards(files, 3, eval_pad=2)[0]
    Shard(files=('a', 'a'), bytes=50, padding=1)
    >>> uneven_shards(assign_shards(files, 2))
    []
    >>> uneven_shards(assign_shards(files, 5))[0]
    '1 of 5 instances gets no input files (4 files for 5 instances): instance 4'
    >>> uneven_shards(assign_shards([InputFile("a", 10**6), InputFile("b", 13000)], 2))[0][:64]
    'the largest input shard (976.6 KiB, instance 0) is 76.9x the sma'
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poprun_py.errors import InputError


@dataclass(frozen=True)
class InputFile:
    """One input file and its size in bytes."""

    path: str
    size: int


@dataclass(frozen=True)
class Shard:
    """One instance's input: its files, their total bytes (padding excluded), and how many
    trailing entries of ``files`` are padding repeated to fill the last batch."""

    files: tuple[str, ...] = ()
    bytes: int = 0
    padding: int = 0


EMPTY_SHARD = Shard()


@dataclass(frozen=True)
class InputSet:
    """Many input files as two parallel tuples (cheaper than a million InputFile objects)."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]

    @staticmethod
    def of(files: Sequence[InputFile]) -> InputSet:
        """An InputSet from InputFile objects."""
        return InputSet(tuple(f.path for f in files), tuple(f.size for f in files))

    def __len__(self) -> int:
        return len(self.paths)


UNEVEN_FACTOR = 2.0
"""A heaviest shard over this many times the lightest is noted (``--strict-shards``: refused)."""


def uneven_shards(shards: Sequence[Shard], factor: float = UNEVEN_FACTOR) -> list[str]:
    """One line per way ``shards`` are uneven: instances with no files, a heaviest shard over
    ``factor`` times the lightest (bytes, padding excluded); [] when they are even enough."""
    problems = []
    empty = [i for i, s in enumerate(shards) if len(s.files) == s.padding]
    if empty:
        files = sum(len(s.files) - s.padding for s in shards)
        problems.append(
            f"{len(empty)} of {len(shards)} instances {'gets' if len(empty) == 1 else 'get'} no "
            f"input files ({files} files for "
            f"{len(shards)} instances): instance{'s' if len(empty) > 1 else ''} {_some(empty)}"
        )
    full = [i for i, s in enumerate(shards) if len(s.files) > s.padding]
    if len(full) > 1:
        big = max(full, key=lambda i: shards[i].bytes)
        small = min(full, key=lambda i: shards[i].bytes)
        top, low = shards[big].bytes, shards[small].bytes
        if top > factor * low:
            ratio = f"{top / low:.1f}x" if low else "many times"
            problems.append(
                f"the largest input shard ({human_bytes(top)}, instance {big}) is {ratio} the "
                f"smallest ({human_bytes(low)}, instance {small}), over {factor:g}x: split the "
                "big files, or give more files than instances"
            )
    return problems


def refuse_uneven(shards: Sequence[Shard], factor: float = UNEVEN_FACTOR) -> None:
    """InputError (exit 2, nothing started) with the first of :func:`uneven_shards`' lines."""
    problems = uneven_shards(shards, factor)
    if problems:
        raise InputError(f"uneven input shards (--strict-shards): {problems[0]}")


def _some(indices: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, indices[:limit]))
    return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")


def human_bytes(n: int) -> str:
    """``976.6 KiB``: bytes in binary units, as the plan's tables show them."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def parse_manifest(text: str, source: str = "manifest") -> list[tuple[str, int | None]]:
    """Parse a manifest: one path a line, optionally followed by a tab or space and its size.

    Blank lines and lines starting with ``#`` are skipped. A line whose last space-separated
    field is not a number is taken whole as a path (so paths may contain spaces).
    """
    paths, sizes = parse_manifest_columns(text, source)
    return list(zip(paths, sizes, strict=True))


def parse_manifest_columns(
    text: str, source: str = "manifest"
) -> tuple[list[str], list[int | None]]:
    """:func:`parse_manifest` as two columns; fast when every line carries a size."""
    fast = _fast_columns(text)
    if fast is not None:
        return fast
    paths: list[str] = []
    sizes: list[int | None] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        path, size = _split_manifest_line(line)
        if size is not None and size < 0:
            raise InputError(f"{source}:{lineno}: negative size for {path!r}")
        paths.append(path)
        sizes.append(size)
    if not paths:
        raise InputError(f"{source}: the manifest lists no files")
    return paths, sizes


def _fast_columns(text: str) -> tuple[list[str], list[int | None]] | None:
    """The common case, at C speed: every line is exactly ``path size`` (one space, no tabs,
    comments or blank lines). The split is proved right by rebuilding the text from it; None
    when the text is not that simple."""
    if not text or "\t" in text or "#" in text or "\r" in text:
        return None
    tokens = text.split()
    paths, sizes = tokens[0::2], tokens[1::2]
    if len(paths) != len(sizes) or not all(map(str.isdigit, sizes)):
        return None
    if "\n".join(map(" ".join, zip(paths, sizes, strict=True))) != text.rstrip("\n"):
        return None
    return paths, list(map(int, sizes))


def _split_manifest_line(line: str) -> tuple[str, int | None]:
    sep = "\t" if "\t" in line else " "
    head, _, tail = line.rpartition(sep)
    tail = tail.strip()
    if head and (tail.isdigit() or (tail.startswith("-") and tail[1:].isdigit())):
        return head.strip(), int(tail)
    return line, None


def assign_shards(
    files: Sequence[InputFile] | InputSet, num_shards: int, eval_pad: int | None = None
) -> list[Shard]:
    """Split ``files`` into ``num_shards`` balanced shards (see the module docstring)."""
    if num_shards < 1:
        raise InputError("the number of shards must be at least 1")
    if eval_pad is not None and eval_pad < 1:
        raise InputError(f"--eval-pad must be at least 1, got {eval_pad}")
    inputs = files if isinstance(files, InputSet) else InputSet.of(files)
    if not inputs.paths:
        return [EMPTY_SHARD] * num_shards
    import numpy as np

    paths, sizes = _sorted_unique(inputs)
    order = _largest_first(sizes)
    shard_of = np.empty(len(paths), dtype=np.int64)
    shard_of[order] = _deal(sizes[order], num_shards)
    members = np.argsort(shard_of, kind="stable")  # by shard, then by path
    counts = np.bincount(shard_of, minlength=num_shards)
    totals = np.bincount(shard_of, weights=sizes, minlength=num_shards)
    per_shard = 0
    if eval_pad is not None:
        per_shard = -(-len(paths) // (num_shards * eval_pad)) * eval_pad
    ordered_paths = paths[members].tolist()
    shards, start = [], 0
    for count, total in zip(counts.tolist(), totals.tolist(), strict=True):
        chunk = ordered_paths[start : start + count]
        start += count
        shards.append(_make_shard(chunk, int(total), per_shard, str(paths[int(order[0])])))
    return shards


def _sorted_unique(inputs: InputSet) -> tuple[Any, Any]:
    """Paths (an object array) sorted and de-duplicated (first listing wins), with their sizes."""
    import numpy as np

    raw = inputs.paths
    paths = np.empty(len(raw), dtype=object)
    paths[:] = raw
    sizes = np.asarray(inputs.sizes, dtype=np.int64)
    if not all(map(operator.lt, raw[:-1], raw[1:])):  # not already sorted and unique
        order = sorted(range(len(raw)), key=raw.__getitem__)
        paths, sizes = paths[order], sizes[order]
    keep = np.ones(len(paths), dtype=bool)
    keep[1:] = paths[1:] != paths[:-1]
    if keep.all():
        return paths, sizes
    return paths[keep], sizes[keep]


def _largest_first(sizes: Any) -> Any:
    """Indices by size, largest first, ties in path (index) order. With unique integer keys
    any sort gives that order, and numpy's default sort is faster than its stable one."""
    import numpy as np

    n = len(sizes)
    top = int(sizes.max())
    if top >= (1 << 62) // n:  # the combined key would overflow: sort stably instead
        return np.argsort(-sizes, kind="stable")
    return np.argsort((top - sizes) * n + np.arange(n))


def _deal(sizes: Any, num_shards: int) -> Any:
    """Deal files (sorted largest first) in rounds, the largest of each round to the lightest
    shard; returns each file's shard."""
    import numpy as np

    loads = np.zeros(num_shards, dtype=np.int64)
    by_load = np.arange(num_shards)
    result = np.empty(len(sizes), dtype=np.int64)
    for start in range(0, len(sizes), num_shards):
        if start:  # lightest first; a stable sort keeps ties in shard order
            by_load = np.argsort(loads, kind="stable")
        chunk = sizes[start : start + num_shards]
        targets = by_load[: len(chunk)]
        result[start : start + len(chunk)] = targets
        loads[targets] += chunk
    return result


def _make_shard(paths: list[str], total: int, per_shard: int, fallback: str) -> Shard:
    padding = max(0, per_shard - len(paths))
    if padding:
        pool = paths or [fallback]
        paths = paths + [pool[i % len(pool)] for i in range(padding)]
    return Shard(tuple(paths), total, padding)
