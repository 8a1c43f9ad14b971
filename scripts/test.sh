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

if ! "$PYTHON" -c 'import poprun_py, pytest, mpi4py, moto, numpy, fabric' >/dev/null 2>&1 \
    || ! "$PYTHON" -m pip show poprun-py >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[test]'
fi

echo "== ruff"
"$PYTHON" -m ruff check poprun_py tests benchmarks examples
echo "== mypy --strict"
"$PYTHON" -m mypy poprun_py
echo "== pytest"
exec "$PYTHON" -m pytest -q -p no:cacheprovider --durations=15 "$@"
