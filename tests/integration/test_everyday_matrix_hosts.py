"""Issue 20, item 20 on real hosts: short launches on the test hosts show the options' effects
(tests/unit/test_everyday_matrix.py checks that every option reaches the rendered job, the
Slurm batch script and the detach record; here the launches run).

One launch per backend (ssh, mpirun, mpiexec) carries most options at once and each instance
prints what it got; short launches show the clocks (``--timeout``, ``--hang-timeout``),
``--keep-job-dir``, a detached job's ``--only-output-from-instance``, and on the test Slurm a
batch job with spares and a launch over hosts with different slots. :data:`NOT_SHOWN_LIVE`
names the options no launch here shows, with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster
from tests import requirements
from tests.integration.helpers import need_mpi
from tests.integration.test_launch_hosts_cli import only_sshd, poprun
from tests.matrix_rows import ROWS
from tests.slurmcluster import SlurmCluster

pytestmark = pytest.mark.hosts

NOT_SHOWN_LIVE = {
    "numa_aware": "the test hosts have one NUMA node: a binding changes nothing",
    "device_env": "the test hosts have no GPUs",
    "nic_affinity": "the test hosts have no RDMA NICs",
    "network": "tests/integration/test_network.py launches on a second (data) network",
    "accept_new_host_keys": "it records keys in a known_hosts file; "
    "tests/integration/test_ssh_options_hosts.py",
    "ssh_client": "tests/integration/test_openssh_hosts.py launches and runs exec over OpenSSH",
    "fanout": "tests/integration/test_tree_hosts.py launches through gateways on the ssh, "
    "mpirun and mpiexec backends",
    "sync": "the test hosts share this machine's file system: a push changes nothing",
    "check_torch": "importing torch costs each instance about a second; the check tests",
    "strict_shards": "refused at planning time (exit 2), nothing runs: unit tests",
    "host_timeout": "shown only by a host going silent: tests/integration/test_long_run_hosts.py",
    "grace_period": "shown only by timing SIGTERM to SIGKILL: tests/integration/test_failures.py",
    "dry_run": "starts nothing: the unit matrix",
    "min_progress": "shown by restarts that stop: tests/integration/test_progress_rule.py",
    "progress_file": "shown by restarts that stop: tests/integration/test_progress_rule.py",
    "forward_signals": "shown by signals sent to poprun-py: "
    "tests/integration/test_forward_signals.py",
    "up": "creates a cluster: tests/integration/test_provision_local.py",
    "down": "with --up",
    "yes": "with --up",
    "cluster": "the spec-less launch here passes the SSH flags instead; every other "
    "hosts test launches with -c",
    **dict.fromkeys(
        ("node_rank", "nnodes", "coordinator", "per_node", "join_timeout", "secret_file"),
        "per-node mode (one launcher per node, no SSH between them): the per-node tests launch "
        "it on network namespaces without sshd",
    ),
}
SHOWN_LIVE = {
    "program", "hosts", "replicas", "devices_per_replica", "group_size", "inputs", "eval_pad",
    "env", "backend", "workdir", "master_port", "mpi_args", "templates", "connect_timeout",
    "known_hosts", "ssh_config", "identity", "user", "fmt", "output_dir",
    "only_output_from_instance", "print_topology", "exclude", "check", "check_timeout",
    "max_restarts", "restart_delay", "spare_hosts", "instances", "timeout", "hang_timeout",
    "keep_job_dir", "detach", "slurm_time", "slurm_partition", "slurm_account",
}  # fmt: skip

SHOW = (
    'n=$(wc -l < "$POPRUN_SHARD_FILE"); '
    'echo "MX rank=$RANK host=$POPRUN_HOST_NAME local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE '
    "master=$MASTER_ADDR:$MASTER_PORT pwd=$(pwd) var=$MX_VAR tpl=$MX_TEMPLATED "
    "mpi=${OMPI_MCA_btl_tcp_eager_limit:-}${MX_FROM_MPI:-} replicas=$POPDIST_NUM_TOTAL_REPLICAS "
    "local_replicas=$POPDIST_NUM_LOCAL_REPLICAS "
    "ipus=$POPDIST_NUM_IPUS_PER_REPLICA group=$POPRUN_GROUP_SIZE pad=$POPRUN_SHARD_PADDING "
    'files=$n restart=$POPRUN_RESTART_COUNT"; '
    '[ "$POPRUN_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ] && exit 3; exit 0'
)
MPI_ARGS = {  # each with an effect the ranks see: (--mpi-args, what $MX_MPI shows)
    "ssh": (None, ""),
    "mpirun": ("--mca btl_tcp_eager_limit 65536", "65536"),  # OMPI_MCA_* in every rank
    "mpiexec": ("-genv MX_FROM_MPI yes", "yes"),
}


def test_every_option_is_shown_live_or_says_why() -> None:
    assert SHOWN_LIVE | set(NOT_SHOWN_LIVE) == set(ROWS), set(ROWS) ^ (
        SHOWN_LIVE | set(NOT_SHOWN_LIVE)
    )
    assert not SHOWN_LIVE & set(NOT_SHOWN_LIVE)


def bare_ssh_config(cluster: TestCluster, path: Path) -> Path:
    """Each host's address and port only: the user, key and known_hosts must come from the
    flags."""
    path.write_text("".join(f"Host {h.address}\n    Port {h.port}\n" for h in cluster.hosts))
    return path


def ssh_flags(cluster: TestCluster, tmp_path: Path) -> list[str]:
    config = bare_ssh_config(cluster, tmp_path / "ssh_config")
    return [
        "--ssh-config", str(config), "--known-hosts", str(cluster.known_hosts),
        "--identity", str(cluster.identity_file), "-l", "root", "--connect-timeout", "5",
    ]  # fmt: skip


def fields(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split()[1:])


def need_mpich() -> None:
    """Skip, naming what is missing and its Debian package (CI=true: a failure)."""
    requirements.require("mpiexec.hydra")


@pytest.mark.parametrize("backend", ["ssh", "mpirun", "mpiexec"])
def test_one_launch_shows_most_options(
    test_cluster_4: TestCluster, tmp_path: Path, backend: str
) -> None:
    if backend == "mpirun":
        need_mpi()
    if backend == "mpiexec":
        need_mpich()
    h = test_cluster_4.hosts
    hostfile = tmp_path / "hostfile"  # order h2, h0, h1, h3; h1 excluded, h3 the spare
    hostfile.write_text(
        f"{h[2].address} slots=2\n{h[0].address} slots=1\n"
        f"{h[1].address} slots=1\n{h[3].address} slots=1\n"
    )
    (tmp_path / "data").mkdir()
    for k in range(4):
        (tmp_path / "data" / f"part-{k}.txt").write_text("x" * (k + 1))
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "instance.j2").write_text("env MX_TEMPLATED=1 {{ program | quoted }}\n")
    workdir = tmp_path / f"wd-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    out = tmp_path / "out"
    given, seen = MPI_ARGS[backend]
    mpi = ["--mpi-args", given] if given else []
    args = [
        "launch", "-b", backend, "-H", f"@{hostfile}", "-x", h[1].address, "--spare-hosts", "1",
        "-r", "6", "-n", "3", "-d", "2", "-g", "2", "-e", "MX_VAR=hello-world",
        "--workdir", str(workdir), "--master-port", "29917",
        "-i", str(tmp_path / "data" / "*.txt"), "--eval-pad", "1",
        "--templates", str(tmp_path / "tpl"),
        "-o", str(out), "--only-output-from-instance", "1", "--print-topology",
        "--check", "--check-timeout", "30", "--max-restarts", "1", "--restart-delay", "0.2",
        "--timeout", "120", "--hang-timeout", "60", *mpi, *ssh_flags(test_cluster_4, tmp_path),
        "--", "sh", "-c", SHOW,
    ]  # fmt: skip
    proc = poprun(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # --print-topology and --only-output-from-instance 1: the plan, then instance 1's lines
    assert "poprun-py topology" in proc.stdout
    shown = [fields(x.split("] ", 1)[1]) for x in proc.stdout.splitlines() if "] MX " in x]
    assert shown and {s["rank"] for s in shown} == {"1"}, proc.stdout
    # --check ran first; --max-restarts 1: attempt 0 failed (rank 0 exited 3), attempt 1 ran
    assert "check: 2/2 host(s) ok" in proc.stderr, proc.stderr
    assert "attempt 0" in proc.stderr and "restart" in proc.stderr, proc.stderr
    # -o: one log per instance, of the last attempt
    got = [
        fields(
            next(
                x
                for x in (out / f"instance-{i}.log").read_text().splitlines()[::-1]
                if x.startswith("MX")
            )
        )
        for i in range(3)
    ]
    # -H order, slots, -x and --spare-hosts: instances 0-1 on h2, 2 on h0; MASTER_ADDR is h2's
    assert [g["host"] for g in got] == [h[2].address, h[2].address, h[0].address]
    assert [(g["local"], g["lws"]) for g in got] == [("0", "2"), ("1", "2"), ("0", "1")]
    for g in got:
        assert g["master"] == f"{h[2].address}:29917"  # --master-port
        assert g["pwd"] == str(workdir) and g["var"] == "hello-world" and g["tpl"] == "1"
        assert (g["replicas"], g["local_replicas"], g["ipus"], g["group"]) == ("6", "2", "2", "2")
        assert g["restart"] == "1"
        assert g["mpi"] == seen  # --mpi-args
    # -i with --eval-pad 1: 4 files over 3 instances, padded to 2 each
    assert [g["files"] for g in got] == ["2", "2", "2"] and sum(int(g["pad"]) for g in got) == 2
    only_sshd(test_cluster_4)


def test_the_clocks_and_the_job_directory(test_cluster_4: TestCluster, tmp_path: Path) -> None:
    flags = [
        "-b",
        "ssh",
        "-H",
        test_cluster_4.hosts[0].address,
        *ssh_flags(test_cluster_4, tmp_path),
    ]
    marker = f"mx-{uuid.uuid4().hex}"
    timed = poprun(
        "launch", *flags, "--timeout", "1s", "--", "sh", "-c", f"sleep 30 # {marker}", cwd=tmp_path
    )
    assert timed.returncode == 124 and "timed out" in timed.stderr, timed.stderr
    hung = poprun(
        "launch",
        *flags,
        "--hang-timeout",
        "1",
        "--",
        "sh",
        "-c",
        f"sleep 30 # {marker}",
        cwd=tmp_path,
    )
    assert hung.returncode == 124 and "hung" in hung.stderr, hung.stderr
    kept = poprun("launch", *flags, "--keep-job-dir", "--", "true", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    line = next(x for x in kept.stderr.splitlines() if "kept in" in x)
    assert Path(line.rsplit("kept in ", 1)[1].strip()).is_dir()
    only_sshd(test_cluster_4)


def test_a_detached_job_keeps_only_output_from_instance(
    test_cluster_4: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    hosts = ",".join(h.address for h in test_cluster_4.hosts[:2])
    args = ["launch", "-b", "ssh", "-H", hosts, "--detach", "-f", "json"]
    args += ["--only-output-from-instance", "1", *ssh_flags(test_cluster_4, tmp_path)]
    proc = poprun(
        *args, "--", "sh", "-c", 'echo "mx-out-$RANK"; echo "mx-err-$RANK" >&2', cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)["id"]
    waited = poprun("wait", job, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    logs = poprun("logs", job, cwd=tmp_path).stdout
    assert "mx-out-1" in logs and "mx-out-0" not in logs, logs
    assert "mx-err-0" in logs  # every instance's errors still show
    only_sshd(test_cluster_4)


# ---------------------------------------------------------------- the test Slurm


def slurm_run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poprun_py", *args], env=env, cwd=cwd, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip


SLURM_SHOW = 'echo "MX $RANK $(hostname) $LOCAL_WORLD_SIZE $SLURM_JOB_NUM_NODES"'


@pytest.mark.slurm
def test_a_batch_job_keeps_its_spare_and_its_options(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    """``render -H n1,n2,n3 --backend slurm --spare-hosts 1`` asked for 2 nodes, no spare."""
    nodes = slurm_cluster.node_names[:3]
    out = tmp_path / "out"
    render = slurm_run(
        ["render", "-b", "slurm", "-H", ",".join(nodes), "--spare-hosts", "1", "-r", "2",
         "--time", "5", "--partition", slurm_cluster.partition, "-o", str(out),
         "--", "sh", "-c", SLURM_SHOW],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert render.returncode == 0, render.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(render.stdout)
    proc = subprocess.run(
        ["sbatch", "--wait", f"--output={tmp_path / 'batch.out'}", str(script)],
        env=slurm_env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    batch = (tmp_path / "batch.out").read_text() if (tmp_path / "batch.out").exists() else ""
    assert proc.returncode == 0, (proc.stderr, batch)
    got = [(out / f"instance-{i}.log").read_text().split() for i in range(2)]
    assert [g[2] for g in got] == list(nodes[:2])  # the spare runs nothing
    assert {g[4] for g in got} == {"3"}  # the allocation holds the spare


@pytest.mark.slurm
def test_slurm_places_instances_by_slots(
    slurm_cluster: SlurmCluster, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    n = slurm_cluster.node_names
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{n[0]} slots=2\n{n[1]} slots=1\n")
    out = tmp_path / "out"
    proc = slurm_run(
        ["launch", "-b", "slurm", "-H", f"@{hostfile}", "--time", "5", "--partition",
         slurm_cluster.partition, "--account", "mx", "-o", str(out), "--", "sh", "-c", SLURM_SHOW],
        slurm_env, tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = [(out / f"instance-{i}.log").read_text().split() for i in range(3)]
    assert [(g[2], g[3]) for g in got] == [(n[0], "2"), (n[0], "2"), (n[1], "1")]
    deadline = time.monotonic() + 10
    while subprocess.run(
        ["squeue", "-h"], env=slurm_env, capture_output=True, text=True, check=False
    ).stdout.strip():
        assert time.monotonic() < deadline, "an allocation was left behind"
        time.sleep(0.1)
    assert os.environ.get("SLURM_JOB_ID") is None
