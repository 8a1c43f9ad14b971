"""The first hour (issue 22): what a new user reads -- ``--version``, ``jobs`` piped, a bad host
range, a directory of inputs, eval padding, ranges instead of lists, the hang message's wording
and the instance table's detail -- asserted as the printed text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import poprun_py
from poprun_py.cli import jobs_cmd, run
from poprun_py.cli.app import app
from poprun_py.core.views import fitted_lines, folded_ints
from poprun_py.errors import InputError
from poprun_py.jobs import registry
from poprun_py.jobs.record import JobRecord, JobState
from poprun_py.launch.clocks import dumping_stacks
from poprun_py.prepare.inputs import collect_inputs
from poprun_py.process.supervise import no_stacks


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"poprun-py {version('poprun-py')}\n"
    assert version("poprun-py") == poprun_py.__version__


def test_version_is_listed_in_the_top_level_help_without_importing_commands() -> None:
    code = (
        "import sys; from poprun_py.cli import run; run(['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('rich', 'poprun_py.cli.')) "
        "or m == 'importlib.metadata'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "  --version   Show poprun-py's version and exit.\n" in out
    assert out.splitlines()[-1] == "['poprun_py.cli.app']"


JOBS = [
    ("adhoc", 2, "succeeded", 0),
    ("testhosts-4", 4, "failed", 143),
    ("pod16", 16, "running", None),
]
JOBS_PIPED = """\
job                               state      started              attempts  code
adhoc-20261201-210500-3f2a        succeeded  2025-12-01 21:05:01  1         0
testhosts-4-20261201-210501-3f2a  failed     2025-12-01 21:05:02  2         143
pod16-20261201-210502-3f2a        running    2025-12-01 21:05:03  3
"""


@pytest.fixture
def jobs_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Three detached jobs in this machine's list, their ends known (no host is asked)."""
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "POPRUN_PY_JOB_ROOT": str(root)}
    env["TZ"] = "UTC"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    time.tzset()
    for i, (cluster, n, state, code) in enumerate(JOBS):
        job_id = f"{cluster}-20261201-21050{i}-3f2a"
        record = JobRecord(
            job_id,
            hosts=tuple(f"node{j:02d}" for j in range(1, n + 1)),
            created=1764623100.0 + i,
            state=JobState(state),
            attempts=1 + i,
            started=1764623101.0 + i,
            exit_code=code,
        )
        ended = {k: v for k, v in asdict(record).items() if k != "options"}
        registry.save(registry.Entry(job_id, "h1", ended=ended))
    yield env
    monkeypatch.undo()
    time.tzset()


def test_jobs_at_80_columns_keeps_ids_and_start_times_whole(jobs_here: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert result.output == JOBS_PIPED
    assert result.output.split()[:2] == list(jobs_cmd.JOB_COLUMNS[:2])
    assert max(map(len, result.output.splitlines())) <= 80


def test_jobs_piped_from_a_real_process_gives_whole_ids(jobs_here: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run(
        [sys.executable, "-m", "poprun_py", "jobs"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        env={**env, **jobs_here},
    ).stdout
    assert out == JOBS_PIPED
    ids = [line.split()[0] for line in out.splitlines()[1:]]
    assert ids == [f"{c}-20261201-21050{i}-3f2a" for i, (c, *_) in enumerate(JOBS)]


def test_jobs_a_little_too_wide_cut_the_hosts_only(
    jobs_here: dict[str, str],
) -> None:
    registry.remove("testhosts-4-20261201-210501-3f2a")
    result = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": "85"})
    assert result.output.splitlines()[:3] == [
        "job                         state      hosts      started              attempts  code",
        "adhoc-20261201-210500-3f2a  succeeded  node[01-…  2025-12-01 21:05:01  1         0",
        "pod16-20261201-210502-3f2a  running    node[01-…  2025-12-01 21:05:03  3",
    ]


def test_a_wide_output_shows_every_column_whole(jobs_here: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": "200"})
    assert result.output.splitlines()[1] == (
        "adhoc-20261201-210500-3f2a        succeeded  node[01-02]  2025-12-01 21:05:01  1         0"
    )


def test_only_the_shrinking_column_gives_way_and_never_below_its_header() -> None:
    rows = [["a-job-id", "node[01-16]", "x"]]
    lines = fitted_lines(("job", "hosts", "c"), rows, 18, shrink=1)
    assert lines == ["job       hosts  c", "a-job-id  node…  x"]
    rows = [["a-long-job-id-that-does-not-fit", "node[01-16]", "x"]]
    lines = fitted_lines(("job", "hosts", "c"), rows, 20, shrink=1)
    assert lines == ["job                              c", "a-long-job-id-that-does-not-fit  x"]
    assert fitted_lines(("job", "hosts"), [["j", "h1"]], 10, shrink=1) == ["job  hosts", "j    h1"]


def tree(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


def test_a_directory_input_is_every_file_under_it(tmp_path: Path) -> None:
    tree(tmp_path, ["data/a.npz", "data/more/b.npz", "data/.cache/c"])
    found = collect_inputs(["data"], cwd=str(tmp_path))
    assert [Path(p).relative_to(tmp_path / "data").as_posix() for p in found.paths] == [
        "a.npz",
        "more/b.npz",
    ]


@pytest.mark.parametrize(
    ("given", "fault"),
    [
        ("examples/data", "--input 'examples/data': no such file or directory"),
        (
            "examples/data/*.npz",
            "--input 'examples/data/*.npz' matches no files: "
            "directory 'examples/data' does not exist",
        ),
        ("empty", "--input 'empty' is a directory with no files in it"),
        (
            "hidden",
            "--input 'hidden' is a directory whose 1 file(s) are all hidden (under names starting "
            "with '.'), which a directory leaves out: name them, e.g. --input 'hidden/.git/x'",
        ),
        ("empty/*.npz", "--input 'empty/*.npz' matches no files"),
    ],
)
def test_an_input_that_gives_no_files_says_why(
    given: str,
    fault: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "empty").mkdir()
    tree(tmp_path, ["hidden/.git/x"])
    with pytest.raises(InputError) as caught:
        collect_inputs([given], cwd=str(tmp_path))
    assert str(caught.value) == fault
    monkeypatch.chdir(tmp_path)
    assert run(["plan", "-H", "h1", "-i", given, "t.py"]) == 2
    assert capsys.readouterr().err == f"poprun-py: error: {fault}\n"


def test_eval_padding_is_shown_beside_the_real_file_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree(tmp_path, ["ev/a.rec", "ev/b.rec", "ev/c.rec"])
    args = ["plan", "-H", "h1,h2", "-i", str(tmp_path / "ev"), "--eval-pad", "2", "t.py"]
    assert run(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        "instance  host  local  replicas  NUMA  CPUs  devices  groups  files      bytes",
        "0         h1    0      0         -     -     -        -       2          2 B",
        "1         h2    0      1         -     -     -        -       1 + 1 pad  1 B",
    ]


def test_an_instances_groups_are_shown_as_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["plan", "-H", "h1", "--replicas", "16", "-n", "2", "-g", "1", "t.py"]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "instance  host  local  replicas  NUMA  CPUs  devices  groups  files  bytes",
        "0         h1    0      0-7       -     -     -        0-7     0      0 B",
        "1         h1    1      8-15      -     -     -        8-15    0      0 B",
    ]
    assert folded_ints([3, 4, 5, 7, 8, 0]) == "3-5,7,8,0"  # in their order; runs of 3+ fold


def test_the_hang_message_counts_instances_and_says_when_none_registered() -> None:
    assert dumping_stacks(0) == (
        "dumping every instance's stacks with py-spy where it is installed "
        "(no instance registered faulthandler for SIGUSR1: import poprun_py.dist)"
    )
    assert dumping_stacks(1).endswith(
        "else with SIGUSR1 to the 1 instance that registered faulthandler"
    )
    assert dumping_stacks(8).endswith("to the 8 instances that registered faulthandler")


def test_no_stacks_says_whether_py_spy_is_missing_or_failed() -> None:
    assert no_stacks(2, pyspy_here=False) == (
        "no stacks of instance 2: py-spy is not installed here and it did not register "
        "faulthandler (import poprun_py.dist)"
    )
    assert no_stacks(2, pyspy_here=True).startswith(
        "no stacks of instance 2: py-spy could not dump it and it did not register"
    )
