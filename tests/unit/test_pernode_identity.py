"""Issue 23, the pure parts of per-node mode: who a node is (flags, then the environment in
the documented order), every fault as one line with exit 2, the shared secret (never in
argv), and the plan digest (equal for equal plans, different for any differing input)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from poprun_py.cli import run
from poprun_py.cli.option_model import NOT_PASSED_ON, launch_options, passed_on
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.options import OPTIONS, taken_by
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.shard import InputSet
from poprun_py.core.spec import EnvVar, JobSpec, cluster_from_hosts
from poprun_py.errors import EXIT_USAGE, UsageError
from poprun_py.pernode import digest
from poprun_py.pernode.digest import canonical_json, plan_digest
from poprun_py.pernode.identity import (
    COORDINATOR_VARS,
    DEFAULT_PORT,
    JOIN_TIMEOUT,
    NNODES_VARS,
    RANK_VARS,
    NodeIdentity,
    check_nnodes,
    resolve_identity,
    split_address,
    wanted,
)
from poprun_py.pernode.secret import MAX_BYTES, MIN_BYTES, read_secret

SECRET = "s3cret-value-of-more-than-16-bytes"


def fault(call: Any, *args: Any) -> str:
    """The one line of the UsageError that ``call(*args)`` raises (exit 2)."""
    with pytest.raises(UsageError) as caught:
        call(*args)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_USAGE == 2
    assert "\n" not in message and message.startswith("per-node: "), message
    return message


# ---------------------------------------------------------------- every source


def test_the_flags() -> None:
    node = resolve_identity(1, 3, "node0:7000", {})
    assert node == NodeIdentity(1, 3, "node0", 7000, "--node-rank")
    assert (node.nnodes_source, node.coordinator_source) == ("--nnodes", "--coordinator")
    assert not node.is_coordinator and resolve_identity(0, 3, "n", {}).is_coordinator


def test_poprun_variables() -> None:
    env = {"POPRUN_NODE_RANK": "2", "POPRUN_NNODES": "4", "POPRUN_COORDINATOR": "10.0.0.1"}
    assert resolve_identity(None, None, None, env) == NodeIdentity(
        2, 4, "10.0.0.1", DEFAULT_PORT, "POPRUN_NODE_RANK"
    )


def test_kubeflow_pet_variables_with_the_master_port() -> None:
    env = {"PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_MASTER_ADDR": "job-master-0"}
    node = resolve_identity(None, None, None, {**env, "PET_MASTER_PORT": "23456"})
    assert node == NodeIdentity(1, 2, "job-master-0", 23456, "PET_NODE_RANK")
    assert resolve_identity(None, None, None, env).port == DEFAULT_PORT


def test_kubeflow_fixed_min_max_node_count() -> None:
    env = {"PET_NODE_RANK": "0", "PET_NNODES": "3:3", "PET_MASTER_ADDR": "m"}
    assert resolve_identity(None, None, None, env).nnodes == 3
    message = fault(resolve_identity, None, None, None, {**env, "PET_NNODES": "1:4"})
    assert "PET_NNODES='1:4'" in message and "elastic" in message


def test_an_indexed_job_s_completion_index() -> None:
    env = {"JOB_COMPLETION_INDEX": "3", "POPRUN_NNODES": "4", "POPRUN_COORDINATOR": "j-0.svc"}
    node = resolve_identity(None, None, None, env)
    assert (node.rank, node.nnodes, node.coordinator, node.source) == (
        3,
        4,
        "j-0.svc",
        "JOB_COMPLETION_INDEX",
    )
    flags = resolve_identity(None, 4, "j-0.svc:9000", {"JOB_COMPLETION_INDEX": "3"})
    assert (flags.rank, flags.port, flags.nnodes_source) == (3, 9000, "--nnodes")


@pytest.mark.parametrize("nodelist", ["SLURM_JOB_NODELIST", "SLURM_NODELIST"])
def test_slurm_with_the_first_host_of_the_nodelist(nodelist: str) -> None:
    env = {"SLURM_NODEID": "1", "SLURM_NNODES": "3", nodelist: "gpu[07-08],cpu1"}
    node = resolve_identity(None, None, None, env)
    assert node == NodeIdentity(1, 3, "gpu07", DEFAULT_PORT, "SLURM_NODEID")
    assert node.coordinator_source == nodelist


def test_open_mpi_with_a_coordinator_flag() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"}
    node = resolve_identity(None, None, "[fd00::1]:7001", env)
    assert node == NodeIdentity(5, 8, "fd00::1", 7001, "OMPI_COMM_WORLD_RANK")
    assert node.address == "[fd00::1]:7001"


# ---------------------------------------------------------------- the order


ALL_RANKS = {name: "1" for name in RANK_VARS}


@pytest.mark.parametrize("first", range(len(RANK_VARS)))
def test_the_first_rank_variable_present_is_the_source(first: int) -> None:
    env = {name: "1" for name in RANK_VARS[first:]}
    assert resolve_identity(None, 2, "h", env).source == RANK_VARS[first]
    assert resolve_identity(1, 2, "h", env).source == "--node-rank"


def test_the_documented_orders() -> None:
    assert RANK_VARS == (
        "POPRUN_NODE_RANK",
        "PET_NODE_RANK",
        "JOB_COMPLETION_INDEX",
        "SLURM_NODEID",
        "OMPI_COMM_WORLD_RANK",
    )
    assert NNODES_VARS == ("POPRUN_NNODES", "PET_NNODES", "SLURM_NNODES", "OMPI_COMM_WORLD_SIZE")
    assert COORDINATOR_VARS == ("POPRUN_COORDINATOR", "PET_MASTER_ADDR", "SLURM_JOB_NODELIST")


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("flag", {"POPRUN_COORDINATOR": "p", "PET_MASTER_ADDR": "k"}, ("flag", "--coordinator")),
        (None, {"POPRUN_COORDINATOR": "p", "PET_MASTER_ADDR": "k"}, ("p", "POPRUN_COORDINATOR")),
        (None, {"PET_MASTER_ADDR": "k", "SLURM_JOB_NODELIST": "s1"}, ("k", "PET_MASTER_ADDR")),
        (None, {"SLURM_JOB_NODELIST": "s[1-2]"}, ("s1", "SLURM_JOB_NODELIST")),
    ],
)
def test_the_first_coordinator_wins(
    flag: str | None, env: dict[str, str], expected: tuple[str, str]
) -> None:
    node = resolve_identity(0, 1, flag, env)
    assert (node.coordinator, node.coordinator_source) == expected


def test_equal_values_from_several_sources_agree() -> None:
    env = {**ALL_RANKS, "POPRUN_NNODES": "2", "SLURM_NNODES": "2", "OMPI_COMM_WORLD_SIZE": "2"}
    node = resolve_identity(1, 2, "h", env)
    assert (node.rank, node.nnodes, node.source) == (1, 2, "--node-rank")


def test_blank_variables_are_not_sources() -> None:
    env = {"POPRUN_NODE_RANK": " ", "PET_NODE_RANK": "1", "POPRUN_COORDINATOR": ""}
    node = resolve_identity(None, 2, None, {**env, "PET_MASTER_ADDR": "m"})
    assert (node.source, node.coordinator) == ("PET_NODE_RANK", "m")


def test_per_node_mode_is_wanted_when_any_of_its_flags_is_given() -> None:
    assert not wanted(None, None, None, False)
    assert wanted(0, None, None, False) and wanted(None, 2, None, False)
    assert wanted(None, None, "h", False) and wanted(None, None, None, True)


# ---------------------------------------------------------------- the faults


def test_a_missing_rank_names_every_source_tried() -> None:
    message = fault(resolve_identity, None, 2, "h", {})
    assert "no node rank" in message and "--node-rank" in message
    assert all(name in message for name in RANK_VARS)


def test_a_missing_node_count_names_every_source_tried() -> None:
    message = fault(resolve_identity, 0, None, "h", {})
    assert "no node count" in message and "--nnodes" in message
    assert all(name in message for name in NNODES_VARS)


def test_a_missing_coordinator_names_every_source_tried() -> None:
    message = fault(resolve_identity, 0, 2, None, {"OMPI_COMM_WORLD_RANK": "0"})
    assert "no coordinator" in message and "--coordinator" in message
    assert all(name in message for name in COORDINATOR_VARS)


def test_a_flag_conflicting_with_the_environment() -> None:
    message = fault(resolve_identity, 1, 2, "h", {"PET_NODE_RANK": "0"})
    assert message == "per-node: conflicting node ranks: 1 (--node-rank) and 0 (PET_NODE_RANK)"


def test_two_variables_conflicting() -> None:
    env = {"JOB_COMPLETION_INDEX": "2", "SLURM_NODEID": "3"}
    message = fault(resolve_identity, None, 4, "h", env)
    assert "2 (JOB_COMPLETION_INDEX)" in message and "3 (SLURM_NODEID)" in message


def test_conflicting_node_counts() -> None:
    message = fault(resolve_identity, 0, 4, "h", {"SLURM_NNODES": "2"})
    assert "conflicting node counts" in message and "2 (SLURM_NNODES)" in message


@pytest.mark.parametrize(("rank", "nnodes"), [(2, 2), (-1, 2), (5, 1)])
def test_a_rank_out_of_range(rank: int, nnodes: int) -> None:
    message = fault(resolve_identity, rank, nnodes, "h", {})
    assert f"node rank {rank} (--node-rank) is out of range" in message


@pytest.mark.parametrize("nnodes", [0, -3])
def test_fewer_than_one_node(nnodes: int) -> None:
    assert "must be at least 1" in fault(resolve_identity, 0, nnodes, "h", {})


def test_a_rank_that_is_no_number_names_its_variable() -> None:
    message = fault(resolve_identity, None, 2, "h", {"SLURM_NODEID": "one"})
    assert "SLURM_NODEID='one' is not a whole number" in message


@pytest.mark.parametrize("address", ["h:0", "h:65536", "h:http", "[::1]:x", "h:"])
def test_a_bad_port(address: str) -> None:
    message = fault(resolve_identity, 0, 1, address, {})
    assert "bad port" in message and "(--coordinator)" in message


def test_a_bad_pet_master_port() -> None:
    env = {"PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "99999"}
    assert "(PET_MASTER_PORT)" in fault(resolve_identity, 0, 1, None, env)


@pytest.mark.parametrize("address", [":7000", "[::1", "[::1]7000", "[]:7000", "a b"])
def test_a_bad_coordinator(address: str) -> None:
    assert "bad coordinator" in fault(resolve_identity, 0, 1, address, {})


def test_a_bad_slurm_nodelist() -> None:
    env = {"SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n[3-1]"}
    assert "SLURM_JOB_NODELIST" in fault(resolve_identity, None, None, None, env)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h", ("h", DEFAULT_PORT)),
        ("h.example.org:1", ("h.example.org", 1)),
        ("10.1.2.3:65535", ("10.1.2.3", 65535)),
        ("fd00::7", ("fd00::7", DEFAULT_PORT)),
        ("[fd00::7]", ("fd00::7", DEFAULT_PORT)),
        ("[fd00::7]:80", ("fd00::7", 80)),
    ],
)
def test_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert split_address(text) == expected


def test_the_node_count_must_be_the_plan_s_host_count() -> None:
    plan = _plan("n[1-4]")
    check_nnodes(resolve_identity(0, 4, "n1", {}), plan)
    message = fault(check_nnodes, resolve_identity(0, 3, "n1", {"SLURM_NNODES": "3"}), plan)
    assert "3 nodes (--nnodes) but the plan has 4 hosts (n1,n2,n3,...)" in message
    env = {"PET_NODE_RANK": "0", "PET_NNODES": "2", "PET_MASTER_ADDR": "n1"}
    assert "(PET_NNODES)" in fault(check_nnodes, resolve_identity(None, None, None, env), plan)


def test_the_constants_agree_with_the_options() -> None:
    assert DEFAULT_PORT == 29400
    assert OPTIONS["join_timeout"].default == JOIN_TIMEOUT == 120.0


# ---------------------------------------------------------------- the secret


def _secret_file(tmp_path: Path, text: str | bytes, mode: int = 0o600) -> str:
    path = tmp_path / "secret"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(mode)
    return str(path)


def test_the_secret_from_each_source_in_order(tmp_path: Path) -> None:
    flag = _secret_file(tmp_path, "from-the-flag-file-0123456789\n")
    other = tmp_path / "other"
    other.write_text("from-the-env-file-0123456789")
    other.chmod(0o600)
    env = {"POPRUN_SECRET_FILE": str(other), "POPRUN_SECRET": SECRET}
    assert read_secret(flag, env) == b"from-the-flag-file-0123456789"
    assert read_secret(None, env) == b"from-the-env-file-0123456789"
    assert read_secret(None, {"POPRUN_SECRET": SECRET}) == SECRET.encode()


def test_one_trailing_newline_is_not_part_of_the_secret(tmp_path: Path) -> None:
    assert read_secret(_secret_file(tmp_path, SECRET + "\r\n"), {}) == SECRET.encode()
    assert read_secret(_secret_file(tmp_path, SECRET + " \n"), {}) == SECRET.encode() + b" "


def test_binary_secrets(tmp_path: Path) -> None:
    raw = bytes(range(256))
    assert read_secret(_secret_file(tmp_path, raw), {}) == raw


def test_no_secret_names_every_source() -> None:
    message = fault(read_secret, None, {})
    assert all(s in message for s in ("--secret-file", "POPRUN_SECRET_FILE", "POPRUN_SECRET"))


@pytest.mark.parametrize(
    ("text", "words"), [("", "is empty"), ("\n", "is empty"), ("x" * (MIN_BYTES - 1), "15 bytes")]
)
def test_an_empty_or_short_secret(tmp_path: Path, text: str, words: str) -> None:
    assert words in fault(read_secret, _secret_file(tmp_path, text), {})
    assert words in fault(read_secret, None, {"POPRUN_SECRET": text})


def test_the_shortest_secret_taken() -> None:
    assert read_secret(None, {"POPRUN_SECRET": "x" * MIN_BYTES}) == b"x" * MIN_BYTES


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_file_open_to_others_is_refused_as_ssh_refuses_a_key(tmp_path: Path, mode: int) -> None:
    message = fault(read_secret, _secret_file(tmp_path, SECRET, mode), {})
    assert f"mode {mode:04o}" in message and "chmod 600" in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_file_is_taken(tmp_path: Path, mode: int) -> None:
    assert read_secret(_secret_file(tmp_path, SECRET, mode), {}) == SECRET.encode()


def test_a_symlink_to_a_private_file_is_taken(tmp_path: Path) -> None:
    target = _secret_file(tmp_path, SECRET)  # a Kubernetes Secret volume's files are links
    (tmp_path / "link").symlink_to(target)
    assert read_secret(str(tmp_path / "link"), {}) == SECRET.encode()


def test_a_missing_file_a_directory_a_fifo(tmp_path: Path) -> None:
    assert "does not exist" in fault(read_secret, str(tmp_path / "nope"), {})
    assert "not a regular file" in fault(read_secret, str(tmp_path), {})
    os.mkfifo(tmp_path / "fifo", 0o600)  # would block an open(): refused before it
    env = {"POPRUN_SECRET_FILE": str(tmp_path / "fifo")}
    assert "(POPRUN_SECRET_FILE) is not a regular file" in fault(read_secret, None, env)


def test_an_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unreadable = _secret_file(tmp_path, SECRET, 0)
        assert "cannot read secret file" in fault(read_secret, unreadable, {})
        return
    # root reads any file: read it as nobody, from a folder nobody may enter but not list
    folder = Path(tempfile.mkdtemp(prefix="poprun-secret-"))
    try:
        folder.chmod(0o711)
        assert "cannot read secret file" in _as_nobody(_secret_file(folder, SECRET, 0))
    finally:
        shutil.rmtree(folder)


def _as_nobody(path: str) -> str:
    """The one line read_secret(path) refuses with, in a child that runs as nobody."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, report the fault's line, never return
        message = "no fault"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            read_secret(path, {})
        except UsageError as exc:
            message = str(exc)
        except BaseException as exc:  # anything else fails the test
            message = f"unexpected: {exc!r}"
        finally:
            os.write(write_end, message.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        message = reader.read().decode()
    os.waitpid(pid, 0)
    assert message.startswith("per-node: "), message
    return message


def test_a_huge_file_is_no_secret(tmp_path: Path) -> None:
    assert "over" in fault(read_secret, _secret_file(tmp_path, b"x" * (MAX_BYTES + 1)), {})


def test_the_secret_is_never_in_a_fault(tmp_path: Path) -> None:
    assert "short-secret" not in fault(read_secret, None, {"POPRUN_SECRET": "short-secret"})
    assert "short-secret" not in fault(read_secret, _secret_file(tmp_path, "short-secret"), {})
    assert SECRET not in fault(read_secret, _secret_file(tmp_path, SECRET, 0o644), {})


# ---------------------------------------------------------------- never in argv


def test_no_option_takes_a_secret_value() -> None:
    per_node = [f for f in taken_by("launch") if f.panel == "Per node"]
    assert {f.name for f in per_node} == {
        "node_rank",
        "nnodes",
        "coordinator",
        "per_node",
        "join_timeout",
        "secret_file",
    }
    secret = [f for f in OPTIONS.values() if "secret" in f.name]
    assert [(f.name, f.path, f.metavar) for f in secret] == [("secret_file", "path", "PATH")]
    assert all(f.name in NOT_PASSED_ON for f in per_node)


def test_launch_has_no_secret_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["launch", "--secret", SECRET, "--", "true"]) == EXIT_USAGE
    assert SECRET not in capsys.readouterr().out


def test_the_secret_file_s_content_goes_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _secret_file(tmp_path, SECRET)
    args = ["-H", "198.18.0.21,198.18.0.22", "--node-rank", "0", "--nnodes", "2"]
    args += ["--coordinator", "198.18.0.21", "--secret-file", path]
    with contextlib.chdir(tmp_path):
        code = run(["launch", "--dry-run", "-f", "json", "-b", "ssh", *args, "--", "true"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert SECRET not in out.out + out.err
    values: dict[str, Any] = {"secret_file": path, "node_rank": 0, "program": ("true",)}
    opts = launch_options(values)
    assert opts.secret_file == path and SECRET not in json.dumps(asdict(opts))
    assert SECRET not in " ".join(passed_on(values))


# ---------------------------------------------------------------- the plan digest


def _plan(hosts: str = "n[1-2]", **job: Any) -> LaunchPlan:
    inputs = job.pop("inputs", None)
    spec = JobSpec(**{"program": ("train.py",), "replicas": 4, **job})
    return make_plan(cluster_from_hosts(parse_hosts(hosts)), spec, inputs)


FILES = InputSet(("/d/a", "/d/b", "/d/c"), (10, 20, 30))
BASE: dict[str, Any] = {"inputs": FILES, "env": (EnvVar("A", "1"),)}


def test_equal_plans_have_equal_digests() -> None:
    one, two = _plan(**dict(BASE)), _plan(**dict(BASE))
    assert one is not two and plan_digest(one) == plan_digest(two)
    assert len(plan_digest(one)) == 64 and int(plan_digest(one), 16) >= 0


@pytest.mark.parametrize(
    ("hosts", "change"),
    [
        ("n[1-3]", {"replicas": 6}),  # other hosts
        ("n[2,1]", {}),  # the same hosts in another order (another coordinator)
        ("n[1-2]", {"replicas": 2}),
        ("n[3-4]", {}),
        ("n[1-2]", {"instances": 4}),
        ("n[1-2]", {"devices_per_replica": 2}),
        ("n[1-2]", {"group_size": 1}),
        ("n[1-2]", {"numa_aware": False}),
        ("n[1-2]", {"program": ("train.py", "--lr=1")}),
        ("n[1-2]", {"inputs": InputSet(("/d/a", "/d/b", "/d/x"), (10, 20, 30))}),
        ("n[1-2]", {"inputs": InputSet(("/d/a", "/d/b", "/d/c"), (10, 20, 31))}),
        ("n[1-2]", {"env": (EnvVar("A", "2"),)}),
        ("n[1-2]", {"env": (EnvVar("A", "1"), EnvVar("B", "1"))}),
        ("n[1-2]", {"env": (EnvVar("A", "1", secret=True), EnvVar("A", "x"))}),
        ("n[1-2]", {"workdir": "/scratch"}),
        ("n[1-2]", {"eval_pad": 1}),
        ("n[1-2]", {"master_port": 29501}),
        ("n[1-2]", {"network": "10.0.0.0/8"}),
        ("n[1-2]", {"device_env": "MY_DEVICES"}),
        ("n[1-2]", {"nic_affinity": True}),
    ],
)
def test_any_differing_input_changes_the_digest(hosts: str, change: dict[str, Any]) -> None:
    assert plan_digest(_plan(hosts, **{**BASE, **change})) != plan_digest(_plan(**dict(BASE)))


def test_another_poprun_py_changes_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    before = plan_digest(_plan())
    monkeypatch.setattr(digest, "__version__", "999.0")
    assert plan_digest(_plan()) != before


def test_a_plan_changed_after_planning_changes_the_digest() -> None:
    plan = _plan()
    assert plan_digest(replace(plan, workdir="/elsewhere")) != plan_digest(plan)


def test_the_canonical_json_does_not_depend_on_key_order() -> None:
    assert canonical_json({"b": 1, "a": [1, {"y": 2, "x": "é"}]}) == canonical_json(
        {"a": [1, {"x": "é", "y": 2}], "b": 1}
    )
    assert canonical_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
