"""Issue 20, D: output, files and the job registry (items 11-15), at the seams: logs written as
lines arrive, one private-file writer that never follows a planted symlink and never collides
with itself, a job root another user owns refused, an rsync that floods its stderr, pruning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from poprun_py.core.result import RunOptions
from poprun_py.errors import BackendError
from poprun_py.hostside import agent as agent_host
from poprun_py.hostside import hostops
from poprun_py.jobs import registry
from poprun_py.process.output import LineFeed, Output
from poprun_py.ssh import sync as ssh_sync

REPO = Path(__file__).resolve().parents[2]
ROOT_ONLY = pytest.mark.requires("root")  # chown to another uid


def test_a_log_holds_each_line_as_soon_as_it_is_emitted_and_is_private(tmp_path: Path) -> None:
    out = Output(RunOptions(output_dir=tmp_path / "logs", sink=lambda *_: None), {0: "h", 1: "h"})
    try:
        LineFeed(out, 0, "stdout").feed(b"step 1\nstep 2\npart")
        out.emit(1, "stderr", b"warn")
        log0, log1 = tmp_path / "logs" / "instance-0.log", tmp_path / "logs" / "instance-1.log"
        assert log0.read_bytes() == b"step 1\nstep 2\n"  # before close: nothing waits in a buffer
        assert log1.read_bytes() == b"warn\n"
        assert {oct(p.stat().st_mode & 0o777) for p in (log0, log1)} == {"0o600"}
    finally:
        out.close()


def test_a_planted_symlink_where_a_temp_file_goes_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "job" / "rank"
    target.parent.mkdir(mode=0o700)
    # where 5bdd021 put its temp files (agent: PATH.PID.tmp; registry: .NAME.tmp) ...
    os.symlink(victim, f"{target}.{os.getpid()}.tmp")
    os.symlink(victim, target.parent / f".{target.name}.tmp")
    assert agent_host.write_files([{"path": str(target), "text": "evil?\n"}]) == ""
    registry.write_private(target, "mine\n")
    assert victim.read_text() == "precious\n"
    assert target.read_text() == "mine\n" and not target.is_symlink()
    # ... and where it puts them now, when that name is known in advance: O_EXCL|O_NOFOLLOW
    from poprun_py.hostside import private

    monkeypatch.setattr(private.os, "urandom", lambda n: b"\0" * n)
    os.symlink(victim, target.parent / f".rank.{os.getpid()}.{'00' * 6}.tmp")
    with pytest.raises(FileExistsError):
        private.write_private(str(target), "again\n")
    assert victim.read_text() == "precious\n" and target.read_text() == "mine\n"


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from poprun_py.jobs import registry
    root, who = Path(sys.argv[1]), sys.argv[2]
    errors = 0
    for i in range(300):
        try:
            registry.save(registry.Entry("j-1", "h1", hosts=who * 200, created=i), root)
        except OSError:
            errors += 1
    print(errors)
    """
)


def test_two_processes_saving_one_entry_300_times_each_never_fail_nor_tear_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "reg"
    registry.save(registry.Entry("j-1", "h1"), root)
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), who],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for who in ("a", "b")
    ]
    reads = 0
    while any(w.poll() is None for w in writers):
        data = json.loads((root / "j-1.json").read_text())  # always whole: old or new
        assert data["hosts"] in ("a" * 200, "b" * 200, None)
        reads += 1
    assert [int(w.communicate()[0]) for w in writers] == [0, 0]
    assert [w.returncode for w in writers] == [0, 0] and reads > 0
    assert sorted(p.name for p in root.iterdir()) == ["j-1.json"]  # no temp file left


@ROOT_ONLY
def test_a_tree_in_a_shared_directory_that_another_user_owns_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "poprun-py-0"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    why = f"{theirs} is owned by nobody (uid 65534), not by root (uid 0)"
    failure = agent_host.write_files([{"path": f"{theirs}/jobs/j/rank", "text": "x"}])
    assert failure == f"cannot write {theirs}/jobs/j/rank: {why}"
    assert not (theirs / "jobs").exists()
    from poprun_py.hostside import private

    with pytest.raises(private.UnsafePath) as caught:
        private.private_dir(str(theirs / "jobs"))
    assert str(caught.value) == why
    open_to_all = shared / "poprun-py-1"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(private.UnsafePath, match="is writable by other users"):
        private.private_dir(str(open_to_all / "jobs"))
    mine = private.private_dir(str(shared / "poprun-py-2" / "jobs"))
    assert oct(Path(mine).parent.stat().st_mode & 0o7777) == "0o700"


@ROOT_ONLY
def test_host_operations_refuse_a_forged_root_and_ignore_a_record_of_another_user(
    tmp_path: Path,
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        job = tmp_path / "jobs" / "j1"
        job.mkdir(parents=True)
        record = {"id": "j1", "state": "running", "pid": sleeper.pid}
        record["pid_start"] = hostops.pid_start(sleeper.pid)
        (job / "job.json").write_text(json.dumps(record))
        os.chown(job / "job.json", 65534, 65534)  # written by someone else: not our job
        assert hostops.list_jobs(str(tmp_path / "jobs")) == []
        assert hostops.stop(str(tmp_path / "jobs"), "j1", 0.1) is None
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_host_operations_prune_only_jobs_ended_long_enough_ago(tmp_path: Path) -> None:
    now = time.time()
    for job_id, values in {
        "old": {"state": "succeeded", "ended": now - 7200},
        "recent": {"state": "failed", "ended": now - 60},
        "alive": {
            "state": "running",
            "pid": os.getpid(),
            "pid_start": hostops.pid_start(os.getpid()),
        },
        "lost": {"state": "running", "pid": 1, "pid_start": "0"},
    }.items():
        (tmp_path / job_id).mkdir()
        (tmp_path / job_id / "job.json").write_text(json.dumps({"id": job_id, **values}))
    os.utime(tmp_path / "lost" / "job.json", (now - 7200, now - 7200))  # no end: its last word
    assert sorted(hostops.prune(str(tmp_path), 3600, now=now)) == ["lost", "old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alive", "recent"]
    assert hostops.prune(str(tmp_path), 0, now=now) == ["recent"]


def test_rsync_errors_beyond_a_pipe_full_do_not_hang_sync() -> None:
    marker = uuid.uuid4().hex
    flood = (
        f"import sys; sys.stdout.write('<f+++++++++ 5 a\\n'); sys.stdout.flush(); "
        f"sys.stderr.write('rsync: error {marker}\\n' * 8000); sys.stderr.write('last line\\n'); "
        "sys.exit(23)"
    )
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(ssh_sync._rsync([sys.executable, "-c", flood], "h1", 5, None))
        except BackendError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # the deadlock: kill the child so the test run goes on
        subprocess.run(["pkill", "-f", marker], check=False)
        worker.join(10)
        pytest.fail("sync hung on an rsync whose stderr outgrew the pipe")
    assert len(outcome) == 1 and isinstance(outcome[0], BackendError)
    assert str(outcome[0]) == "rsync to h1 failed: last line"


@pytest.mark.requires("pgrep")
def test_an_rsync_past_the_deadline_is_stopped() -> None:
    marker = f"{30 + uuid.uuid4().int % 1000 / 997:.6f}"
    started = time.monotonic()
    with pytest.raises(BackendError, match="rsync to h1 did not finish in time"):
        ssh_sync._rsync(["sleep", marker], "h1", 0, None, deadline=time.monotonic() + 0.5)
    assert time.monotonic() - started < 20
    gone = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, check=False)
    assert gone.stdout == b""


def test_keep_job_dir_survives_the_slurm_re_invocation() -> None:
    args = ["render", "--backend", "slurm", "--hosts", "h1", "--keep-job-dir", "--", "true"]
    script = subprocess.run(
        [sys.executable, "-m", "poprun_py", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    body = [line for line in script.splitlines() if line.startswith("exec ")]
    assert len(body) == 1 and "--keep-job-dir" in body[0].split(" -- ")[0]


OLD_PYTHON = "/root/.pyenv/versions/3.7.16/bin/python"
PYTHONS = [p for p in (OLD_PYTHON, sys.executable) if os.path.exists(p)]


def alone(python: str, source: str, *args: str, cwd: Path, env: dict[str, str]) -> Any:
    """``python -S -c SOURCE ARGS`` in a directory without poprun_py, a bare environment."""
    argv = [python, "-S", "-c", source, *args]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, check=False)


@pytest.mark.parametrize("python", PYTHONS)
def test_the_shipped_host_side_writer_and_hostops_run_alone_on_any_python(
    python: str, tmp_path: Path
) -> None:
    from poprun_py.hostside.bundle import bundle

    agent = bundle("agent")
    agent = agent.replace('if __name__ == "__main__":\n    main()', "")
    target = tmp_path / "root" / "jobs" / "j" / "shard-0.txt"
    code = f"print(repr(write_files([{{'path': {str(target)!r}, 'text': 'a.bin\\n'}}])))"
    env = {"PATH": os.environ["PATH"], "POPRUN_PY_JOB_ROOT": str(tmp_path / "root")}
    wrote = alone(python, agent + "\n" + code, cwd=tmp_path, env=env)
    assert (wrote.returncode, wrote.stdout) == (0, "''\n"), wrote.stderr
    assert target.read_text() == "a.bin\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o700"
    for args in (["list"], ["prune", "0"]):
        answer = alone(python, bundle("hostops"), *args, cwd=tmp_path, env=env)
        assert (answer.returncode, answer.stdout) == (0, "[]\n"), answer.stderr
    if os.geteuid() == 0:
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        (shared / "r").mkdir()
        os.chown(shared / "r", 65534, 65534)
        env["POPRUN_PY_JOB_ROOT"] = str(shared / "r")
        refused = alone(python, bundle("hostops"), "list", cwd=tmp_path, env=env)
        assert refused.returncode == hostops.UNSAFE_ROOT
        assert refused.stderr == (
            f"poprun-py: {shared / 'r'} is owned by nobody (uid 65534), not by root (uid 0)\n"
        )
