#!/usr/bin/env bash
# The main job on the embedded default: installs poprun-py into the project's virtual
# environment (.venv/, made once with "$PYTHON", default python3; see scripts/venv.sh), then
# trains the example model (examples/train.py) data-parallel on two simulated hosts with the
# local backend. Each instance reads its own shard of the generated data set and prints its
# loss falling. When nothing changed since the last run, pip is not run.
#
# Usage: [PYTHON=python3.X] scripts/example.sh [extra poprun-py launch options]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/venv.sh
. scripts/venv.sh
venv_ready ""

"$VENV_PYTHON" examples/make_data.py --out examples/data >/dev/null
exec "$VENV_DIR/bin/poprun-py" launch --cluster clusters/local-2.yaml \
    --input 'examples/data/*.npz' "$@" -- "$VENV_PYTHON" examples/train.py --steps 30
