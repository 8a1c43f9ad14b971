"""Signals never reach a process that merely reuses a pid (issue 20, item 3).

A pid (or a process group id) taken over by an unrelated process cannot be forced in a test, so
these tests work at the seam: the identity check refuses a real live process whose recorded
start time differs; the host agent and the local sweep, shown a process table in which a
reaped instance's number now leads an unrelated group, never signal the reaped pid or that
group (os.kill/os.killpg/pidfd_send_signal spied on); and the sweep forgets reaped roots.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from poprun_py.backends.base import RunOptions
from poprun_py.hostside import agent as agent_host
from poprun_py.hostside import identity
from poprun_py.process import proctree, supervise
from poprun_py.process.output import Output


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A live process unrelated to anything under test, in a session of its own."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def spy(monkeypatch: pytest.MonkeyPatch, deliver: bool) -> list[tuple[str, int, int]]:
    """Record every os.kill, os.killpg and signal.pidfd_send_signal (the pidfd's process);
    pass them on when ``deliver``."""
    sent: list[tuple[str, int, int]] = []

    def wrap(name: str, real: Callable[..., Any], who: Callable[[int], int]) -> Callable[..., Any]:
        def call(target: int, sig: int, *rest: Any) -> Any:
            sent.append((name, who(target), sig))
            return real(target, sig, *rest) if deliver else None

        return call

    monkeypatch.setattr(os, "kill", wrap("kill", os.kill, lambda p: p))
    monkeypatch.setattr(os, "killpg", wrap("killpg", os.killpg, lambda p: p))
    if hasattr(signal, "pidfd_send_signal"):
        real = signal.pidfd_send_signal
        monkeypatch.setattr(signal, "pidfd_send_signal", wrap("pidfd", real, _pidfd_pid))
    return sent


def _pidfd_pid(fd: int) -> int:
    for line in open(f"/proc/self/fdinfo/{fd}").read().splitlines():  # noqa: SIM115
        if line.startswith("Pid:"):
            return int(line.split()[1])
    return -1


def after(tick: int) -> None:
    """Wait (bounded) until the clock /proc counts start times in has passed ``tick``."""
    deadline = time.monotonic() + 5
    while (identity.boot_ticks() or 0) <= tick:
        assert time.monotonic() < deadline
        time.sleep(0.002)


# ---------------------------------------------------------------- the identity check


@pytest.mark.parametrize("pidfds", [True, False])
def test_a_pid_whose_start_time_differs_is_not_signalled(
    stranger: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    if not pidfds:  # Python 3.7/3.8 or an old kernel: checked, then kill
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    me = identity.identify(stranger.pid)
    assert me is not None and identity.same(me)
    other = (stranger.pid, me[1] - 1)  # what we saw was another process with this pid
    assert not identity.same(other)
    assert identity.signal_same(other, signal.SIGKILL) is False
    assert stranger.poll() is None  # untouched
    assert identity.signal_same(me, signal.SIGKILL) is True
    assert stranger.wait(timeout=10) == -signal.SIGKILL
    assert identity.signal_same(me, signal.SIGKILL) is False  # reaped: never again


def test_a_reaped_leaders_group_is_ours_only_through_members_started_by_the_reap() -> None:
    table = {11: (1, 10, 10, 500, "S"), 12: (1, 20, 20, 700, "S")}
    assert identity.ours(10, 600, table) and identity.ours(10, 600, table, session=True)
    assert not identity.ours(20, 600, table)  # group 20 began after the reap: another's
    assert identity.owned([30], {10: 600, 20: 600}, table) == ({10, 30}, {10, 30})
    assert identity.leads(10, 600, table) and not identity.leads(20, 600, table)


# ---------------------------------------------------------------- the host agent


def reaped_agent() -> tuple[agent_host.Agent, int, int]:
    """An agent whose one instance has exited and been reaped: (agent, its pid, reap tick)."""
    read_fd, write_fd = os.pipe()
    agent = agent_host.Agent({"instances": []}, b"", in_fd=read_fd, out_fd=write_fd)
    agent.spawn({"index": 0, "argv": ["true"], "env": {}, "cwd": None})
    deadline = time.monotonic() + 10
    while not agent.instances[0].reported:
        assert time.monotonic() < deadline
        agent.reap()
        time.sleep(0.005)
    inst = agent.instances[0]
    reaped_at = getattr(inst, "reaped_at", None) or identity.boot_ticks()  # (pre-fix: none)
    assert reaped_at is not None
    return agent, inst.proc.pid, reaped_at


def test_the_agent_never_signals_a_reaped_instance_nor_a_group_that_took_its_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent, pid, reaped_at = reaped_agent()
    after(reaped_at)
    late = subprocess.Popen(["sleep", "60"], start_new_session=True)  # started after the reap
    try:
        real = identity.proc_table

        def table() -> dict[int, identity.Stat]:
            rows = dict(real())
            ppid, _, _, start, state = rows[late.pid]
            rows[late.pid] = (ppid, pid, pid, start, state)  # its group took the reaped number
            return rows

        monkeypatch.setattr(identity, "proc_table", table)
        sent = spy(monkeypatch, deliver=False)
        agent.signal_all(signal.SIGKILL)
        agent.signal_all(signal.SIGTERM)
        assert not [s for s in sent if s[1] in (pid, late.pid)], sent
    finally:
        monkeypatch.undo()
        late.kill()
        late.wait()


def test_the_agent_still_stops_what_a_reaped_instance_left_in_its_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_fd, write_fd = os.pipe()
    agent = agent_host.Agent({"instances": []}, b"", in_fd=read_fd, out_fd=write_fd)
    script = "sleep 60 & echo $!; exit 0"
    agent.spawn({"index": 0, "argv": ["sh", "-c", script], "env": {}, "cwd": None})
    inst = agent.instances[0]
    deadline = time.monotonic() + 10
    while not inst.reported:
        assert time.monotonic() < deadline
        agent.reap()
        time.sleep(0.005)
    assert inst.proc.stdout is not None
    left = int(inst.proc.stdout.readline())  # the sleep, in the instance's group
    sent = spy(monkeypatch, deliver=True)
    agent.signal_all(signal.SIGKILL)
    assert ("killpg", inst.proc.pid, signal.SIGKILL) not in sent  # reaped: no group signal
    assert any(s[1] == left and s[2] == signal.SIGKILL for s in sent), sent
    deadline = time.monotonic() + 10
    while proctree.alive({left}):
        assert time.monotonic() < deadline
        time.sleep(0.01)


# ---------------------------------------------------------------- the local sweep


def test_the_sweep_never_signals_a_reaped_root_nor_a_group_that_took_its_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    late: list[subprocess.Popen[bytes]] = []
    roots: list[int] = []
    real = proctree.proc_table

    def table() -> dict[int, proctree.ProcStat]:
        if not late:  # the first look, once the child was reaped: a stranger takes its number
            after(identity.boot_ticks() or 0)
            late.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        rows = dict(real())
        stat = rows.get(late[0].pid)
        if stat is not None:  # its group and session took the reaped number; no child of ours
            rows[late[0].pid] = (1, roots[0], roots[0], stat[3], stat[4])
        return rows

    for module in (proctree, supervise):
        monkeypatch.setattr(module, "proc_table", table, raising=False)
    monkeypatch.setattr(supervise, "no_children", lambda: False)  # sweep, leftovers or not
    out = Output(RunOptions(sink=lambda i, s, line: None), {0: "h1"})
    control = supervise.Control(policy=None)
    run = supervise.Supervision(out, 1.0, None, None, control)
    try:
        run.start([supervise.Child(0, "h1", ("true",))])
        roots.extend(run.live)  # not reaped before wait()
        sent = spy(monkeypatch, deliver=True)
        assert run.wait().exits[0].returncode == 0
        assert late and late[0].poll() is None  # the sweep looked, and left it alone
        assert not [s for s in sent if s[1] in (roots[0], late[0].pid)], sent
        assert run.roots == set() and run.reaped == {}  # its group is over: forgotten
    finally:
        monkeypatch.undo()
        control.close()
        for proc in late:
            proc.kill()
            proc.wait()


def test_leftovers_skip_a_reaped_pid_and_a_group_that_took_its_number() -> None:
    me = os.getpid()
    table = {
        4242: (1, 4242, 4242, 900, "S"),  # the reaped root's pid, now another process's
        4243: (4242, 4242, 4242, 901, "S"),  # its child, in its group
        5000: (me, 5000, 5000, 100, "S"),  # a child of ours (adopted): ours
        6000: (1, 6001, 4243, 400, "S"),  # in the session of pid 4243: not a root
    }
    found = identity.belonging(set(), {4242: 800}, b"POPRUN_RUN_ID=x", table=table, adopted=True)
    assert set(found) == {5000}
    table[4244] = (1, 4242, 4242, 700, "S")  # a member from before the reap: still ours
    found = identity.belonging(set(), {4242: 800}, b"POPRUN_RUN_ID=x", table=table, adopted=True)
    assert set(found) == {4242, 4243, 4244, 5000}


def test_the_agent_ships_the_identity_module() -> None:
    from poprun_py.hostside.bundle import bundle

    source = bundle("agent").encode()
    assert b"def signal_same(" in source and b"from poprun_py" not in source
