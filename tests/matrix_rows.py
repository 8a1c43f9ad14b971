"""The feature x backend matrix of issue 20 (item 20): one row per parameter of ``launch``.

A row gives the words that set the option to a value other than its default and says, for
``launch --dry-run`` on each backend where the option applies, how the dry run shows it: in
the rendered job (:attr:`Dry.job`, ``render --format json``'s object) or in the prepared job
(:attr:`Dry.prep`) for options that act at run time. A row with no such check says why
(``dry_note``). Where the Slurm batch script and the detach record must carry an option is
not written per row: it follows from :mod:`poprun_py.cli.option_model` (every option except
those it lists with a reason), and the tests check it for every row.

Used by tests/unit/test_everyday_matrix.py (every row, every backend) and
tests/integration/test_everyday_matrix_hosts.py (real launches on the test hosts).

Example::

    row = ROWS["replicas"]
    row.args                         # ('-r', '4')
    row.dry(Dry(job, prep, "ssh"))   # True when the rendered job carries it
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BACKENDS = ("local", "ssh", "mpirun", "mpiexec", "slurm")
HOSTS = ("198.18.0.21", "198.18.0.22")
"""The hosts of a row that names none (test addresses: a dry run reaches no host)."""
PROGRAM = ("sh", "-c", "exit 0")
NODE = ("--node-rank", "0", "--nnodes", "2", "--coordinator", "198.18.0.21")
"""Per-node mode's identity, complete, for the rows of its options (HOSTS are its nodes)."""


@dataclass(frozen=True)
class Dry:
    """What one ``launch --dry-run --format json`` gave: the rendered job's JSON object, the
    prepared job it was rendered from, and the backend."""

    job: dict[str, Any]
    prep: Any  # poprun_py.prepare.job.Prepared
    backend: str

    def env(self, name: str) -> list[str | None]:
        """``name``'s value in every instance's environment (None where it is missing)."""
        return [i["env"].get(name) for i in self.job["instances"]]

    @property
    def launcher(self) -> str:
        """The launcher's words and files, as one text."""
        return " ".join(self.job["launcher"]) + "\n" + "\n".join(self.job["files"].values())


@dataclass(frozen=True)
class Row:
    """One option: ``args`` set it (``{d}`` is a scratch directory with the files below);
    ``dry`` checks a dry run on ``backends`` (None: ``dry_note`` says why there is none)."""

    args: tuple[str, ...]
    dry: Callable[[Dry], bool] | None = None
    dry_note: str = ""
    backends: tuple[str, ...] = BACKENDS
    hosts: bool = True  # add HOSTS unless the row names its own (-H/-c)


def _all(values: list[str | None], expected: str) -> bool:
    return bool(values) and all(v == expected for v in values)


def _files(dry: Dry) -> list[str]:
    return sorted(Path(f).name for i in dry.job["instances"] for f in i["shard"])


def _ssh(dry: Dry) -> Any:
    from poprun_py.prepare.job import ssh_settings

    return ssh_settings(dry.prep.plan.cluster, dry.prep.options.ssh)


ROWS: Mapping[str, Row] = {
    "program": Row((), lambda d: all(i["argv"][-3:] == list(PROGRAM) for i in d.job["instances"])),
    "hosts": Row(
        ("-H", "198.18.0.22,198.18.0.21"),
        lambda d: (
            [i["host"] for i in d.job["instances"]] == ["198.18.0.22", "198.18.0.21"]
            and _all(d.env("MASTER_ADDR"), "198.18.0.22" if d.backend != "local" else "127.0.0.1")
        ),
        hosts=False,
    ),
    "cluster": Row(
        ("-c", "{d}/cluster.yaml"), lambda d: _all(d.env("SPEC_VAR"), "from-spec"), hosts=False
    ),
    "replicas": Row(("-r", "4"), lambda d: _all(d.env("POPDIST_NUM_TOTAL_REPLICAS"), "4")),
    "instances": Row(
        ("-n", "4"), lambda d: len(d.job["instances"]) == 4 and _all(d.env("LOCAL_WORLD_SIZE"), "2")
    ),
    "devices_per_replica": Row(
        ("-d", "2"), lambda d: _all(d.env("POPDIST_NUM_IPUS_PER_REPLICA"), "2")
    ),
    "numa_aware": Row(
        ("--no-numa-aware",),
        lambda d: (
            not d.prep.plan.numa_aware and all(i["binding"] is None for i in d.job["instances"])
        ),
    ),
    "group_size": Row(("-g", "1"), lambda d: _all(d.env("POPRUN_GROUP_SIZE"), "1")),
    "inputs": Row(("-i", "{d}/data/*.txt"), lambda d: _files(d) == ["a.txt", "b.txt"]),
    "eval_pad": Row(
        ("-i", "{d}/data/a.txt", "--eval-pad", "1"),
        lambda d: d.prep.plan.eval_pad == 1 and "1" in d.env("POPRUN_SHARD_PADDING"),
    ),
    "strict_shards": Row(("--strict-shards",), lambda d: d.prep.options.strict_shards is True),
    "env": Row(("-e", "MX_VAR=hello world"), lambda d: _all(d.env("MX_VAR"), "hello world")),
    "backend": Row((), lambda d: d.job["backend"] == d.backend),  # the matrix passes -b
    "workdir": Row(
        ("--workdir", "{d}/wd"),
        lambda d: all(str(i["cwd"]).endswith("/wd") for i in d.job["instances"]),
    ),
    "master_port": Row(("--master-port", "29911"), lambda d: _all(d.env("MASTER_PORT"), "29911")),
    "mpi_args": Row(
        ("--mpi-args", "--mx-flag mx-value"),
        lambda d: "--mx-flag mx-value" in " ".join(d.job["launcher"]),
        backends=("mpirun", "mpiexec", "slurm"),
    ),
    "templates": Row(
        ("--templates", "{d}/templates"),
        lambda d: all(i["argv"][:2] == ["env", "MX_TEMPLATED=1"] for i in d.job["instances"]),
    ),
    "grace_period": Row(("--grace-period", "7"), lambda d: d.prep.grace_period == 7.0),
    "host_timeout": Row(("--host-timeout", "45s"), lambda d: d.prep.host_timeout == 45.0),
    "connect_timeout": Row(
        ("--connect-timeout", "3"),
        lambda d: d.prep.connect_timeout == 3.0 and _ssh(d).connect_timeout == 3.0,
    ),
    "accept_new_host_keys": Row(
        ("--accept-new-host-keys",), lambda d: _ssh(d).accept_new_host_keys
    ),
    "known_hosts": Row(
        ("--known-hosts", "{d}/known_hosts"),
        lambda d: str(d.prep.plan.cluster.known_hosts).endswith("/known_hosts"),
    ),
    "ssh_config": Row(
        ("--ssh-config", "{d}/ssh_config"),
        lambda d: str(d.prep.plan.cluster.ssh_config).endswith("/ssh_config"),
    ),
    "ssh_client": Row(("--ssh-client", "openssh"), lambda d: _ssh(d).ssh_client == "openssh"),
    "fanout": Row(
        ("--fanout", "1"), lambda d: _ssh(d).fanout == 1, backends=("ssh", "mpirun", "mpiexec")
    ),
    "identity": Row(
        ("--identity", "{d}/id_key"), lambda d: str(_ssh(d).identity_file).endswith("/id_key")
    ),
    "user": Row(("-l", "mxuser"), lambda d: _ssh(d).user == "mxuser"),
    "sync": Row(("--sync",), None, "a dry run pushes nothing; --sync acts before a real launch"),
    "fmt": Row(("-f", "json"), lambda d: bool(d.job), "the matrix's dry runs are --format json"),
    "output_dir": Row(("-o", "{d}/out"), lambda d: d.job["job_dir"].endswith("/out")),
    "only_output_from_instance": Row(
        ("--only-output-from-instance", "1"),
        None,
        "it filters a real launch's output; nothing runs in a dry run",
    ),
    "dry_run": Row(("--dry-run",), lambda d: True, "the matrix's dry runs are --dry-run"),
    "keep_job_dir": Row(("--keep-job-dir",), None, "a dry run makes no job directory"),
    "print_topology": Row(
        ("--print-topology",), None, "a dry run prints the plan anyway (table format)"
    ),
    "slurm_time": Row(("--time", "15"), lambda d: _slurm(d).time == "15", backends=("slurm",)),
    "slurm_partition": Row(
        ("--partition", "mxpart"), lambda d: _slurm(d).partition == "mxpart", backends=("slurm",)
    ),
    "slurm_account": Row(
        ("--account", "mxacct"), lambda d: _slurm(d).account == "mxacct", backends=("slurm",)
    ),
    "network": Row(
        ("--network", "10.9.0.0/16"),
        lambda d: (
            d.prep.plan.network == "10.9.0.0/16"
            and (d.backend != "mpirun" or "btl_tcp_if_include 10.9.0.0/16" in d.launcher)
        ),
    ),
    "device_env": Row(
        ("--device-env", "MX_DEVICES"), lambda d: d.prep.plan.device_env == "MX_DEVICES"
    ),
    "nic_affinity": Row(("--nic-affinity",), lambda d: d.prep.plan.nic_affinity is True),
    "exclude": Row(
        ("-H", "198.18.0.21,198.18.0.22,198.18.0.23", "-x", "198.18.0.22"),
        lambda d: [i["host"] for i in d.job["instances"]] == ["198.18.0.21", "198.18.0.23"],
        hosts=False,
    ),
    "check": Row(("--check",), None, "the check runs before a real launch only"),
    "check_timeout": Row(("--check-timeout", "9"), None, "with --check, before a real launch only"),
    "check_torch": Row(("--check-torch",), None, "with --check, before a real launch only"),
    "max_restarts": Row(("--max-restarts", "2"), lambda d: d.prep.long_run.max_restarts == 2),
    "restart_delay": Row(("--restart-delay", "3"), lambda d: d.prep.long_run.restart_delay == 3.0),
    "timeout": Row(("--timeout", "90s"), lambda d: d.prep.long_run.timeout == 90.0),
    "hang_timeout": Row(("--hang-timeout", "30"), lambda d: d.prep.long_run.hang_timeout == 30.0),
    "min_progress": Row(("--min-progress", "2"), lambda d: d.prep.long_run.min_progress == 2),
    "progress_file": Row(
        ("--progress-file", "{d}/ckpt.pt"),
        lambda d: str(d.prep.long_run.progress_file).endswith("/ckpt.pt"),
    ),
    "forward_signals": Row(
        ("--forward-signals", "usr2"),
        lambda d: d.prep.long_run.forward_signals == (signal.SIGUSR2,),
    ),
    "spare_hosts": Row(
        ("-H", "198.18.0.21,198.18.0.22,198.18.0.23", "--spare-hosts", "1"),
        lambda d: (
            [s.name for s in d.prep.long_run.spares] == ["198.18.0.23"]
            and len(d.job["instances"]) == 2
        ),
        hosts=False,
    ),
    "detach": Row(("--detach",), None, "a dry run starts nothing, detached or not"),
    "up": Row(("--up",), None, "a dry run refuses --up (it would create machines)"),
    "down": Row(("--down",), None, "with --up only"),
    "yes": Row(("--yes",), None, "with --up only"),
    "node_rank": Row(NODE, lambda d: d.prep.options.node_rank == 0),
    "nnodes": Row(NODE, lambda d: d.prep.options.nnodes == 2),
    "coordinator": Row(NODE, lambda d: d.prep.options.coordinator == "198.18.0.21"),
    "per_node": Row(("--per-node", *NODE), lambda d: d.prep.options.per_node is True),
    "join_timeout": Row(
        (*NODE, "--join-timeout", "45s"), lambda d: d.prep.options.join_timeout == 45.0
    ),
    "secret_file": Row(
        (*NODE, "--secret-file", "{d}/secret"),
        lambda d: str(d.prep.options.secret_file).endswith("/secret"),
    ),
}


def _slurm(dry: Dry) -> Any:
    from poprun_py.backends.slurm import slurm_request

    return slurm_request(dry.prep)


def scratch(d: Path) -> None:
    """The files rows name under ``{d}``."""
    (d / "data").mkdir()
    for name in ("a", "b"):
        (d / "data" / f"{name}.txt").write_text(name * 10)
    (d / "wd").mkdir()
    (d / "templates").mkdir()
    (d / "templates" / "instance.j2").write_text("env MX_TEMPLATED=1 {{ program | quoted }}\n")
    for name in ("known_hosts", "ssh_config", "id_key"):
        (d / name).write_text("")
    (d / "secret").write_text("matrix-secret-of-32-bytes-length\n")
    (d / "secret").chmod(0o600)
    hosts = "".join(f"  - {{name: {h}}}\n" for h in HOSTS)
    (d / "cluster.yaml").write_text(f"name: mx\nhosts:\n{hosts}env: {{SPEC_VAR: from-spec}}\n")


def words(row: Row, d: Path) -> list[str]:
    """The row's words with ``{d}`` filled in, after HOSTS unless the row names its own."""
    given = [arg.replace("{d}", str(d)) for arg in row.args]
    return (["-H", ",".join(HOSTS)] if row.hosts else []) + given
