#!/usr/bin/env bash
# The whole test suite, on a fresh machine, with everything it needs.
#
#   1. Debian packages (sshd, Open MPI, iproute2, numactl, Slurm, munge, ...) when root;
#   2. poprun-py with its test extras, editable, into the current Python;
#   3. ruff and mypy --strict, then pytest (unit, then integration on real processes, real sshd
#      test hosts in network namespaces, real Open MPI, real Slurm, moto as a local server).
#
# Usage: scripts/test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"

scripts/install-deps.sh

# (re)install when poprun-py is missing, installed from another checkout, or a test extra is
# missing; checked from / so the current directory does not shadow the installed package
installed=$(cd / && "$PYTHON" -c 'import os, poprun_py; print(os.path.dirname(os.path.dirname(os.path.abspath(poprun_py.__file__))))' 2>/dev/null || true)
if [ "$installed" != "$PWD" ] || ! (cd / && "$PYTHON" -c 'import pytest, pytest_timeout, mpi4py, moto, numpy, fabric, paramiko, jinja2, yaml, ClusterShell, typer, rich, mypy, ruff') >/dev/null 2>&1; then
    # editable as a plain path entry (compat): no import hook runs at each start (~15 ms)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[test]'
fi

echo "== ruff"
"$PYTHON" -m ruff check poprun_py tests benchmarks examples
echo "== mypy --strict"
"$PYTHON" -m mypy poprun_py
echo "== pytest"
exec "$PYTHON" -m pytest -q -p no:cacheprovider --durations=15 "$@"
