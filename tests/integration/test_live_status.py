"""The launch's live status as a person sees it (issue 22, items 1 and 6), through the real CLI
on the ssh test hosts, one of them slow (its sshd stopped for a few seconds, so that connecting
to it waits): under tmux at 80 columns the status line appears, names the slow host, and is
gone when the launch ends; with stderr piped, the same wait is told in plain lines without a
single control character. The restart delay counts down below the restart's own line, and is
gone after a Ctrl-C."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster, TestHost
from tests.hostfixtures import MakeCluster
from tests.integration.test_launch_hosts_cli import only_sshd, spec_for
from tests.tmux import Tmux

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # anything but \t and \n


def launch_argv(cluster: TestCluster, tmp_path: Path) -> list[str]:
    spec = spec_for(cluster, tmp_path)
    return [sys.executable, "-m", "poprun_py", "launch", "-c", str(spec), "-b", "ssh",
            "--connect-timeout", "60", "--", "true"]  # fmt: skip


class Stopped:
    """A host's sshd stopped (SIGSTOP) until :meth:`resume`: connecting to it waits."""

    def __init__(self, host: TestHost):
        self.pid = host.sshd_pid
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def slow_cluster(make_test_cluster: MakeCluster) -> Iterator[tuple[TestCluster, Stopped]]:
    cluster = make_test_cluster(3, "v")
    stopped = Stopped(cluster.hosts[2])
    try:
        yield cluster, stopped
    finally:
        stopped.resume()
    only_sshd(cluster)


@pytest.mark.hosts
@pytest.mark.requires("tmux")
def test_under_tmux_the_live_status_names_the_slow_host_and_is_gone_at_the_end(
    slow_cluster: tuple[TestCluster, Stopped], tmp_path: Path
) -> None:
    cluster, stopped = slow_cluster
    slow = cluster.hosts[2].name
    tmux = Tmux(tmp_path, rows=24, join=False)
    try:
        command = shlex.join(launch_argv(cluster, tmp_path))
        tmux.type(f"clear; {command}; echo launch-ended-$?")
        screen = tmux.wait_for(rf"connecting 2/3 hosts \S+ waiting for {slow} \(\d+ s\)")
        status = next(x for x in screen.splitlines() if "waiting for" in x)
        assert len(status) <= 80, status
        stopped.resume()
        screen = tmux.wait_for(r"launch-ended-\d+")
    finally:
        tmux.close()
    assert "launch-ended-0" in screen, screen
    assert not re.search(r"hosts|waiting for|restart", screen), screen  # the status is gone


@pytest.mark.hosts
def test_piped_the_wait_is_told_in_plain_lines_without_control_characters(
    slow_cluster: tuple[TestCluster, Stopped], tmp_path: Path
) -> None:
    cluster, stopped = slow_cluster
    slow = cluster.hosts[2].name
    proc = subprocess.Popen(
        launch_argv(cluster, tmp_path),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lasting = (
        rf"poprun-py: connecting, preflight: 2/3 hosts done after \d+\.\d s; waiting for {slow}\n"
    )
    try:
        assert proc.stderr is not None
        first = ""  # up to the plain line once preflight has waited 5 s (or the end)
        while (line := proc.stderr.readline()) and not re.fullmatch(lasting, line):
            first += line
        first += line
        stopped.resume()
        out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = first + rest
    assert proc.returncode == 0, err
    assert re.fullmatch(lasting, line), err
    assert re.search(r"poprun-py: connecting, preflight: 3/3 hosts done in \d+\.\d s\n", rest), err
    assert not CONTROL.search(err + out), repr(err)


@pytest.mark.requires("tmux")
def test_under_tmux_the_restart_delay_counts_down_below_the_restart_told(tmp_path: Path) -> None:
    go = tmp_path / "go"  # the first attempt fails; the second waits for it, then succeeds
    script = f'[ "$POPRUN_RESTART_COUNT" = 1 ] || exit 5; while [ ! -e {go} ]; do sleep 0.05; done'
    argv = [sys.executable, "-m", "poprun_py", "launch", "--hosts", "localhost",
            "--max-restarts", "1", "--restart-delay", "30", "--", "sh", "-c", script]  # fmt: skip
    tmux = Tmux(tmp_path, rows=24, join=False)
    try:
        tmux.type(f"clear; {shlex.join(argv)}; echo launch-ended-$?")
        screen = tmux.wait_for(r"restart 1 of 1 in (29|2\d) s")  # counting down from 30
        told = r"poprun-py: attempt 0 failed: instance 0 on localhost exited with code 5"
        assert re.search(told, screen), screen  # told as it happened, above the countdown
        countdown = [x for x in screen.splitlines() if "restart 1 of 1 in" in x]
        assert len(countdown) == 1 and not countdown[0].startswith("poprun-py"), screen
        tmux.run("send-keys", "-t", "t", "C-c")  # a stop during the delay: no attempt 1
        screen = tmux.wait_for(r"launch-ended-\d+")
    finally:
        go.touch()
        tmux.close()
    assert "launch-ended-130" in screen, screen
    assert "restart 1 of 1 in" not in screen, screen  # the countdown is gone
