#!/usr/bin/env bash
# The main job on the embedded default: installs poprun-py, then trains the example model
# (examples/train.py) data-parallel on two simulated hosts with the local backend. Each
# instance reads its own shard of the generated data set and prints its loss falling.
#
# Usage: scripts/example.sh [extra poprun-py launch options]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
installed=$(cd / && "$PYTHON" -c 'import os, poprun_py; print(os.path.dirname(os.path.dirname(os.path.abspath(poprun_py.__file__))))' 2>/dev/null || true)
if [ "$installed" != "$PWD" ]; then
    # editable as a plain path entry (compat): no import hook runs at each start (~15 ms)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e .
fi
"$PYTHON" examples/make_data.py --out examples/data >/dev/null
exec "$PYTHON" -m poprun_py launch --cluster clusters/local-2.yaml \
    --input 'examples/data/*.npz' "$@" -- "$PYTHON" examples/train.py --steps 30
