"""The supervision core that the local backend and the host agent share
(poprun_py/hostside/supervision.py), run directly with real child processes: spawning with the
run's id, binding, tagged and capped lines, the grace stop escalating to SIGKILL, the sweep of
what children leave behind. Every wait polls against a deadline."""

from __future__ import annotations

import ast
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from poprun_py.hostside import supervision as S
from poprun_py.hostside.identity import read_stat
from poprun_py.process.proctree import alive


@pytest.fixture
def spawner() -> Iterator[S.Spawner]:
    spawner = S.Spawner({S.RUN_ID_VAR: f"test-{os.getpid()}"}, new_session=True)
    try:
        yield spawner
    finally:
        spawner.close()


def until(check: Callable[[], object], within: float = 10.0) -> None:
    """Poll ``check`` until it is true; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def read_all(child: S.Launched, cap: int = S.MAX_LINE) -> dict[str, list[bytes]]:
    """Every line of both pipes, read through one Poller as the supervisors do."""
    lines: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    poller = S.Poller()
    for name, file in (("stdout", child.stdout), ("stderr", child.stderr)):
        pipe = S.Pipe(file, S.LineFeed(lines[name].extend, cap))
        poller.register(pipe.fd, pipe)
    deadline = time.monotonic() + 10
    while poller.data:
        assert time.monotonic() < deadline
        for pipe in poller.ready(1.0):
            if not pipe.read():
                poller.unregister(pipe.fd)
                pipe.close()
    poller.close()
    return lines


def test_a_child_gets_its_environment_the_run_id_and_a_session_of_its_own(
    spawner: S.Spawner, tmp_path: Path
) -> None:
    script = 'echo "$A $POPRUN_RUN_ID"; pwd; echo oops >&2'
    for cwd in (None, str(tmp_path)):  # posix_spawn, and Popen (it needs a working directory)
        child = spawner.start(("sh", "-c", script), {"A": "a", S.RUN_ID_VAR: "no"}, cwd)
        stat = read_stat(child.pid)
        assert stat is not None and stat[1] == stat[2] == child.pid  # leads group and session
        lines = read_all(child)
        assert lines["stdout"][0] == f"a test-{os.getpid()}".encode()  # the run's id wins
        assert lines["stdout"][1] == (cwd or os.getcwd()).encode()
        assert lines["stderr"] == [b"oops"]
        assert child.wait() == 0 and child.reaped and child.reaped_at is not None


def test_a_bound_child_runs_on_its_cpu_and_a_missing_program_is_an_oserror(
    spawner: S.Spawner,
) -> None:
    cpu = min(os.sched_getaffinity(0))
    child = spawner.start(("grep", "Cpus_allowed_list", "/proc/self/status"), {}, None, (cpu,))
    assert read_all(child)["stdout"][0].split()[-1] == str(cpu).encode()
    assert child.wait() == 0
    with pytest.raises(FileNotFoundError):
        spawner.start(("no-such-program-here",), {}, None)


def test_lines_are_split_and_a_line_longer_than_the_cap_comes_in_pieces(
    spawner: S.Spawner,
) -> None:
    got: list[bytes] = []
    feed = S.LineFeed(got.extend, cap=4)
    feed.feed(b"ab\ncd")
    feed.feed(b"efghij")  # no newline yet, over the cap: passed on as it is
    feed.feed(b"k\nlast")
    feed.close()
    assert got == [b"ab", b"cdefghij", b"k", b"last"]
    big = 2 * S.MAX_LINE + 10
    code = f"import sys; sys.stdout.write('x' * {big} + '\\ny\\n')"
    child = spawner.start((sys.executable, "-c", code), {}, None)
    lines = read_all(child)["stdout"]
    assert child.wait() == 0
    assert lines[-1] == b"y" and b"".join(lines[:-1]) == b"x" * big
    assert all(len(line) <= S.MAX_LINE + S.READ_SIZE for line in lines)
    assert len(lines) > 2  # the long one came in pieces


def test_the_grace_stop_escalates_to_sigkill_for_a_child_that_ignores_sigterm(
    spawner: S.Spawner,
) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(1, flush=True); time.sleep(60)"
    )
    child = spawner.start((sys.executable, "-c", code), {}, None)
    assert child.stdout.readline() == b"1\n"  # SIGTERM is ignored from now on
    stop = S.Grace(0.3)
    assert stop.begin(time.monotonic()) and not stop.begin(time.monotonic())
    child.signal(signal.SIGTERM)
    assert not stop.due(time.monotonic()) and stop.waits(time.monotonic())[0] > 0
    until(lambda: stop.due(time.monotonic()))
    assert child.poll() is None  # it outlived its grace period
    assert stop.kill() and not stop.kill() and stop.waits(time.monotonic()) == []
    child.signal(signal.SIGKILL)
    until(lambda: child.poll() is not None)
    assert child.code == -signal.SIGKILL
    child.close()


def test_a_reaped_child_is_never_signalled(
    spawner: S.Spawner, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = spawner.start(("true",), {}, None)
    assert child.wait() == 0
    sent: list[int] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(pid))
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(pid))
    child.signal(signal.SIGKILL)
    child.signal(signal.SIGKILL, group=False)
    assert sent == []
    child.close()


def test_the_sweep_stops_what_children_left_in_their_group_and_what_escaped_with_the_run_id(
    spawner: S.Spawner,
) -> None:
    escape = f"{sys.executable} -c 'import os, time; os.setsid(); time.sleep(60)'"
    script = f"sleep 60 >/dev/null 2>&1 & echo $!; {escape} >/dev/null 2>&1 & echo $!"
    child = spawner.start(("sh", "-c", script), {}, None)
    left = {int(line) for line in read_all(child)["stdout"]}
    assert child.wait() == 0 and alive(left) == left
    token = f"{S.RUN_ID_VAR}=test-{os.getpid()}"
    until(lambda: {pid for pid, _ in S.left_behind([child], token)} >= left)
    found = S.left_behind([child], token)
    assert os.getpid() not in {pid for pid, _ in found}
    S.signal_left_behind(found, signal.SIGTERM)
    until(lambda: not alive(left))
    until(lambda: not S.left_behind([child], token))


def test_the_core_is_standard_library_python_3_7() -> None:
    source = Path(S.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 7))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    ours = {m for m in imported if m.startswith("poprun_py")}
    assert ours == {"poprun_py.hostside.binding", "poprun_py.hostside.identity"}
    assert {m for m in imported - ours if m.split(".")[0] not in sys.stdlib_module_names} == set()


def test_readable_takes_descriptors_past_1023_where_select_cannot() -> None:
    import resource
    import select

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: no descriptor 1500 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    r, w = os.pipe()
    high = os.dup2(r, 1500)
    try:
        with pytest.raises(ValueError):  # what a launch to 1,024 hosts met (issue 24)
            select.select([high], [], [], 0)
        assert S.readable([high], 0) == []
        os.write(w, b"x")
        assert set(S.readable([high, r], 1.0)) == {high, r}  # one pipe, two descriptors
        os.close(w)
        assert S.readable([high], 1.0) == [high]  # its end is readable too
    finally:
        for fd in (high, r):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
