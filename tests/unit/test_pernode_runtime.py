"""Per-node mode's runtime in one process (poprun_py/pernode/node.py, coordinator.py): node 0's
coordinator and launch, the other nodes' loops in threads, all over the loopback -- a plain
job, a restart, a wrong secret, a plan that differs, a node that never comes, a port in use,
no coordinator. The namespaces test (tests/integration/test_pernode.py) runs real launchers."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from poprun_py.backends.base import Backend
from poprun_py.core.result import LaunchResult, RunSettings
from poprun_py.errors import LaunchFailed, PreflightError, UsageError
from poprun_py.launch import launcher
from poprun_py.pernode import wire
from poprun_py.pernode.coordinator import Coordinator, PortInUse
from poprun_py.pernode.identity import NodeIdentity
from poprun_py.pernode.node import (
    CoordinatorUnreachable,
    JobFailed,
    launch_per_node,
    node_loop,
    per_node,
)
from poprun_py.prepare.job import LaunchOptions, Prepared, prepare

SECRET = b"a-shared-secret-of-24-by"
HOSTS = "n0,n1,n2"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prepared(program: Sequence[str], **more: Any) -> Prepared:
    return prepare(LaunchOptions(hosts=HOSTS, program=tuple(program), **more), dict(os.environ))


def node(rank: int, port: int) -> NodeIdentity:
    return NodeIdentity(rank, 3, "127.0.0.1", port, "--node-rank")


class Nodes:
    """Nodes 1 and 2 in threads; each one's outcome (None: exited 0, else the error)."""

    def __init__(self, port: int, preps: dict[int, Prepared], secrets: dict[int, bytes]):
        self.outcomes: dict[int, BaseException | None] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(k, port, preps[k], secrets[k]), daemon=True)
            for k in (1, 2)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, rank: int, port: int, prep: Prepared, secret: bytes) -> None:
        try:
            per_node(prep, node(rank, port), secret, 3.0, _never)
            self.outcomes[rank] = None
        except Exception as exc:  # reported to the test
            self.outcomes[rank] = exc

    def join(self) -> dict[int, BaseException | None]:
        for thread in self.threads:
            thread.join(30)
        return self.outcomes


def _never(prep: Prepared, backend: Backend) -> None:
    raise AssertionError("only node 0 launches")


def run_job(
    prep: Prepared,
    others: dict[int, Prepared] | None = None,
    secrets: dict[int, bytes] | None = None,
    join_timeout: float = 3.0,
) -> tuple[LaunchResult | BaseException, dict[int, BaseException | None]]:
    port = free_port()
    nodes = Nodes(
        port, {1: prep, 2: prep, **(others or {})}, {1: SECRET, 2: SECRET, **(secrets or {})}
    )
    got: dict[str, LaunchResult] = {}

    def launch(p: Prepared, backend: Backend) -> None:
        got["result"] = launcher.launch(p, RunSettings(), backend=backend)
        if not got["result"].ok:  # as the CLI's launch does: the nodes exit with the code
            raise LaunchFailed("the job failed", got["result"].exit_code)

    try:
        per_node(prep, node(0, port), SECRET, join_timeout, launch)
    except LaunchFailed:
        return got["result"], nodes.join()
    except Exception as exc:  # the coordinator's own failure
        return exc, nodes.join()
    return got["result"], nodes.join()


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    # the node threads have ended: no agent is left relaying (their processes are waited on)
    assert not [t for t in set(threading.enumerate()) - before if t.name == "poprun-relay"]


def test_a_plain_job_runs_on_every_node_with_the_ssh_backends_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    prep = prepared(["sh", "-c", 'echo "rank=$RANK of $WORLD_SIZE $POPRUN_INSTANCE_INDEX"'])
    result, nodes = run_job(prep)
    assert isinstance(result, LaunchResult) and result.ok
    assert nodes == {1: None, 2: None}
    out = capsys.readouterr().out
    assert {f"rank={k} of 3" for k in range(3)} <= {
        line.split("] ")[1][:11] for line in out.splitlines() if "] rank=" in line
    }


def test_a_failure_is_every_nodes_exit_code_and_a_restart_follows() -> None:
    prep = prepared(
        ["sh", "-c", '[ "$RANK" = 1 ] && [ "$POPRUN_RESTART_COUNT" = 0 ] && exit 7; exit 0'],
        max_restarts=1,
    )
    result, nodes = run_job(prep)
    assert isinstance(result, LaunchResult)
    assert result.ok and len(result.attempts) >= 1  # attempt 0 failed (rank 1: exit 7), 1 ran
    assert nodes == {1: None, 2: None}


def test_a_failed_job_ends_every_node_with_its_code() -> None:
    result, nodes = run_job(prepared(["sh", "-c", '[ "$RANK" = 2 ] && exit 5; sleep 30']))
    assert isinstance(result, LaunchResult) and not result.ok and result.exit_code == 5
    assert all(isinstance(e, JobFailed) and e.exit_code == 5 for e in nodes.values())


def test_a_wrong_secret_is_refused_and_the_node_never_joins() -> None:
    result, nodes = run_job(
        prepared(["true"]), secrets={2: b"not-the-same-secret!"}, join_timeout=1.5
    )
    assert isinstance(result, PreflightError)
    assert [(f.host, f.check) for f in result.faults] == [("n2", "join")]
    assert "node 2 (n2) has not joined within 1.5 s" in result.faults[0].detail
    assert "refused" in result.faults[0].detail
    assert isinstance(nodes[2], wire.Refused) and "shared secret" in str(nodes[2])
    assert isinstance(nodes[1], JobFailed) and nodes[1].exit_code == 3


def test_a_plan_that_differs_is_a_fault_naming_the_node() -> None:
    other = prepared(["false"])
    result, nodes = run_job(prepared(["true"]), others={1: other})
    assert isinstance(result, PreflightError)
    assert [(f.host, f.check) for f in result.faults] == [("n1", "plan")]
    assert "node 1 (n1) made a different plan" in result.faults[0].detail
    assert isinstance(nodes[1], wire.Refused) and "plan differs" in str(nodes[1])


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse, match=f"cannot listen on port {port}: in use"):
            Coordinator(["n0"], SECRET, "d", port, 1.0)


def test_no_coordinator_is_one_line_exit_3() -> None:
    with pytest.raises(CoordinatorUnreachable) as caught:
        per_node(prepared(["true"]), node(1, free_port()), SECRET, 0.5, _never)
    assert caught.value.exit_code == 3
    assert "node 1 cannot reach the coordinator at 127.0.0.1:" in str(caught.value)


def test_a_stranger_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with Coordinator(["n0"], SECRET, "d", 0, 1.0) as coordinator:
        with socket.create_connection(("127.0.0.1", coordinator.port)) as stranger:
            stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert stranger.recv(100) == b""  # closed on it
        assert coordinator.refused and "not a poprun-py node" in coordinator.refused[0]
    assert "refused a connection from 127.0.0.1" in caplog.text


def test_what_per_node_mode_cannot_do_is_refused_in_one_line() -> None:
    prep = prepared(["true"], node_rank=1, nnodes=3, coordinator="127.0.0.1:9")
    with pytest.raises(UsageError, match="--sync is not available"):
        launch_per_node(prep, _never, sync=True, environ={"POPRUN_SECRET": SECRET.decode()})


def test_the_identity_and_secret_come_from_the_environment() -> None:
    prep = prepared(["true"], per_node=True, join_timeout=0.3)
    env = {
        "PET_NODE_RANK": "2",
        "PET_NNODES": "3",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
        "POPRUN_SECRET": SECRET.decode(),
    }
    with pytest.raises(CoordinatorUnreachable, match="node 2 cannot reach the coordinator"):
        launch_per_node(prep, _never, environ=env)
    with pytest.raises(UsageError, match="secret"):
        launch_per_node(prep, _never, environ={k: v for k, v in env.items() if "SECRET" not in k})


def test_check_runs_over_the_joined_nodes_and_node_0_prints_the_table() -> None:
    import io

    from poprun_py.cli import launch_cmd

    port, hosts = free_port(), "127.0.0.1,127.0.0.2,127.0.0.3"  # all this machine's loopback
    prep = prepare(LaunchOptions(hosts=hosts, program=("true",)), dict(os.environ))
    nodes = Nodes(port, {1: prep, 2: prep}, {1: SECRET, 2: SECRET})
    opts = LaunchOptions(hosts=hosts, program=("true",), node_rank=0, nnodes=3)
    here = prepare(replace(opts, coordinator=f"127.0.0.1:{port}"), dict(os.environ))
    table = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POPRUN_SECRET", SECRET.decode())
        try:
            launch_cmd._check(here, 20.0, False, table, "table")
            code = 0
        except PreflightError as exc:  # a slow loopback may fail a threshold: still checked
            code = exc.exit_code
    rows = table.getvalue().splitlines()
    assert [row.split()[0] for row in rows[1:4]] == hosts.split(","), rows
    outcomes = nodes.join()
    assert all(e is None if code == 0 else e.exit_code == code for e in outcomes.values())


def test_a_node_told_done_is_not_joined_again_but_dials_on_for_the_next_round() -> None:
    """launch --check --detach: a node told ``done`` by the check's coordinator dials the next
    round's; while the check's still listens it gets no answer (no refusal) and tries again."""
    with Coordinator(["n0", "n1"], SECRET, "d", 0, 5.0) as coordinator:
        coordinator.finished.add(1)
        late = NodeIdentity(1, 2, "127.0.0.1", coordinator.port, "--node-rank")
        with pytest.raises(CoordinatorUnreachable, match="the connection closed"):
            node_loop(late, SECRET, "d", 0.5, 5.0)
        assert 1 not in coordinator.seen and not coordinator.refused


def test_a_rank_outside_the_job_is_refused() -> None:
    with Coordinator(["n0", "n1"], SECRET, "d", 0, 1.0) as coordinator:
        stranger = NodeIdentity(5, 6, "127.0.0.1", coordinator.port, "--node-rank")
        with pytest.raises(wire.Refused, match="rank 5 is not one of this job's nodes 0-1"):
            per_node_loop(stranger)
        assert "node 5: rank 5" in coordinator.refused[-1]


def per_node_loop(node: NodeIdentity) -> object:
    from poprun_py.pernode.node import node_loop

    return node_loop(node, SECRET, "d", 2.0, 5.0)


@pytest.mark.parametrize(
    "flags",
    [
        ["--check", "--sync"],
        ["--check", "--spare-hosts", "n1"],
        ["--check", "--detach", "--spare-hosts", "n1"],
        ["--detach", "--sync"],
        ["--detach", "--spare-hosts", "n1"],
    ],
    ids=["check-sync", "check-spares", "check-detach-spares", "detach-sync", "detach-spares"],
)
def test_the_cli_refuses_what_per_node_launch_cannot_do(
    flags: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from poprun_py.cli import run

    monkeypatch.setenv("POPRUN_SECRET", SECRET.decode())
    identity = ["--node-rank", "0", "--nnodes", "1", "--coordinator", "127.0.0.1:9"]
    code = run(["launch", *identity, *flags, "--hosts", "n0", "--", "true"])
    flag = flags[-1] if flags[-1].startswith("--") else flags[-2]
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"{flag} is not available in per-node mode" in err[0]
