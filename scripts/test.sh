#!/usr/bin/env bash
# The whole test suite, on a fresh machine, with everything it needs.
#
#   1. Debian packages (sshd, Open MPI, iproute2, numactl, Slurm, munge, ...) when root;
#   2. poprun-py with its test extras, editable, into the project's virtual environment
#      (.venv/, made once with "$PYTHON", default python3; see scripts/venv.sh);
#   3. ruff, mypy --strict and the docs build (mkdocs --strict), then pytest (unit, then
#      integration on real processes, real sshd test hosts in network namespaces, real Open
#      MPI, real Slurm, moto as a local server),
#      all from .venv (its bin first on PATH, so test hosts' sessions find the same python).
#
# Before the tests it prints one line: what this machine lacks that tests need (root, programs,
# Python modules: the table in tests/requirements.py) and the one `apt-get install` that adds
# it. Those tests skip, each naming what it needs and the Debian package that brings it, so an
# ordinary user's run passes; with CI=true every skip is a failure instead (except torch without
# a local wheel and old Pythons no registry serves: see tests/conftest.py).
#
# Tests run in a random order (pytest-randomly), a new one each run; its seed is printed at the
# end ("random order: -p randomly --randomly-seed=N replays it"). To replay a failing order:
#   scripts/test.sh -p randomly --randomly-seed=N [the failing test files]
# (-p no:randomly runs them in file order).
#
# Usage: [PYTHON=python3.X] scripts/test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

ci=()
case "${CI:-}" in [Tt][Rr][Uu][Ee] | 1) ci=(--ci) ;; esac

# as root: the Debian packages (otherwise the line below names them)
[ "$(id -u)" -ne 0 ] || scripts/install-deps.sh

# shellcheck source=scripts/venv.sh
. scripts/venv.sh
venv_ready test

# torch.distributed is one of the real clients the instance contract is tested against. It is
# installed only from a wheel this machine already has (pip's find-links, no index): a
# registry's torch is several GB. Without one, the tests marked torch skip, saying why.
if ! "$VENV_PYTHON" -c 'import torch' >/dev/null 2>&1; then
    wheels=$(mktemp -d)
    if "$VENV_PYTHON" -m pip download --quiet --disable-pip-version-check --no-index --no-deps \
        -d "$wheels" 'torch==2.13.*' >/dev/null 2>&1; then
        echo "test.sh: installing torch from this machine's wheel into .venv" >&2
        "$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check "$wheels"/torch-*.whl
    else
        echo "test.sh: no local torch wheel: the tests marked torch will skip" >&2
    fi
    rm -rf "$wheels"
fi

echo "test.sh: $("$VENV_PYTHON" tests/requirements.py "${ci[@]}")" >&2

echo "== ruff"
"$VENV_PYTHON" -m ruff check poprun_py tests benchmarks examples
echo "== mypy --strict"
"$VENV_PYTHON" -m mypy poprun_py
echo "== docs (mkdocs build --strict: a broken link or anchor fails)"
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 "$VENV_PYTHON" -m mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
echo "== pytest"
exec "$VENV_PYTHON" -m pytest -q -rfEs -p no:cacheprovider --durations=15 "$@"
