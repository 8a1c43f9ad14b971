"""Print this process's argv, chosen environment values, cwd and shard files as JSON.

The injection tests run it through each backend and compare the result, byte for byte, with what
they asked for. ``DUMP_ENV`` names the variables to include, separated by commas; ``shard`` is
the list of files in ``$POPRUN_SHARD_FILE`` (one a line).

    $ DUMP_ENV=HOME python examples/dump_args.py 'a b' '$(x)'
    {"argv": ["a b", "$(x)"], "env": {"HOME": "/root"}, "cwd": "/work/main", "shard": []}
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    """Print the JSON line; non-ASCII is escaped so any terminal or pipe carries it intact."""
    names = [n for n in os.environ.get("DUMP_ENV", "").split(",") if n]
    env = {n: os.environ.get(n) for n in names}
    shard = []
    if os.environ.get("POPRUN_SHARD_FILE"):
        with open(os.environ["POPRUN_SHARD_FILE"], encoding="utf-8") as handle:
            shard = [line for line in handle.read().split("\n") if line]
    line = {"argv": sys.argv[1:], "env": env, "cwd": os.getcwd(), "shard": shard}
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
