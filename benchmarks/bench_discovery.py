"""What hardware discovery adds to preflight's one check script per host (issue 15: at most
5 ms): the script with and without discovery (and with ``--network``'s ``ip -o -4 addr``),
interleaved, median of N runs, on this machine's /sys and on a synthetic DGX-class tree (in
/dev/shm) of 300 PCI functions, 8 GPUs, 10 RDMA NICs and 20 interfaces. The script runs in the
session preflight already has, so this difference is the whole cost.

Usage:

    python benchmarks/bench_discovery.py [--runs 101]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from poprun_py.core.hardware import DISCOVERY_SCRIPT
from poprun_py.preflight.probes import CHECK_SCRIPT, Checks, checks_argv

SHM = "/dev/shm" if Path("/dev/shm").is_dir() else None  # in memory, as sysfs is


def synthetic_tree(root: Path) -> None:
    """300 PCI functions (8 of them GPUs), 10 RDMA NICs, 20 interfaces."""
    for k in range(300):
        d = root / "sys/bus/pci/devices" / f"0000:{k // 8:02x}:{k % 8:02x}.0"
        d.mkdir(parents=True)
        gpu = k % 37 == 0 and k < 37 * 8
        (d / "class").write_text("0x030200\n" if gpu else "0x060400\n")
        (d / "vendor").write_text("0x10de\n" if gpu else "0x8086\n")
        (d / "numa_node").write_text(f"{k * 2 // 300}\n")
    for k in range(10):
        d = root / f"sys/class/infiniband/mlx5_{k}"
        (d / "ports/1").mkdir(parents=True)
        (d / "device").mkdir()
        (d / "device/numa_node").write_text(f"{k % 2}\n")
    for k in range(20):
        d = root / f"sys/class/net/if{k}/device"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{k % 2}\n")


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=101)
    runs = parser.parse_args().runs
    checks = Checks(commands=("python3",), files=("/etc/hostname",))
    with tempfile.TemporaryDirectory(dir=SHM) as tmp:
        synthetic_tree(Path(tmp))
        prefix = ["sh", "-c", "poprun_discover() {" + DISCOVERY_SCRIPT + "}\n"]
        cases = {
            "check script, no discovery": checks_argv(
                Checks(**{**checks.__dict__, "hardware": False}), False
            ),
            "check script + discovery (/sys here)": checks_argv(checks, False),
            "check script + discovery + addresses": checks_argv(
                Checks(**{**checks.__dict__, "network": "198.18.0.0/15"}), False
            ),
            "discovery alone, 300-function tree": [
                *prefix[:2],
                prefix[2] + 'poprun_discover "$1" 0',
                "sh",
                tmp,
            ],
            "empty sh -c (the floor)": ["sh", "-c", ":"],
        }
        assert CHECK_SCRIPT in cases["check script, no discovery"]
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):  # interleaved: the machine's load hits every case alike
            for name, argv in cases.items():
                times[name].append(timed(argv))
    base = statistics.median(times["check script, no discovery"])
    floor = statistics.median(times["empty sh -c (the floor)"])
    print(f"median of {runs} runs, interleaved")
    for name, values in times.items():
        med = statistics.median(values)
        extra = f"  (+{(med - base) * 1000:.2f} ms)" if "check script +" in name else ""
        if "alone" in name:
            extra = f"  (+{(med - floor) * 1000:.2f} ms over an empty sh)"
        print(f"{name:40s} {med * 1000:6.2f} ms{extra}")


if __name__ == "__main__":
    main()
