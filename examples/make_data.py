"""Make the example data set: 16 small .npz files of a linearly separable-ish problem.

Each file holds ``x`` (rows of features) and ``y`` (0/1 labels) drawn from one fixed logistic
model with a seed per file, so the same command always writes the same bytes. Files are written
atomically, so several instances may call :func:`ensure_data` at once.

Example:

    $ python examples/make_data.py --out /tmp/data --files 16
    16 files in /tmp/data
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

NUM_FEATURES = 8
DEFAULT_DIR = Path(__file__).resolve().parent / "data"
TRUE_WEIGHTS = np.linspace(-2.0, 2.0, NUM_FEATURES)
TRUE_BIAS = 0.25


def make_file(path: Path, seed: int, rows: int) -> None:
    """Write one file of ``rows`` samples drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, NUM_FEATURES))
    p = 1.0 / (1.0 + np.exp(-(x @ TRUE_WEIGHTS + TRUE_BIAS)))
    y = (rng.random(rows) < p).astype(np.float64)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        np.savez(handle, x=x, y=y)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; data files are for everyone to read
    os.replace(tmp, path)


def file_names(files: int) -> list[str]:
    """The names of the data files, in order."""
    return [f"part-{i:03d}.npz" for i in range(files)]


def ensure_data(directory: Path = DEFAULT_DIR, files: int = 16, rows: int = 256) -> list[Path]:
    """Write any missing data file under ``directory``; return every file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed, name in enumerate(file_names(files)):
        path = directory / name
        if not path.exists():
            make_file(path, seed, rows + 16 * seed)
        paths.append(path)
    return paths


def main() -> None:
    """Command line: ``--out DIR --files N --rows R``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args()
    paths = ensure_data(args.out, args.files, args.rows)
    print(f"{len(paths)} files in {args.out}")


if __name__ == "__main__":
    main()
