"""A small data-parallel training program: logistic regression with numpy, run by poprun-py.

Each instance reads its input shard (``poprun_py.dist.shard_files()``; on its own, every file of
``--data``, made by ``make_data.py`` on first use), computes the gradient of the log loss on it,
and averages gradients over all instances every step: with mpi4py's Allreduce under MPI
(``OMPI_COMM_WORLD_SIZE`` set), else with the TCP allreduce of ``allreduce.py`` over
``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``. Every instance ends with the same
weights and prints the same, falling, loss. Exit code 0 on success, 1 on a communication
error, 2 on bad input, 3 when ``--crash-instance`` says so (on the first attempt only).

With ``--checkpoint-dir`` instance 0 writes the weights and the step every ``--checkpoint-every``
steps (atomically; the directory must be shared by the hosts, or be the same path on a shared
file system), and every instance of a restarted job (``POPRUN_RESTART_COUNT`` > 0, see
``poprun-py launch --max-restarts``) resumes from it: the final weights (``weights`` in the last
line, a digest) are those of an uninterrupted run.

Example:

    $ python examples/make_data.py --out /tmp/data
    $ poprun-py launch --hosts localhost --instances 4 --replicas 4 \\
        --input '/tmp/data/*.npz' python examples/train.py --steps 20
    [localhost:0] step 1 loss 0.6931
    ...
    [localhost:3] final loss 0.3732 accuracy 0.862 samples 6016 instance 3/4
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Protocol

import numpy as np

try:
    from poprun_py import dist
except ImportError:  # run from a checkout without installing poprun-py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from poprun_py import dist

from allreduce import AllreduceError, TcpAllreduce
from make_data import DEFAULT_DIR, NUM_FEATURES, ensure_data


class Comm(Protocol):
    """Sums a vector over all instances."""

    def allreduce(self, vector: np.ndarray) -> np.ndarray: ...


class MpiComm:
    """mpi4py's Allreduce (sum) over MPI_COMM_WORLD."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD

    def allreduce(self, vector: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(vector, dtype=np.float64)
        recv = np.empty_like(send)
        self.comm.Allreduce(send, recv, op=self.mpi.SUM)
        return recv


def communicator(timeout: float) -> Comm:
    """MPI when running under mpirun and mpi4py is there, else the TCP allreduce."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        try:
            return MpiComm()
        except ImportError:
            pass
    return TcpAllreduce.from_env(timeout=timeout)


def input_files(data_dir: Path) -> list[Path]:
    """This instance's shard (padding dropped), or every file of ``data_dir`` when alone."""
    files = dist.shard_files()
    if not files and not dist.isPopdistEnvSet():
        return ensure_data(data_dir)
    padding = dist.shard_padding()
    return [Path(f) for f in files[: len(files) - padding]]


def load(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Stack the samples of ``files``; a bias column of ones is appended to x."""
    xs, ys = [], []
    for path in files:
        with np.load(path) as data:
            xs.append(data["x"])
            ys.append(data["y"])
    if not xs:
        return np.zeros((0, NUM_FEATURES + 1)), np.zeros(0)
    x = np.concatenate(xs)
    return np.hstack([x, np.ones((len(x), 1))]), np.concatenate(ys)


def local_sums(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[gradient sum..., loss sum, correct predictions, samples] over this shard."""
    if len(x) == 0:
        return np.zeros(len(w) + 3)
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    eps = 1e-12
    loss = -np.sum(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
    correct = np.sum((p > 0.5) == (y > 0.5))
    return np.concatenate([x.T @ (p - y), [loss, correct, len(x)]])


CHECKPOINT = "checkpoint.npz"


def resume(args: argparse.Namespace) -> tuple[np.ndarray, int]:
    """The weights and the last step done: from the checkpoint on a restart, else zeros and 0."""
    w = np.zeros(NUM_FEATURES + 1)
    path = args.checkpoint_dir / CHECKPOINT if args.checkpoint_dir else None
    if path is None or dist.restart_count() == 0 or not path.exists():
        return w, 0
    with np.load(path) as saved:
        w, step = saved["w"], int(saved["step"])
    print(f"resumed from step {step} (restart {dist.restart_count()})", flush=True)
    return w, step


def checkpoint(args: argparse.Namespace, w: np.ndarray, step: int) -> None:
    """Instance 0 saves the weights after ``step`` (written aside, then renamed)."""
    if not args.checkpoint_dir or dist.getInstanceIndex() != 0:
        return
    if step % args.checkpoint_every and step != args.steps:
        return
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = args.checkpoint_dir / f".{CHECKPOINT}.{os.getpid()}.npz"
    np.savez(tmp, w=w, step=step)
    os.replace(tmp, args.checkpoint_dir / CHECKPOINT)


def digest(w: np.ndarray) -> str:
    """A short digest of the weights, to compare runs."""
    return hashlib.sha256(np.ascontiguousarray(w, dtype=np.float64).tobytes()).hexdigest()[:16]


def train(args: argparse.Namespace) -> int:
    """Train; print the loss every ``--log-every`` steps and a final summary line."""
    x, y = load(input_files(args.data))
    comm = communicator(args.timeout)
    rank, world = dist.getInstanceIndex(), dist.getNumInstances()
    w, done = resume(args)
    loss = accuracy = count = 0.0
    for step in range(done + 1, args.steps + 1):
        crash = step == args.crash_step and rank == args.crash_instance
        if crash and dist.restart_count() == 0:
            print(f"instance {rank}: crashing on purpose (--crash-instance)", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)  # at once, as a crash would: no teardown for the peers to outrun
        if args.step_seconds:
            time.sleep(args.step_seconds)
        total = comm.allreduce(local_sums(w, x, y))
        count = total[-1]
        if count == 0:
            print("no training samples in any shard", file=sys.stderr)
            return 2
        loss, accuracy = total[-3] / count, total[-2] / count
        w -= args.lr * total[:-3] / count
        checkpoint(args, w, step)
        if step == 1 or step % args.log_every == 0:
            print(f"step {step} loss {loss:.4f}", flush=True)
    print(
        f"final loss {loss:.4f} accuracy {accuracy:.3f} samples {int(count)} "
        f"instance {rank}/{world} weights {digest(w)}",
        flush=True,
    )
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--data", type=Path, default=DEFAULT_DIR, help="data when run alone")
    parser.add_argument("--timeout", type=float, default=60.0, help="allreduce timeout (s)")
    parser.add_argument("--crash-instance", type=int, default=-1, help="exit 3 at --crash-step")
    parser.add_argument("--crash-step", type=int, default=5)
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep before each step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run; turn communication and input errors into a message and an exit code."""
    args = parse_args(argv)
    try:
        return train(args)
    except AllreduceError as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as err:
        print(f"train.py: error: bad input: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
