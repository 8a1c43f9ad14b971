"""Issue 20, items 8 and 20: every ``launch`` option, on every backend where it applies, is
carried by the rendered job (``--dry-run``), the Slurm batch script and the detach record.

The matrix is generated from the typer command's own parameters: an option with no row in
tests/matrix_rows.py fails :func:`test_every_launch_option_has_a_row`. The batch script and
the detach record are checked for every row by reading them back the way their consumers do
(the batch job's ``launch`` argv parsed by the same command; the record read by the
supervisor's :func:`~poprun_py.jobs.supervisor.launch_options`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer

from poprun_py.cli import launch_cmd, run
from poprun_py.cli.app import app
from poprun_py.cli.option_model import DONE_BY_THE_CLIENT, NOT_PASSED_ON, launch_options
from poprun_py.jobs import detach as detach_mod
from poprun_py.jobs.record import from_json
from poprun_py.jobs.supervisor import Recorder
from poprun_py.jobs.supervisor import launch_options as recorded_options
from poprun_py.prepare.job import LaunchOptions, prepare
from tests.matrix_rows import BACKENDS, PROGRAM, ROWS, Dry, scratch, words

FIELDS = {f.name for f in fields(LaunchOptions)}


@functools.cache
def launch_command() -> Any:
    """The click command behind ``poprun-py launch``."""
    group = typer.main.get_command(app)
    return group.commands["launch"]  # type: ignore[attr-defined]


def params(args: list[str]) -> dict[str, Any]:
    """What ``launch ARGS`` parses to, by parameter name (lists as tuples)."""
    ctx = launch_command().make_context("launch", list(args), resilient_parsing=True)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in ctx.params.items()}


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("matrix")
    scratch(root)
    return root


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)


def test_every_launch_option_has_a_row() -> None:
    names = [p.name for p in launch_command().params]
    missing = [n for n in names if n not in ROWS]
    assert not missing, f"launch options with no row in tests/matrix_rows.py: {missing}"
    assert not set(ROWS) - set(names), f"rows for no option: {set(ROWS) - set(names)}"


def test_every_option_left_out_is_a_real_option_with_a_reason() -> None:
    names = {p.name for p in launch_command().params}
    for table in (NOT_PASSED_ON, DONE_BY_THE_CLIENT):
        assert set(table) <= names, set(table) - names
        assert all(len(reason) > 10 for reason in table.values())


# ---------------------------------------------------------------- --dry-run


def dry_run(backend: str, args: list[str], capsys: pytest.CaptureFixture[str], d: Path) -> Dry:
    argv = ["launch", "--dry-run", "-f", "json", "-b", backend, *args, "--", *PROGRAM]
    with contextlib.chdir(d):
        code = run(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return Dry(json.loads(out.out), launch_cmd._RETAINED[-1], backend)


DRY_CASES = [(n, b) for n, r in ROWS.items() if r.dry is not None for b in r.backends]
BASELINE_ONLY = {"program", "backend", "fmt", "dry_run"}  # the matrix itself sets these


@pytest.mark.parametrize(("name", "backend"), DRY_CASES)
def test_the_dry_run_carries_the_option(
    name: str, backend: str, capsys: pytest.CaptureFixture[str], d: Path
) -> None:
    row = ROWS[name]
    assert row.dry is not None
    assert row.dry(dry_run(backend, words(row, d), capsys, d)), (name, backend)
    if name not in BASELINE_ONLY:  # the check tells the option from its default
        bare = dry_run(backend, words(ROWS["program"], d), capsys, d)
        assert not row.dry(bare), f"{name}: the check passes without the option too"


def test_options_without_a_dry_run_check_say_why() -> None:
    for name, row in ROWS.items():
        assert row.dry is not None or len(row.dry_note) > 10, name


# ---------------------------------------------------------------- the Slurm batch script


def batch_script(args: list[str], capsys: pytest.CaptureFixture[str], d: Path) -> str:
    with contextlib.chdir(d):
        code = run(["render", "-b", "slurm", *args, "--", *PROGRAM])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("#!/bin/sh"), out.out
    return out.out


def batch_launch(script: str) -> list[str]:
    """The words after ``-m poprun_py launch`` of the script's exec line."""
    line = next(x for x in script.splitlines() if x.startswith("exec "))
    argv = shlex.split(line)
    return argv[argv.index("launch") + 1 :]


SLURM_ROWS = [n for n, r in ROWS.items() if "slurm" in r.backends and n not in NOT_PASSED_ON]


@pytest.mark.parametrize("name", SLURM_ROWS)
def test_the_batch_script_passes_the_option_on(
    name: str, capsys: pytest.CaptureFixture[str], d: Path
) -> None:
    args = words(ROWS[name], d)
    given = params([*args, "--", *PROGRAM])
    again = params(batch_launch(batch_script(args, capsys, d)))
    default = next(p.default for p in launch_command().params if p.name == name)
    if name not in BASELINE_ONLY:
        assert given[name] not in (default, None, ()), f"{name}: the row sets no value"
    assert again[name] == given[name], name
    assert again["backend"] == "slurm" and again["program"] == PROGRAM


def test_the_batch_job_plans_the_same_job_inside_the_allocation(
    capsys: pytest.CaptureFixture[str], d: Path
) -> None:
    """``render -H h1,h2,h3 -b slurm --spare-hosts 1`` gave --nodes=2 and no spare."""
    args = ["-H", "198.18.0.22,198.18.0.21,198.18.0.23", "--spare-hosts", "1", "-r", "4"]
    script = batch_script(args, capsys, d)
    assert "#SBATCH --nodes=3\n" in script
    assert "#SBATCH --nodelist=198.18.0.22,198.18.0.21,198.18.0.23\n" in script
    inside = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "198.18.0.[21-23]"}  # Slurm sorts
    outer = prepare(launch_options(params(args)), environ={})
    again = prepare(launch_options(params(batch_launch(script))), environ=inside)
    assert [h.name for h in again.plan.hosts] == [h.name for h in outer.plan.hosts]
    assert again.long_run.spares == outer.long_run.spares
    assert again.plan.num_replicas == 4 and again.backend == "slurm"


def test_slots_survive_the_batch_job(capsys: pytest.CaptureFixture[str], d: Path) -> None:
    hostfile = d / "slots-hostfile"
    hostfile.write_text("198.18.0.21 slots=3\n198.18.0.22 slots=1\n")
    script = batch_script(["-H", f"@{hostfile}"], capsys, d)
    assert "#SBATCH --ntasks=4\n#SBATCH --ntasks-per-node=3\n" in script
    inside = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "198.18.0.[21-22]"}
    again = prepare(launch_options(params(batch_launch(script))), environ=inside)
    assert [len(h.instances) for h in again.plan.hosts] == [3, 1]


def test_without_named_nodes_the_hosts_are_the_allocation_s(
    capsys: pytest.CaptureFixture[str], d: Path
) -> None:
    argv = batch_launch(batch_script(["-n", "2"], capsys, d))  # localhost: no --nodelist
    assert params(argv)["hosts"] is None and params(argv)["instances"] == 2


def test_relative_paths_become_absolute(capsys: pytest.CaptureFixture[str], d: Path) -> None:
    again = params(batch_launch(batch_script(["-c", "cluster.yaml", "-o", "out"], capsys, d)))
    assert (again["cluster"], again["output_dir"]) == (str(d / "cluster.yaml"), str(d / "out"))


# ---------------------------------------------------------------- the detach record


class _Captured:
    """A supervisor's host that keeps the record instead of starting anything."""

    name = "fake"

    def __init__(self) -> None:
        self.records: list[str] = []

    def call(self, op: str, *args: str) -> Any:  # pragma: no cover - not called
        raise AssertionError(op)

    def start_supervisor(self, job_id: str, record: str, env: Any) -> str:
        self.records.append(record)
        return f"/tmp/fake/{job_id}"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _Captured:
    host = _Captured()

    @contextlib.contextmanager
    def fake_remote(spec: Any, settings: Any) -> Iterator[_Captured]:
        yield host

    monkeypatch.setattr(detach_mod, "remote_job_host", fake_remote)
    monkeypatch.setattr(detach_mod, "LocalJobHost", lambda: host)  # per-node mode's, here
    monkeypatch.setenv("POPRUN_SECRET", "the-matrix-secret-0123456789")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return host


DETACH_ROWS = [n for n in ROWS if n in FIELDS or n not in DONE_BY_THE_CLIENT]


@pytest.mark.parametrize("name", DETACH_ROWS)
def test_the_detach_record_carries_the_option(
    name: str, captured: _Captured, capsys: pytest.CaptureFixture[str], d: Path, tmp_path: Path
) -> None:
    args = words(ROWS[name], d)
    with contextlib.chdir(d):
        code = run(["launch", "--detach", "-b", "ssh", *args, "--", *PROGRAM])
    assert code == 0, capsys.readouterr().err
    record = from_json(captured.records[-1])
    given = params([*args, "--", *PROGRAM])
    if name in FIELDS:
        with contextlib.chdir(d):  # the supervisor goes to the job's working directory
            opts = recorded_options(Recorder(tmp_path, record, -1))
        expected = "ssh" if name == "backend" else launch_options(given).__dict__[name]
        assert getattr(opts, name) == expected, name
    else:
        assert record.options["cli"][name] == given[name], name


def test_the_detach_record_leaves_out_what_the_client_did(
    captured: _Captured, capsys: pytest.CaptureFixture[str], d: Path
) -> None:
    with contextlib.chdir(d):
        code = run(
            ["launch", "--detach", "-b", "ssh", "-H", "198.18.0.21", "-f", "json", "--", "true"]
        )
    assert code == 0, capsys.readouterr().err
    record = from_json(captured.records[-1])
    assert record.options["cli"] == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_has_rows(backend: str) -> None:
    assert sum(backend in r.backends for r in ROWS.values()) > 40
