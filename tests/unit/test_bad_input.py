"""Bad input, table-driven: every case exits 2 with one line naming the fault, no traceback, and
launches nothing (the program would create a marker file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from poprun_py.cli import run

POD16 = str(Path(__file__).resolve().parents[2] / "clusters" / "pod16.yaml")

SPECS = {
    "malformed.yaml": "name: x\nhosts: [a\n",
    "list.yaml": "- a\n- b\n",
    "empty.yaml": "",
    "unknown-top.yaml": "name: x\nreplica: 4\nhosts: [{name: a}]\n",
    "unknown-host-key.yaml": "name: x\nhosts:\n  - name: a\n    adress: 198.18.0.1\n",
    "wrong-type.yaml": 'name: x\nhosts: [{name: a}]\ndefaults:\n  replicas: "4"\n',
    "hosts-mapping.yaml": "name: x\nhosts: {a: 1}\n",
    "host-no-name.yaml": "name: x\nhosts:\n  - address: 198.18.0.1\n",
    "duplicate-key.yaml": "name: x\nname: y\nhosts: [{name: a}]\n",
    "bad-cpulist.yaml": (
        'name: x\ntopologies:\n  t:\n    numa_nodes:\n      - {cpus: "0-a"}\n'
        "hosts: [{name: a, topology: t}]\n"
    ),
    "unknown-topology.yaml": "name: x\nhosts: [{name: a, topology: nope}]\n",
    "address-count.yaml": "name: x\nhosts:\n  - name: n[1-3]\n    address: 198.18.0.[1-2]\n",
    "bad-range.yaml": 'name: x\nhosts: [{name: "n[1-"}]\n',
    "bad-port.yaml": "name: x\nhosts: [{name: a, port: 70000}]\n",
    "bad-backend.yaml": "name: x\nhosts: [{name: a}]\ndefaults: {backend: pbs}\n",
    "env-reserved.yaml": 'name: x\nhosts: [{name: localhost}]\nenv: {RANK: "3"}\n',
    "bad-network.yaml": "name: x\nhosts: [{name: a}]\nnetwork: 10.0.0.0/40\n",
    "bad-device-env.yaml": (
        "name: x\ntopologies:\n  t:\n    device_env: 9X\n    numa_nodes: [{cpus: '0'}]\n"
        "hosts: [{name: a, topology: t}]\n"
    ),
    "numa-devices.yaml": (
        "name: x\ntopologies:\n  t:\n    numa_nodes:\n      - {cpus: '0-3', devices: [0]}\n"
        "      - {cpus: '4-7', devices: [1, 2, 3]}\nhosts: [{name: a, topology: t}]\n"
    ),
}

CASES: list[tuple[str, list[str], str]] = [
    # (id, arguments before the program, text the one line must contain)
    ("malformed-yaml", ["-c", "{d}/malformed.yaml"], "malformed.yaml:3: malformed YAML"),
    ("not-a-mapping", ["-c", "{d}/list.yaml"], "must be a mapping"),
    ("empty-spec", ["-c", "{d}/empty.yaml"], "the spec is empty"),
    ("unknown-key", ["-c", "{d}/unknown-top.yaml"], "unknown-top.yaml:2: replica: unknown key"),
    ("unknown-host-key", ["-c", "{d}/unknown-host-key.yaml"], ":4: hosts.0.adress: unknown key"),
    ("wrong-type", ["-c", "{d}/wrong-type.yaml"], ":4: defaults.replicas"),
    ("hosts-not-list", ["-c", "{d}/hosts-mapping.yaml"], ":2: hosts"),
    ("host-without-name", ["-c", "{d}/host-no-name.yaml"], "hosts.0.name: required key"),
    ("duplicate-key", ["-c", "{d}/duplicate-key.yaml"], ":2: name: duplicate key"),
    ("bad-cpulist", ["-c", "{d}/bad-cpulist.yaml"], "bad cpulist element '0-a'"),
    ("unknown-topology", ["-c", "{d}/unknown-topology.yaml"], "unknown topology 'nope'"),
    ("address-count", ["-c", "{d}/address-count.yaml"], "3 host name(s) but 2 address(es)"),
    ("bad-range-in-spec", ["-c", "{d}/bad-range.yaml"], "unbalanced '['"),
    ("bad-port", ["-c", "{d}/bad-port.yaml"], "hosts.0.port"),
    ("bad-backend-in-spec", ["-c", "{d}/bad-backend.yaml"], "defaults.backend"),
    ("reserved-env-in-spec", ["-c", "{d}/env-reserved.yaml"], "poprun-py sets RANK itself"),
    ("missing-spec", ["-c", "{d}/nope.yaml"], "no such cluster spec file"),
    ("shell-metachar-host", ["-H", "a;rm -rf x"], "bad host name 'a;rm -rf x'"),
    ("substitution-host", ["-H", "$(touch x)"], "bad host name"),
    ("empty-hosts", ["-H", ""], "empty host list"),
    ("unbalanced-range", ["-H", "n[1-"], "unbalanced '['"),
    ("reversed-range", ["-H", "n[3-1]"], "bad node range"),
    ("duplicate-host", ["-H", "a,a"], "host 'a' is listed twice"),
    ("missing-hostfile", ["-H", "@{d}/no-hostfile"], "does not exist"),
    ("bad-slots", ["-H", "@{d}/hostfile-bad"], "slots must be a positive integer"),
    (
        "replicas-not-multiple",
        ["-H", "localhost", "-r", "6", "-n", "4"],
        "not a multiple of --instances 4",
    ),
    (
        "instances-not-multiple-of-hosts",
        ["-H", "h1,h2", "-b", "local", "-r", "6", "-n", "3"],
        "number of hosts (2)",
    ),
    (
        "more-instances-than-replicas",
        ["-H", "localhost", "-r", "2", "-n", "4"],
        "more instances (4) than replicas (2)",
    ),
    (
        "not-enough-devices",
        ["-c", POD16, "-r", "128", "-n", "16", "-d", "4"],
        "has 16 devices",
    ),
    ("group-size", ["-H", "localhost", "-r", "4", "-g", "3"], "not a multiple of --group-size 3"),
    ("glob-matches-nothing", ["-H", "localhost", "-i", "{d}/none-*.rec"], "matches no files"),
    ("missing-manifest", ["-H", "localhost", "-i", "@{d}/no-manifest"], "does not exist"),
    (
        "manifest-missing-file",
        ["-H", "localhost", "-i", "@{d}/manifest"],
        "'gone.rec' does not exist",
    ),
    (
        "eval-pad-zero",
        ["-H", "localhost", "-i", "{d}/*.rec", "--eval-pad", "0"],
        "--eval-pad must be at least 1",
    ),
    ("env-bad-name", ["-H", "localhost", "-e", "1BAD=x"], "'1BAD' is not a valid variable name"),
    (
        "env-unset-secret",
        ["-H", "localhost", "-e", "POPRUN_TEST_NOT_SET_ANYWHERE"],
        "is not set in this environment",
    ),
    (
        "env-reserved",
        ["-H", "localhost", "-e", "MASTER_PORT=1"],
        "poprun-py sets MASTER_PORT itself",
    ),
    (
        "unknown-backend",
        ["-H", "localhost", "-b", "pbs"],
        "unknown backend 'pbs'; choose one of: k8s, local, mpiexec, mpirun, slurm, ssh",
    ),
    ("bad-format", ["-H", "localhost", "-f", "yaml"], "--format must be table or json"),
    ("bad-cidr", ["-H", "h1,h2", "--network", "10.0.0/33"], "bad --network '10.0.0/33'"),
    ("cidr-words", ["-H", "h1", "--network", "eth0"], "not a CIDR"),
    ("bad-network-in-spec", ["-c", "{d}/bad-network.yaml"], ":3: network: bad network"),
    ("device-env-name", ["-H", "h1", "--device-env", "CUDA-X"], "bad --device-env 'CUDA-X'"),
    ("device-env-in-spec", ["-c", "{d}/bad-device-env.yaml"], "topologies.t.device_env"),
    ("exclude-every-host", ["-H", "n[1-3]", "--exclude", "n[1-3]"], "removes every host"),
    ("exclude-unknown", ["-H", "n[1-3]", "--exclude", "n4"], "--exclude n4: not one of"),
    (
        "devices-beyond-numa-node",
        ["-c", "{d}/numa-devices.yaml", "-r", "2", "-n", "2", "-d", "2"],
        "NUMA node(s) 0 give 1 device(s) per instance",
    ),
    ("replicas-not-integer", ["-H", "localhost", "-r", "abc"], "Invalid value for '--replicas'"),
    ("unknown-option", ["-H", "localhost", "--bogus"], "No such option: --bogus"),
    ("unbalanced-mpi-args", ["-H", "localhost", "--mpi-args", '"'], "bad --mpi-args"),
    (
        "negative-grace-period",
        ["-H", "localhost", "--grace-period", "-1"],
        "--grace-period must be 0 or more",
    ),
    (
        "zero-connect-timeout",
        ["-H", "localhost", "--connect-timeout", "0"],
        "--connect-timeout must be more than 0",
    ),
    (
        "unwritable-output-dir",
        ["-H", "localhost", "-o", "/proc/no/such/dir"],
        "cannot write the job files to",
    ),
    (
        "master-port-range",
        ["-H", "localhost", "--master-port", "70000"],
        "--master-port must be 1-65535",
    ),
    (
        "only-output-out-of-range",
        ["-H", "localhost", "--only-output-from-instance", "5"],
        "the plan has 1 instance(s)",
    ),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    for name, text in SPECS.items():
        (d / name).write_text(text)
    (d / "hostfile-bad").write_text("a slots=zero\n")
    (d / "ok.rec").write_bytes(b"x")
    (d / "manifest").write_text("gone.rec\n")
    return d


def test_there_are_at_least_30_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("case", "args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(
    case: str, args: list[str], expected: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = workdir / f"launched-{case}"
    argv = ["launch", *[a.format(d=workdir) for a in args], "touch", str(marker)]
    code = run(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("poprun-py: error: ")
    assert expected in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not marker.exists()


def test_launch_without_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["launch", "-H", "localhost"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "poprun-py: error: launch needs a PROGRAM to run\n", captured.err
    assert captured.out == ""


def test_real_process_prints_one_line_no_traceback(workdir: Path) -> None:
    proc = subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [sys.executable, "-m", "poprun_py", "launch", "-H", "a;rm -rf x", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "poprun-py: error: bad host name 'a;rm -rf x': use letters, digits, '.', '-' and '_' only"
    ]
