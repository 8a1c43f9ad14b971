"""Print one JSON line describing this MPI rank: rank, size, host, an allreduce, PopDist env.

Used by the mpirun tests and handy to check an MPI setup by hand:

    $ mpirun --allow-run-as-root -np 2 python examples/mpi_check.py
    {"rank": 0, "size": 2, "hostname": "vm", "allreduce": 3, "env": {...}}
    {"rank": 1, "size": 2, "hostname": "vm", "allreduce": 3, "env": {...}}

``allreduce`` is the sum of ``rank + 1`` over all ranks, so it is ``size * (size + 1) / 2``.
"""

from __future__ import annotations

import json
import os
import socket

from mpi4py import MPI


def main() -> None:
    """Print this rank's line."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    env = {k: v for k, v in os.environ.items() if k.startswith(("POPDIST_", "POPRUN_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name in os.environ:
            env[name] = os.environ[name]
    line = {"rank": rank, "size": size, "hostname": socket.gethostname(), "allreduce": total}
    print(json.dumps({**line, "env": env}), flush=True)


if __name__ == "__main__":
    main()
