"""Before anything starts (issue 20, items 16-18), at the seams: a ``.py`` PROGRAM that is not
executable runs under the instance's Python (plan note, rendered command); preflight's checks
on this machine (``check_here``) name a missing working directory or program; the local
backend says when it simulates hosts named after other machines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from poprun_py.cli import run
from poprun_py.preflight.probes import check_here, checks_for_plan
from poprun_py.prepare.job import LaunchOptions, prepare

REPO = Path(__file__).resolve().parents[2]


def prep(program: tuple[str, ...], tmp_path: Path, **opts: object):
    defaults: dict[str, object] = {"hosts": "localhost", "workdir": str(tmp_path)}
    return prepare(LaunchOptions(program=program, **{**defaults, **opts}), environ={})  # type: ignore[arg-type]


def script(tmp_path: Path, name: str = "train.py", executable: bool = False) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(0o755 if executable else 0o644)
    return path


def test_a_py_program_that_is_not_executable_runs_under_this_python_here(tmp_path: Path):
    script(tmp_path)
    plan = prep(("train.py", "--steps", "3"), tmp_path).plan
    assert plan.program == (sys.executable, "train.py", "--steps", "3")
    said = f"train.py is not an executable file here: it runs as `{sys.executable} train.py`"
    assert [n for n in plan.notes if n.startswith("train.py")] == [n for n in plan.notes
            if n.startswith(said)] != []  # fmt: skip
    checks = checks_for_plan(plan)
    assert checks.commands == (sys.executable,) and checks.files == ("train.py",)


def test_on_remote_hosts_it_is_python3_and_the_spec_may_choose(tmp_path: Path):
    assert prep(("train.py",), tmp_path, hosts="h1,h2").plan.program == ("python3", "train.py")
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nhosts: [{name: h1}]\ndefaults: {python: /opt/py/bin/python3.12}\n")
    plan = prep(("./train.py",), tmp_path, cluster=str(spec)).plan
    assert plan.program == ("/opt/py/bin/python3.12", "./train.py")
    assert checks_for_plan(plan).files == ("./train.py",)


def test_an_executable_py_program_and_other_programs_run_as_they_are(tmp_path: Path):
    script(tmp_path, executable=True)
    for program in (("./train.py", "-x"), ("true",), ("python3", "train.py")):
        plan = prep(program, tmp_path).plan
        assert plan.program == program
        assert not any("not an executable file" in n for n in plan.notes)


def test_the_rendered_command_shows_the_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    script(tmp_path)
    code = run(["render", "--hosts", "h1,h2", "--backend", "ssh", "--workdir", str(tmp_path),
                "train.py", "--epochs", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert [line.endswith(" python3 train.py --epochs 1") for line in out.splitlines()
            if line.startswith("env ")] == [True, True]  # fmt: skip


def test_check_here_names_a_missing_workdir_and_missing_programs(tmp_path: Path):
    missing = tmp_path / "absent"
    faults = check_here(prep(("true",), tmp_path, workdir=str(missing)).plan)
    assert [(f.host, f.check, f.detail) for f in faults] == [
        ("localhost", "workdir", f"working directory {missing} is missing")
    ]
    faults = check_here(prep(("no-such-program-q7",), tmp_path).plan)
    assert [(f.check, f.detail) for f in faults] == [
        ("program", "no-such-program-q7: not found on PATH")
    ]
    script(tmp_path, "run.sh")  # not executable
    faults = check_here(prep(("./run.sh",), tmp_path).plan)
    assert [f.detail for f in faults] == [f"./run.sh: not an executable file in {tmp_path}"]
    faults = check_here(prep(("python3", "gone.py"), tmp_path).plan)
    assert [f.detail for f in faults] == [f"gone.py: no such file in {tmp_path}"]
    assert check_here(prep(("true",), tmp_path).plan) == []


def test_check_here_looks_programs_up_on_the_instances_path(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir, "only-here-q7", executable=True)
    plan = prep(("only-here-q7",), tmp_path).plan
    assert [f.check for f in check_here(plan, environ={"PATH": os.defpath})] == ["program"]
    plan = prep(("only-here-q7",), tmp_path, env=(f"PATH={bin_dir}:{os.defpath}",)).plan
    assert check_here(plan, environ={"PATH": os.defpath}) == []


SIMULATED = "--backend local runs every instance on this machine: host(s) h1, h2 are simulated"


def test_the_local_backend_notes_hosts_it_simulates(tmp_path: Path):
    notes = prep(("true",), tmp_path, hosts="h1,h2", backend="local").plan.notes
    assert [n for n in notes if n.startswith(SIMULATED)] == [
        f"{SIMULATED} here, not reached (use --backend ssh to run on them)"
    ]
    declared = prep(("true",), tmp_path, hosts=None, cluster=str(REPO / "clusters/local-2.yaml"))
    assert declared.backend == "local"
    assert not [n for n in declared.plan.notes if "simulated here" in n]
    assert not [n for n in prep(("true",), tmp_path).plan.notes if "simulated here" in n]
