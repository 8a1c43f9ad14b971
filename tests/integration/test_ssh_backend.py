"""The ssh backend: its host agent run locally, then real jobs on real test hosts.

Host tests run every instance on network-namespace hosts with their own sshd and check, in every
namespace, that nothing is left running afterwards (a unique marker in each command line, and
no process but sshd in the namespace).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from poprun_py.agent.client import AgentPool
from poprun_py.backends.ssh import SshBackend, connect_and_run
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.result import LaunchResult, RunOptions
from poprun_py.core.spec import ClusterSpec, EnvVar, HostSpec, JobSpec
from poprun_py.core.topology import format_cpulist
from poprun_py.hostside import agent as remote_agent
from poprun_py.hostside import stackdump
from poprun_py.hostside.bundle import bundle, over_stdin, payload
from poprun_py.prepare.discover import discover_local
from poprun_py.process import supervise
from poprun_py.providers.netns import TestCluster, host_pids
from poprun_py.render import job as render
from poprun_py.ssh.hostresult import values
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from tests.hostfixtures import MakeCluster
from tests.integration.helpers import BINDING_PROBE, binding_case, strays
from tests.unit.test_stackdump import RANKED, fake_pyspy, ranked_pythons

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
Lines = list[tuple[int, str, str]]


# ---------------------------------------------------------------- helpers: jobs and clusters


def plan_on(
    cluster: TestCluster, program: Sequence[str], per_host: int = 1, **job: object
) -> LaunchPlan:
    """A plan with ``per_host`` instances on every host of ``cluster`` (no NUMA binding)."""
    hosts = tuple(HostSpec(h.name, address=h.address) for h in cluster.hosts)
    n = per_host * len(hosts)
    spec = JobSpec(tuple(program), replicas=n, instances=n, numa_aware=False, **job)  # type: ignore[arg-type]
    return make_plan(ClusterSpec(name=cluster.name, hosts=hosts), spec)


def make_job(plan: LaunchPlan, job_dir: str) -> render.RenderedJob:
    """The plan rendered for the ssh backend."""
    return render.render_job(plan, "ssh", job_dir=job_dir)


def settings_for(cluster: TestCluster) -> SshSettings:
    return SshSettings(
        known_hosts=cluster.known_hosts,
        ssh_config=cluster.ssh_config,
        identity_file=str(cluster.identity_file),
        connect_timeout=5.0,
    )


def run_job(
    cluster: TestCluster, job: render.RenderedJob, **options: object
) -> tuple[LaunchResult, Lines]:
    """Run ``job`` with a capturing sink on a fresh pool; return the result and every line."""
    lines: Lines = []
    opts = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)), **options)  # type: ignore[arg-type]
    pool = ConnectionPool([h.spec for h in job.plan.hosts], settings_for(cluster))
    try:
        pool.open_all()
        return SshBackend.over(pool).run(job, opts), lines
    finally:
        pool.close()


def marker() -> str:
    return f"poprun-ssh-test-{uuid.uuid4().hex[:12]}"


def sleeper(mark: str, seconds: int = 60) -> list[str]:
    """A program that sleeps, with ``mark`` in the command line of every process it runs."""
    return [PY, "-c", f"import time; time.sleep({seconds})", mark]


def marked(cluster: TestCluster, mark: str) -> dict[str, list[str]]:
    """Per host: processes carrying ``mark`` (pgrep run inside the host's namespace) that
    belong to the host's network namespace."""
    found = {}
    for host in cluster.hosts:
        out = subprocess.run(
            ["ip", "netns", "exec", host.netns, "pgrep", "-f", mark],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        mine = sorted({int(p) for p in out}.intersection(host_pids(host.netns)))
        if mine:
            found[host.name] = _cmdlines(mine)
    return found


def anywhere(mark: str) -> list[str]:
    """Processes carrying ``mark`` anywhere on this machine."""
    out = subprocess.run(["pgrep", "-af", mark], capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def assert_clean(
    cluster: TestCluster, mark: str, within: float = 10.0, *, everywhere: bool = True
) -> None:
    """Nothing with ``mark``, and nothing but sshd, in any host's namespace (waiting a little
    for sshd's per-connection processes to exit); with ``everywhere``, nothing with ``mark`` on
    this whole machine either (not for a test whose cut-off host is still cleaning up)."""
    deadline = time.monotonic() + within
    while (marked(cluster, mark) or strays(cluster)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(cluster, mark) == {}
    assert strays(cluster) == {}, {h: _cmdlines(p) for h, p in strays(cluster).items()}
    if everywhere:
        assert anywhere(mark) == []


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


# ---------------------------------------------------------------- the agent, run locally


def agent(
    header: dict[str, object], *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """The agent as a local process, its header already sent; stdin stays open."""
    proc = subprocess.Popen(
        [PY, "-m", "poprun_py.hostside.agent", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"job " + json.dumps(header).encode() + b"\n")
    proc.stdin.flush()
    return proc


def finish(proc: subprocess.Popen[bytes]) -> bytes:
    """Read the agent's records to its end (stdin stays open until then), then wait for it."""
    assert proc.stdin is not None and proc.stdout is not None
    out = proc.stdout.read()
    proc.stdin.close()
    proc.wait(timeout=10)
    return out


def records(out: bytes) -> list[str]:
    return [r for r in out.decode().splitlines() if r != "h"]


def wait_sleepers(mark: str, count: int, within: float = 30.0) -> list[str]:
    """The processes carrying ``mark`` on this machine, once ``count`` of them are
    :func:`sleeper` Pythons (started, not forks on their way to it)."""
    deadline = time.monotonic() + within
    while True:
        found = anywhere(mark)
        if sum(line.split(" ", 1)[1].startswith(PY) for line in found) >= count:
            return found
        assert time.monotonic() < deadline, f"only {found} started"
        time.sleep(0.05)


def kill_marked(mark: str) -> None:
    """SIGKILL what carries ``mark`` (this test's own uuid) and is still running: clean-up."""
    for line in anywhere(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def wait_gone(mark: str, within: float) -> float:
    start = time.monotonic()
    while anywhere(mark) and time.monotonic() - start < within:
        time.sleep(0.05)
    assert anywhere(mark) == []
    return time.monotonic() - start


def test_agent_reports_the_pid_first_then_tagged_lines_then_the_exit() -> None:
    script = "echo out; echo err >&2; printf 'no newline'; exit 3"
    job = {"instances": [{"index": 5, "argv": ["sh", "-c", script], "env": {}, "cwd": None}]}
    proc = agent(job)
    recs = records(finish(proc))
    assert recs[0] == f"p 5 {recs[0].split()[2]}" and recs[-1] == "d"
    assert sorted(recs[1:-1]) == ["e 5 err", "o 5 no newline", "o 5 out", "x 5 3"]
    assert proc.returncode == 0


def test_a_lingering_agent_answers_requests_after_its_job_until_stdin_closes(
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    proc = agent({"instances": [{"index": 0, "argv": ["true"]}], "linger": True})
    assert proc.stdin is not None and proc.stdout is not None
    while proc.stdout.readline().strip() != b"d linger":  # the job is over; it serves again
        pass
    request = {"id": 1, "argv": ["rm", "-rf", "--", str(job_dir)], "env": {}, "timeout": 10}
    proc.stdin.write(b"run " + json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    kind, _, body = proc.stdout.readline().partition(b" ")
    assert (kind, json.loads(body)["code"]) == (b"R", 0) and not job_dir.exists()
    assert proc.poll() is None  # still there: it ends when poprun-py closes its stdin
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize(
    ("argvs", "control"),
    [([["false"]], b""), ([["sleep", "30"]], b"stop\n"), ([["true"], ["/nonexistent/x"]], b"")],
    ids=["its-instance-failed", "told-the-job-failed", "one-not-started"],
)
def test_an_agent_asked_to_linger_exits_after_a_job_that_failed(
    argvs: list[list[str]], control: bytes
) -> None:
    """Nothing follows a failed job (its directory is kept), so the agent does not linger:
    ending a thousand lingering agents one by one cost the stop 2.4 s (issue 24)."""
    instances = [{"index": i, "argv": argv} for i, argv in enumerate(argvs)]
    proc = agent({"instances": instances, "linger": True})
    assert proc.stdin is not None
    proc.stdin.write(control)
    proc.stdin.flush()
    assert proc.wait(timeout=15) == 0  # stdin still open
    assert records(finish(proc))[-1] == "d"


def test_an_agent_stopped_with_term_still_lingers() -> None:
    """``term`` is also how a daemon's end is relayed under mpirun (:mod:`poprun_py.agent.relay`),
    after a success: the agent still lingers then, and its instance killed by that SIGTERM is no
    failure of its own."""
    proc = agent({"instances": [{"index": 0, "argv": ["sleep", "30"]}], "linger": True})
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().startswith(b"p 0 ")
    proc.stdin.write(b"term\n")
    proc.stdin.flush()
    while (line := proc.stdout.readline().strip()) not in (b"d", b"d linger", b""):
        pass
    assert line == b"d linger"
    proc.stdin.close()  # it ends with its stdin
    assert proc.wait(timeout=10) == 0


def test_an_agent_not_asked_to_linger_exits_after_its_job() -> None:
    proc = agent({"instances": [{"index": 0, "argv": ["true"]}]})
    assert proc.wait(timeout=10) == 0  # stdin still open
    assert records(finish(proc))[-1] == "d"


def test_agent_writes_job_files_private_and_passes_the_environment(tmp_path: Path) -> None:
    shard = tmp_path / "job" / "shard-0.txt"
    job = {
        "files": [{"path": str(shard), "text": "a.rec\nb.rec\n"}],
        "instances": [
            {
                "index": 0,
                "argv": ["sh", "-c", 'cat "$POPRUN_SHARD_FILE"; echo "$TOKEN"; pwd'],
                "env": {"POPRUN_SHARD_FILE": str(shard), "TOKEN": "s3cr3t"},
                "cwd": str(tmp_path),
            }
        ],
    }
    out = finish(agent(job))
    lines = [r[4:] for r in records(out) if r.startswith("o 0 ")]
    assert lines == ["a.rec", "b.rec", "s3cr3t", str(tmp_path)]
    assert shard.stat().st_mode & 0o777 == 0o600
    assert (shard.parent.stat().st_mode & 0o777) == 0o700


def test_agent_reports_a_program_that_cannot_start() -> None:
    job = {"instances": [{"index": 2, "argv": ["/no/such/prog"], "env": {}, "cwd": None}]}
    out = finish(agent(job))
    assert records(out) == ["f 2 cannot start '/no/such/prog': No such file or directory", "d"]


def test_agent_dumps_stacks_with_py_spy_else_sigusr1_to_faulthandler_instances(
    tmp_path: Path,
) -> None:
    pyspy = tmp_path / "py-spy"
    pyspy.write_text('#!/bin/sh\necho "Process $3: fake"\necho \'Thread 1 (idle): "Main"\'\n')
    pyspy.chmod(0o755)
    python = f"{PY} -c 'import time; time.sleep(30)'; true"  # a wrapper around Python
    argvs = [["sh", "-c", python], ["sleep", "30"], ["sleep", "30"]]
    job = {
        "instances": [{"index": i, "argv": a, "env": {}, "cwd": None} for i, a in enumerate(argvs)]
    }
    proc = agent(job, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.stdin is not None and proc.stdout is not None
    pids = dict(proc.stdout.readline().decode().split()[1:] for _ in range(3))
    deadline = time.monotonic() + 10
    pythons: list[int] = []
    while not pythons and time.monotonic() < deadline:  # the wrapper starts its python
        pythons = stackdump.python_processes(int(pids["0"]))
    proc.stdin.write(b"dump 1\n")
    proc.stdin.flush()
    got: list[str] = []
    want = {"y 0 py-spy", "y 1 faulthandler", "y 2 none", "k 1 10"}
    while not want <= set(got) and time.monotonic() < deadline:  # heartbeats keep it moving
        got.append(proc.stdout.readline().decode().rstrip("\n"))
    proc.stdin.write(b"term\n")
    proc.stdin.flush()
    recs = got + records(finish(proc))
    assert want <= set(recs)
    spy = [r for r in recs if r.startswith("e 0 ")]  # the python's stacks, not the sh's
    assert spy == [f"e 0 Process {pythons[0]}: fake", 'e 0 Thread 1 (idle): "Main"']
    assert recs[-1] == "d" and proc.returncode == 0


def test_the_agent_answers_dump_ranks_with_each_ranks_lines_and_how(tmp_path: Path) -> None:
    fake_pyspy(tmp_path, 'echo "Process $3: fake"')
    env = {k: v for k, v in os.environ.items() if k not in stackdump.RANK_VARS}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    job = {"instances": [{"index": 0, "argv": ["sh", "-c", RANKED.format(py=PY)], "env": {}}]}
    proc = agent(job, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    daemon = int(proc.stdout.readline().split()[2])
    by_rank = {rank: pid for pid, rank in ranked_pythons(daemon, 3).items()}
    proc.stdin.write(b"dump-ranks\n")
    proc.stdin.flush()
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while (not got or got[-1] not in (b"y 0 none", b"")) and time.monotonic() < deadline:
        got.append(proc.stdout.readline().rstrip(b"\n"))
    proc.stdin.write(b"term\n")
    proc.stdin.flush()
    finish(proc)
    answer = [r for r in got if r != b"h"]
    assert answer == [
        f"s 5 Process {by_rank[5]}: fake".encode(),
        b"w 5 py-spy",
        f"s 7 Process {by_rank[7]}: fake".encode(),
        b"w 7 py-spy",
        b"y 0 none",  # the daemon itself: no SIGUSR1 (the launcher decides), and no e lines
    ]


RANK_WAITS_FOR_USR2 = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
os.write(1, b"ready %s\\n" % sys.argv[1].encode())
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
os.write(1, b"%s %s\\n" % (b"got usr2" if got else b"no usr2", sys.argv[1].encode()))
"""
"""A rank: each line in one write (``print`` writes its pieces one by one where
``PYTHONUNBUFFERED`` is set, and the two ranks' pieces then interleave on the shared pipe)."""

HYDRA_LIKE_DAEMON = """
import subprocess, sys
wrap = ["/bin/sh", "-c", 'trap : USR1 USR2; "$@"', "poprun-rank", sys.executable, "-c"]
ranks = [subprocess.Popen([*wrap, sys.argv[1], str(r)], start_new_session=True) for r in (0, 1)]
sys.exit(max(r.wait() for r in ranks))
"""
"""A daemon as hydra's proxy starts ranks: each under its wrapper, in a session of its own;
the daemon itself dies of SIGUSR2 (the default)."""


def test_the_agent_signals_a_daemons_ranks_and_not_the_daemon() -> None:
    argv = [PY, "-c", HYDRA_LIKE_DAEMON, RANK_WAITS_FOR_USR2]
    proc = agent({"instances": [{"index": 0, "argv": argv, "env": {}, "cwd": None}]})
    assert proc.stdin is not None and proc.stdout is not None
    got: list[str] = []
    deadline = time.monotonic() + 10
    while sum(r.startswith("o 0 ready") for r in got) < 2 and time.monotonic() < deadline:
        got.append(proc.stdout.readline().decode().rstrip("\n"))
    proc.stdin.write(b"sigr 12\n")
    proc.stdin.flush()
    recs = got + records(finish(proc))
    assert {"o 0 got usr2 0", "o 0 got usr2 1", "x 0 0"} <= set(recs), recs


@pytest.mark.parametrize("how", ["stdin closed", "heartbeats stop"])
@pytest.mark.requires("pgrep")
def test_agent_stops_everything_when_poprun_is_gone(how: str) -> None:
    mark = marker()
    child = shlex.join(sleeper(mark))  # the mark is in every process's command line
    script = f"{child} & {child}; : {mark}"
    job = {
        "liveness": 1.0,
        "instances": [{"index": 0, "argv": ["sh", "-c", script, mark], "env": {}, "cwd": None}],
    }
    proc = agent(job)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"p 0 ")
        wait_sleepers(mark, 2)  # both 60 s sleepers of the sh run
        if how == "stdin closed":
            assert proc.stdin is not None
            proc.stdin.close()
        # every one of them ends, long before its 60 s: how soon is not asserted (a loaded
        # machine); the liveness deadline is 1 s
        wait_gone(mark, within=30.0)
        proc.wait(timeout=30)
        assert proc.returncode == 0
    finally:
        kill_marked(mark)


@pytest.mark.requires("pgrep")
def test_agent_term_then_kill_after_the_grace_period() -> None:
    mark = marker()
    stubborn = f"trap '' TERM; echo ready; while :; do sleep 0.05; done; : {mark}"
    job = {
        "grace": 0.5,
        "instances": [{"index": 1, "argv": ["sh", "-c", stubborn], "env": {}, "cwd": None}],
    }
    proc = agent(job)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().startswith(b"p 1 ")
    assert proc.stdout.readline() == b"o 1 ready\n"
    start = time.monotonic()
    proc.stdin.write(b"term\n")
    proc.stdin.flush()
    rest = records(proc.stdout.read())
    # not before the 0.5 s grace period; "< 30": killed, not never (generous: a loaded
    # 2-core machine, or one CPU)
    assert 0.4 < time.monotonic() - start < 30.0
    assert rest[-2:] == ["k 1 9", "d"]
    assert anywhere(mark) == []


@pytest.mark.requires("pgrep")
def test_agent_stops_what_a_finished_instance_left_behind() -> None:
    mark = marker()
    child = shlex.join(sleeper(mark))  # found by the mark in its command line, not by RUN_ID
    script = f"{child} & setsid {child} & echo started; : {mark}"
    job = {
        "grace": 1.0,
        "run_id": uuid.uuid4().hex,
        "instances": [{"index": 0, "argv": ["sh", "-c", script], "env": {}, "cwd": None}],
    }
    try:
        out = finish(agent(job))
        assert "o 0 started" in records(out) and records(out)[-2:] == ["x 0 0", "d"]
        wait_gone(mark, within=15.0)  # both sleepers (60 s each) were stopped
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("form", ["compiled", "other magic", "source only"])
def test_agent_starts_from_stdin_like_on_a_host(form: str) -> None:
    shipped = payload("agent")
    source = bundle("agent").encode()
    assert shipped.data.endswith(source) and b"import poprun_py" not in source
    assert b"from poprun_py" not in source  # the host has no poprun_py: binding is inlined
    if form == "compiled":  # the same magic: the compiled agent runs, the source is not used
        shipped = dataclasses.replace(shipped, source=b"#" * len(source))
    elif form == "other magic":  # a host whose Python cannot run our bytecode compiles the source
        shipped = dataclasses.replace(shipped, magic=b"\0\0\0\0")
    elif form == "source only":
        shipped = dataclasses.replace(shipped, code=b"")
    argv = over_stdin()
    job = {"instances": [{"index": 0, "argv": ["echo", "via bootstrap"], "env": {}, "cwd": None}]}
    case = binding_case()  # a CPU this process may use and a node it may allocate on
    job["instances"].append(  # the inlined binding code works in the shipped agent too
        {
            "index": 1,
            "argv": [PY, "-c", BINDING_PROBE],
            "env": {},
            "cpus": [case.first],
            "mems": [case.node],
        }
    )
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(shipped.data + b"job " + json.dumps(job).encode() + b"\n")
    proc.stdin.flush()
    recs = records(proc.stdout.read())
    proc.stdin.close()
    assert [r for r in recs if r.startswith(("o 0", "x 0"))] == ["o 0 via bootstrap", "x 0 0"]
    assert recs[-1] == "d"
    probe = json.loads(next(r for r in recs if r.startswith("o 1 "))[4:])
    want = {"cpus": str(case.first), "mems": case.mems, "policies": [f"bind:{case.node}"]}
    assert probe == want


def test_agent_binds_each_instance_to_its_cpus_and_nodes() -> None:
    case = binding_case()  # from this machine: its CPUs, nodes and cpuset
    probe = [PY, "-c", BINDING_PROBE]
    first = {"cpus": [case.first], "mems": [case.node]}
    second = {"cpus": [case.second], "mems": []}
    nowhere = case.spare + 1000  # no such CPU
    job = {
        "instances": [
            {"index": 0, "argv": probe, "env": {}, "cwd": None, **first},
            {"index": 1, "argv": probe, "env": {}, "cwd": None, **second},
            {"index": 2, "argv": probe, "env": {}, "cwd": None},
            {"index": 3, "argv": ["true"], "env": {}, "cwd": None, "cpus": [nowhere]},
        ]
    }
    recs = records(finish(agent(job)))
    seen = {int(r.split()[1]): json.loads(r.split(" ", 2)[2]) for r in recs if r[0] == "o"}
    assert seen[0] == {
        "cpus": str(case.first),
        "mems": case.mems,
        "policies": [f"bind:{case.node}"],
    }
    assert seen[1] == {"cpus": str(case.second), "mems": case.mems, "policies": ["default"]}
    unbound = {"cpus": format_cpulist(os.sched_getaffinity(0)), "mems": case.mems}
    assert seen[2] == {**unbound, "policies": ["default"]}  # the agent's own, as it was
    assert f"f 3 cannot start 'true': cannot bind to CPUs {nowhere}: Invalid argument" in recs


def test_agent_answers_run_requests_before_the_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "poprun_py.hostside.agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None
    requests = [
        {
            "id": 1,
            "argv": ["sh", "-c", "pwd; echo $X; echo oops >&2; exit 4"],
            "env": {"X": "1"},
            "cwd": str(tmp_path),
        },
        {"id": 2, "argv": ["sleep", "5"], "timeout": 0.2},
        {"id": 3, "argv": ["/no/such/tool"]},
    ]
    replies = []
    for request in requests:
        proc.stdin.write(b"run " + json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith(b"R ")
        replies.append(json.loads(line[2:]))
    assert replies[0] == {
        "id": 1,
        "timeout": False,
        "code": 4,
        "stdout": f"{tmp_path}\n1\n",
        "stderr": "oops\n",
    }
    assert (replies[1]["id"], replies[1]["timeout"]) == (2, True)
    assert (replies[2]["code"], "/no/such/tool" in replies[2]["stderr"]) == (127, True)
    job = {"instances": [{"index": 0, "argv": ["echo", "then the job"], "env": {}, "cwd": None}]}
    proc.stdin.write(b"job " + json.dumps(job).encode() + b"\n")
    proc.stdin.flush()
    assert records(finish(proc))[1:] == ["o 0 then the job", "x 0 0", "d"]


def test_agent_without_a_job_exits_when_stdin_closes() -> None:
    proc = subprocess.Popen([PY, "-m", "poprun_py.hostside.agent"], stdin=subprocess.PIPE, cwd=REPO)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=5) == 0


def test_agent_uses_the_run_id_variable_of_the_local_backend() -> None:
    assert remote_agent.RUN_ID_VAR == supervise.RUN_ID_VAR


# ---------------------------------------------------------------- real hosts

hosts = pytest.mark.hosts


@hosts
def test_instances_run_on_their_hosts_with_env_shards_and_logs(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    script = (
        'echo "$(hostname) $RANK $POPRUN_HOST_INDEX $LOCAL_RANK"; '
        'cat "$POPRUN_SHARD_FILE"; echo e$RANK >&2; : $0'
    )
    mark = marker()
    plan = plan_on(test_cluster_4, ["sh", "-c", script, mark], per_host=2)
    job = make_job(plan, str(tmp_path / "job"))
    job = _with_shards(job)
    result, lines = run_job(test_cluster_4, job, output_dir=tmp_path / "logs")
    assert result.ok and result.exit_code == 0
    names = test_cluster_4.host_names
    for inst in plan.instances:
        out = [line for i, s, line in lines if i == inst.index and s == "stdout"]
        assert out == [
            f"{names[inst.host_index]} {inst.index} {inst.host_index} {inst.local_index}",
            f"file-{inst.index}.rec",
        ]
        assert (inst.index, "stderr", f"e{inst.index}") in lines
        log = (tmp_path / "logs" / f"instance-{inst.index}.log").read_text().splitlines()
        assert sorted(log) == sorted([*out, f"e{inst.index}"])
    assert [(r.state, r.exit_code, r.host) for r in result.instances] == [
        ("exited", 0, inst.host) for inst in plan.instances
    ]
    assert_clean(test_cluster_4, mark)


@hosts
def test_instances_are_bound_on_their_hosts_without_numactl(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    case = binding_case()  # the test hosts are namespaces of this machine: its CPUs and nodes
    hosts = tuple(
        HostSpec(h.name, address=h.address, topology=case.topology) for h in test_cluster_4.hosts
    )
    spec = JobSpec((PY, "-c", BINDING_PROBE, mark), replicas=8, instances=8)
    plan = make_plan(ClusterSpec(name=test_cluster_4.name, hosts=hosts), spec)
    real = discover_local()  # the test hosts are namespaces of this machine
    available = {h.name: real for h in plan.hosts}
    job = render.render_job(plan, "ssh", job_dir=str(tmp_path / "job"), available=available)
    assert {c.argv[0] for c in job.instances} == {PY}  # no numactl anywhere
    result, lines = run_job(test_cluster_4, job)
    assert result.ok, lines
    seen = {i: json.loads(line) for i, s, line in lines if s == "stdout"}
    for inst in plan.instances:  # local 0: its CPU, memory on its node; local 1: its CPU only
        assert seen[inst.index] == case.probe(inst.local_index)
    assert_clean(test_cluster_4, mark)


def _with_shards(job: render.RenderedJob) -> render.RenderedJob:
    """The job with a one-line shard file per instance (``file-<index>.rec``)."""
    from dataclasses import replace

    commands = tuple(replace(c, shard_text=f"file-{c.index}.rec\n") for c in job.instances)
    return replace(job, instances=commands)


@hosts
def test_preflight_and_the_job_share_one_agent_session_per_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    from poprun_py.preflight.probes import preflight

    plan = plan_on(test_cluster_4, ["sh", "-c", "echo $PPID"])
    with ConnectionPool([h.spec for h in plan.hosts], settings_for(test_cluster_4)) as pool:
        agents = AgentPool(pool)
        report = preflight(agents, plan)  # type: ignore[arg-type]
        assert report.faults == () and None not in report.topologies.values()
        parents = values(agents.each(lambda a: a.run(["sh", "-c", "echo $PPID"]).stdout.strip()))
        lines: Lines = []
        sink = lambda i, s, line: lines.append((i, s, line))  # noqa: E731
        result = SshBackend(agents).run(
            make_job(plan, str(tmp_path / "job")), RunOptions(sink=sink)
        )
    assert result.ok
    assert sorted(lines) == sorted(
        (inst.index, "stdout", parents[inst.host]) for inst in plan.instances
    )


@hosts
def test_an_instance_that_ends_early_leaves_the_others_running(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    script = 'if [ "$RANK" != 0 ]; then sleep 1; fi; echo done $RANK'
    plan = plan_on(test_cluster_4, ["sh", "-c", script])
    lines: Lines = []
    options = RunOptions(sink=lambda i, s, line: lines.append((i, s, line)))
    job = make_job(plan, str(tmp_path / "job"))
    result = connect_and_run(job, options, settings_for(test_cluster_4))  # its own connections
    assert result.ok
    assert sorted(lines) == [(i, "stdout", f"done {i}") for i in range(4)]


@hosts
def test_secret_environment_never_appears_in_a_command_line(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    probe = (
        "import os, sys\n"
        "s = os.environ['API_TOKEN'].encode()\n"
        "hits = []\n"
        "for p in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try: cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "    except OSError: continue\n"
        "    if s in cmd: hits.append(p)\n"
        "print('hits', len(hits), len(s))\n"
    )
    plan = plan_on(
        test_cluster_4, [PY, "-c", probe], env=(EnvVar("API_TOKEN", secret, secret=True),)
    )
    result, lines = run_job(test_cluster_4, make_job(plan, str(tmp_path / "job")))
    assert result.ok
    assert sorted(line for _, _, line in lines) == [f"hits 0 {len(secret)}"] * 4


@hosts
def test_first_failure_stops_every_instance_on_every_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    script = 'if [ "$RANK" = 5 ]; then sleep 0.5; exit 3; fi; exec "$@"'
    plan = plan_on(test_cluster_4, ["sh", "-c", script, "sh", *sleeper(mark)], per_host=2)
    start = time.monotonic()
    result, _ = run_job(test_cluster_4, make_job(plan, str(tmp_path / "job")), grace_period=2.0)
    # at the first failure, not when the others' 60 s sleep ends: "< 30" is generous for a
    # loaded 2-core machine (or one CPU), with the 2 s grace period
    assert time.monotonic() - start < 30.0
    assert result.exit_code == 3
    root = result.root_cause
    assert root is not None and (root.index, root.state, root.exit_code) == (5, "exited", 3)
    others = [r for r in result.instances if r.index != 5]
    assert {(r.state, r.signal) for r in others} == {("stopped", signal.SIGTERM)}
    assert_clean(test_cluster_4, mark)


@hosts
def test_instance_ignoring_sigterm_gets_sigkill_after_the_grace_period(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    go = tmp_path / "go"  # test hosts share this machine's filesystem
    trapped = tmp_path / "trapped"
    trapped.mkdir()
    script = (
        f'if [ "$RANK" = 0 ]; then while [ ! -e {go} ]; do sleep 0.05; done; exit 1; fi; '
        f"trap '' TERM; touch {trapped}/$RANK; while :; do sleep 0.1; done; : {mark}"
    )
    plan = plan_on(test_cluster_4, ["sh", "-c", script])
    thread, box = run_in_thread(test_cluster_4, make_job(plan, str(tmp_path / "job")), grace=1.0)
    wait_marked(test_cluster_4, mark, 4)  # rank 0's script carries the mark too
    deadline = time.monotonic() + 30
    while len(list(trapped.iterdir())) < 3:  # ranks 1-3 have each run their `trap`
        assert time.monotonic() < deadline, sorted(p.name for p in trapped.iterdir())
        time.sleep(0.05)
    go.touch()
    start = time.monotonic()
    thread.join(timeout=40)
    # not before the 1 s grace period; "< 30": not never (generous: a loaded machine)
    assert 1.0 < float(box["at"]) - start < 30.0  # type: ignore[arg-type]
    result = box["result"]
    assert isinstance(result, LaunchResult)
    assert result.root_cause is not None and result.root_cause.index == 0
    assert {(r.state, r.signal) for r in result.instances[1:]} == {("stopped", signal.SIGKILL)}
    assert_clean(test_cluster_4, mark)


@hosts
def test_program_missing_on_a_host_is_the_root_cause(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    job = make_job(plan_on(test_cluster_4, sleeper(mark)), str(tmp_path / "job"))
    missing = dataclasses.replace(job.instances[2], argv=("/no/such/program", mark))
    job = dataclasses.replace(job, instances=(*job.instances[:2], missing, job.instances[3]))
    result, _ = run_job(test_cluster_4, job, grace_period=1.0)
    root = result.root_cause
    assert root is not None and (root.index, root.exit_code, root.state) == (2, 127, "exited")
    assert root.detail == "cannot start '/no/such/program': No such file or directory"
    assert [r.state for r in result.instances] == ["stopped", "stopped", "exited", "stopped"]
    assert_clean(test_cluster_4, mark)


# ---------------------------------------------------------------- poprun-py as its own process

DRIVER = """
import json, sys
from pathlib import Path
from poprun_py.core.result import RunOptions
from poprun_py.backends.ssh import SshBackend
from poprun_py.providers.netns import load_cluster
from tests.integration.test_ssh_backend import make_job, plan_on, settings_for
from poprun_py.ssh.pool import ConnectionPool

cluster = load_cluster(sys.argv[1])
plan = plan_on(cluster, json.loads(sys.argv[2]))
job = make_job(plan, sys.argv[3])
pool = ConnectionPool([h.spec for h in plan.hosts], settings_for(cluster))
pool.open_all()
print("started", flush=True)
result = SshBackend.over(pool).run(job, RunOptions(grace_period=1.0))
pool.close()
print(json.dumps({"interrupted": result.interrupted, "exit": result.exit_code,
                  "states": [r.state for r in result.instances]}), flush=True)
sys.exit(result.exit_code)
"""


def start_driver(cluster: TestCluster, program: list[str], job_dir: Path) -> subprocess.Popen[str]:
    """poprun-py's ssh backend in a process of its own, running ``program`` on every host."""
    argv = [PY, "-c", DRIVER, cluster.name, json.dumps(program), str(job_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    return proc


def wait_marked(
    cluster: TestCluster, mark: str, count: int, proc: subprocess.Popen[str] | None = None
) -> None:
    """Wait until ``count`` marked processes run on the hosts (poprun-py still running)."""
    deadline = time.monotonic() + 20.0
    while sum(map(len, marked(cluster, mark).values())) < count:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"poprun-py ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"only {marked(cluster, mark)} started"
        time.sleep(0.05)


@hosts
def test_ctrl_c_stops_every_host_and_reports_interrupted(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    proc = start_driver(test_cluster_4, sleeper(mark), tmp_path / "job")
    wait_marked(test_cluster_4, mark, 4, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 130
    assert json.loads(out) == {"interrupted": True, "exit": 130, "states": ["stopped"] * 4}
    assert_clean(test_cluster_4, mark)


@hosts
def test_sigkilled_poprun_leaves_nothing_running_on_any_host(
    test_cluster_4: TestCluster, tmp_path: Path
) -> None:
    mark = marker()
    proc = start_driver(test_cluster_4, sleeper(mark), tmp_path / "job")
    wait_marked(test_cluster_4, mark, 4, proc)
    proc.kill()
    proc.wait(timeout=5)
    # the agents stop their 60 s sleepers once poprun-py is gone (liveness): within 30 s is
    # proof enough, how soon is not asserted (a loaded machine)
    assert_clean(test_cluster_4, mark, within=30.0)


# ---------------------------------------------------------------- hosts that die


def without(cluster: TestCluster, host: str) -> TestCluster:
    """The cluster minus one host, for checks on the survivors."""
    return dataclasses.replace(cluster, hosts=tuple(h for h in cluster.hosts if h.name != host))


def run_in_thread(
    cluster: TestCluster, job: render.RenderedJob, grace: float = 1.0, host_timeout: float = 3.0
) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def target() -> None:  # a host silent for host_timeout (--host-timeout) is lost
        opts = {"grace_period": grace, "host_timeout": host_timeout}
        box["result"], box["lines"] = run_job(cluster, job, **opts)
        box["at"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def start_sleepers(
    cluster: TestCluster, tmp_path: Path, host_timeout: float = 3.0
) -> tuple[str, threading.Thread, dict[str, object]]:
    """A marked sleeper on each of the cluster's 4 hosts, run in a thread; all of them started."""
    mark = marker()
    job = make_job(plan_on(cluster, sleeper(mark)), str(tmp_path / "job"))
    thread, box = run_in_thread(cluster, job, host_timeout=host_timeout)
    wait_marked(cluster, mark, 4)
    return mark, thread, box


def joined(
    thread: threading.Thread, box: dict[str, object], within: float = 15.0
) -> tuple[LaunchResult, float]:
    """The run's result and when it ended, once its thread has ended (within ``within`` s)."""
    thread.join(timeout=within)
    assert not thread.is_alive()
    result = box["result"]
    assert isinstance(result, LaunchResult)
    return result, float(box["at"])  # type: ignore[arg-type]


@hosts
def test_host_off_the_network_is_the_root_cause_within_seconds(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(4, "ka")
    mark, thread, box = start_sleepers(cluster, tmp_path)
    victim = cluster.hosts[2]
    subprocess.run(
        ["ip", "netns", "exec", victim.netns, "ip", "link", "set", "eth0", "down"], check=True
    )
    cut = time.monotonic()
    result, ended = joined(thread, box)
    assert ended - cut < 5.0
    root = result.root_cause
    assert root is not None and (root.index, root.host, root.state) == (2, victim.name, "lost")
    assert victim.name in root.detail and "stopped answering" in root.detail
    assert [r.state for r in result.instances] == ["stopped", "stopped", "lost", "stopped"]
    assert_clean(without(cluster, victim.name), mark, everywhere=False)
    # cut off from poprun-py, the victim's agent stops its instances by itself
    deadline = time.monotonic() + 6.0
    while (marked(cluster, mark) or anywhere(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(cluster, mark) == {} and anywhere(mark) == []


@hosts
def test_host_whose_sshd_and_processes_die_is_lost_at_once(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(4, "kb")
    mark, thread, box = start_sleepers(cluster, tmp_path, host_timeout=60.0)
    victim = cluster.hosts[1]
    for pid in host_pids(victim.netns):
        with contextlib.suppress(ProcessLookupError):  # ended between the listing and now
            os.kill(pid, signal.SIGKILL)
    died = time.monotonic()
    result, ended = joined(thread, box, within=60.0)
    # at once: well before the 60 s host timeout, which would also find it (a bound generous
    # enough for a loaded machine)
    assert ended - died < 30.0
    root = result.root_cause
    assert root is not None and (root.host, root.state) == (victim.name, "lost")
    assert victim.name in root.detail
    assert_clean(without(cluster, victim.name), mark)
    assert marked(cluster, mark) == {}
