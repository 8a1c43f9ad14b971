"""The agent protocol over the transport seam (poprun_py/agent/stream.py), on the fake stream of
poprun_py/testing/streams.py: records split anywhere, requests answered out of order, heartbeats
both ways, silence, loss, and a host gone mid-record -- with the real agent on the far end where
one is needed (a subprocess behind the fake). Short timings; every wait polls to a deadline."""

from __future__ import annotations

import json
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from poprun_py.agent.client import AgentConnection, AgentLink, Timing, agent_header
from poprun_py.backends.ssh import SshBackend
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.result import InstanceState, LaunchResult, RunOptions
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.hostside import protocol as P
from poprun_py.render.job import render_job
from poprun_py.ssh.errors import ConnectionLost, RemoteTimeout
from poprun_py.ssh.hostresult import HostResult
from poprun_py.testing.streams import AgentBehind, FakeStream

FAST = Timing(grace=0.5, heartbeat=0.05, liveness=0.5, start_timeout=5.0)
SLEEPER = {"index": 0, "argv": ["sleep", "30"], "env": {}, "cwd": None}


@pytest.fixture
def behind() -> Iterator[AgentBehind]:
    """The real agent behind a fake stream, ended with the test."""
    agent = AgentBehind()
    try:
        yield agent
    finally:
        agent.close()


def job_link(stream: Any, timing: Timing = FAST) -> AgentLink:
    """A link to host h1's agent over ``stream``, given a job of one long sleep."""
    link = AgentLink("h1", (0,))
    header = agent_header(uuid.uuid4().hex, "h1", timing, [SLEEPER], [])
    link.start(AgentConnection("h1", stream), header)
    return link


def listen(
    link: AgentLink, until: Callable[[list[bytes]], bool], within: float
) -> tuple[list[bytes], bool]:
    """Records from ``link``, with heartbeats to it meanwhile, until ``until`` holds of them
    or the stream ends (and whether it did); fails after ``within`` seconds."""
    assert link.agent is not None
    got: list[bytes] = []
    ended = False
    deadline = time.monotonic() + within
    while not until(got) and not ended:
        assert time.monotonic() < deadline, f"not seen within {within} s: {got[-5:]}"
        select.select([link.agent.stream], [], [], FAST.heartbeat)
        records, ended = link.receive()
        got += records
        link.send(P.HEARTBEAT_LINE)
    return got, ended


def heard(link: AgentLink, kind: bytes, within: float = 10.0) -> list[bytes]:
    """Records from ``link`` until one of ``kind``; fails if the stream ends first."""
    records = listen(link, lambda got: kind in kinds(got), within)[0]
    assert kind in kinds(records), f"ended first: {records[-5:]} {link.why_lost()}"
    return records


def gone(pid: int, within: float = 10.0) -> bool:
    """True once process ``pid`` has ended (a zombie counts), within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def kinds(records: list[bytes]) -> list[bytes]:
    return [P.parse(r)[0] for r in records]


# ---------------------------------------------------------------- the fake peer alone


def test_records_split_at_any_byte_are_reassembled() -> None:
    stream = FakeStream()
    link = job_link(stream)
    job = stream.peer.read_line(1.0)
    assert job is not None and json.loads(job.partition(b" ")[2])["instances"] == [SLEEPER]
    message = b"p 0 4242\no 0 hello world\nh\n"
    for cut in range(len(message) + 1):
        stream.peer.deliver(message[:cut])
        first, ended = link.receive()
        stream.peer.deliver(message[cut:])
        second, ended_too = link.receive()
        assert first + second == [b"p 0 4242", b"o 0 hello world", b"h"], cut
        assert not ended and not ended_too
    for byte in message:  # one byte a read
        stream.peer.deliver(bytes([byte]))
    assert link.receive()[0] == [b"p 0 4242", b"o 0 hello world", b"h"]


def test_replies_are_matched_to_their_requests_whatever_the_order() -> None:
    stream = FakeStream()
    agent, peer = AgentConnection("h1", stream), stream.peer
    with pytest.raises(RemoteTimeout):  # request 1 is never answered in time
        agent.put([{"path": "/one", "text": ""}], timeout=0.1)
    first = peer.read_line(1.0)
    assert first is not None and json.loads(first[4:])["id"] == 1
    answers: list[str] = []
    asking = threading.Thread(target=lambda: answers.append(agent.put([], timeout=5.0)))
    asking.start()
    second = peer.read_line(5.0)
    assert second is not None and second.startswith(P.REQUEST_PUT + b" ")
    assert json.loads(second[4:])["id"] == 2
    late = b'R {"id": 1, "error": "the first"}\n'
    peer.deliver(late[:9])  # the late reply to request 1, in pieces, before request 2's
    peer.deliver(late[9:] + b"R {garbled\n" + b'R {"id": 2, "error": "the second"}\n')
    asking.join(5.0)
    assert answers == ["the second"]
    peer.deliver(b'R {"id": 3, "code": 0, "stdout": "x", "stderr": "", "timeout": false}\n')
    assert agent.run(["true"], timeout=5.0).stdout == "x"  # request 3's reply, already there


def test_a_reply_cut_short_is_a_lost_connection_not_a_hang() -> None:
    stream = FakeStream()
    agent = AgentConnection("h1", stream)
    stream.peer.deliver(b'R {"id": 1, "co')
    stream.peer.hang_up()
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match="the connection to host h1 closed"):
        agent.run(["true"])  # no timeout: only the stream's end can end the wait
    assert time.monotonic() - started < 2.0
    assert agent.exited()


def test_a_peer_that_vanishes_is_reported_with_its_last_words() -> None:
    stream = FakeStream()
    link = job_link(stream)
    stream.peer.deliver(b"p 0 7\no 0 half a li")
    stream.peer.complain(b"Connection to h1 closed by remote host.\n")
    stream.peer.vanish()
    link.send(P.HEARTBEAT_LINE)  # a dead stream: silence or its end, never an error here
    records, ended = link.receive()
    assert records == [b"p 0 7"] and ended
    assert link.why_lost() == "the agent on host h1 ended: Connection to h1 closed by remote host."
    with pytest.raises(OSError):
        AgentConnection("h1", stream).send(P.HEARTBEAT_LINE)


# ---------------------------------------------------------------- the real agent behind it


def test_the_real_agent_answers_requests_byte_by_byte(behind: AgentBehind, tmp_path: Path) -> None:
    behind.down.chunk = 1  # every byte of its replies written alone
    agent = AgentConnection("h1", behind.stream)
    result = agent.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10.0)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    target = tmp_path / "staged"
    assert agent.put([{"path": str(target), "text": "job file"}]) == ""
    assert target.read_text() == "job file"
    assert behind.down.passed > len(result.stdout)


def test_heartbeats_both_ways_keep_a_quiet_host_alive(behind: AgentBehind) -> None:
    link = job_link(behind.stream)
    records = heard(link, P.STARTED)
    quiet_until = time.monotonic() + 4 * FAST.liveness  # a silent instance, but heartbeats
    loudest = 0.0
    while time.monotonic() < quiet_until:
        records += heard(link, P.HEARTBEAT_LINE, within=FAST.liveness)
        loudest = max(loudest, link.silence(time.monotonic()))
    assert loudest < FAST.liveness
    assert kinds(records).count(P.HEARTBEAT_LINE) >= 10
    assert not {P.EXITED, P.KILLED, P.DONE} & set(kinds(records))  # it heard ours too
    link.send(P.TERM_LINE)
    assert b"k 0 15" in heard(link, P.DONE)


def test_an_agent_that_stops_hearing_poprun_stops_its_job(behind: AgentBehind) -> None:
    link = job_link(behind.stream)
    pid = int(P.parse(heard(link, P.STARTED)[-1])[2])
    behind.up.drop()  # poprun-py's heartbeats are lost on the way
    lost_at = time.monotonic()
    ended = listen(link, lambda got: False, within=10.0)[1]
    assert ended and behind.proc.wait(5.0) == 0  # cut off: it stopped its job and exited
    assert time.monotonic() - lost_at >= FAST.liveness and gone(pid)


# ---------------------------------------------------------------- the ssh backend over it


class StreamAgents:
    """Stands in for an AgentPool (and its ConnectionPool): each host's real agent behind a
    fake stream."""

    def __init__(self, hosts: list[str]) -> None:
        self.behind = {host: AgentBehind() for host in hosts}
        self.pool = self

    def open_all(self) -> None:
        """Every host is reachable."""

    def each(
        self, fn: Callable[[AgentConnection], Any], hosts: list[str], *, connect: bool = False
    ) -> dict[str, HostResult[Any]]:
        results: dict[str, HostResult[Any]] = {}
        for host in hosts:
            try:
                results[host] = HostResult(fn(AgentConnection(host, self.behind[host].stream)))
            except Exception as exc:
                results[host] = HostResult(fault=exc)
        return results

    def close(self) -> None:
        for behind in self.behind.values():
            behind.close()


def run_two_hosts(
    tmp_path: Path, on_up: Callable[[StreamAgents], None]
) -> tuple[LaunchResult, float]:
    """A job of two instances (h1, h2) that say "up" and sleep; ``on_up`` runs when h2's says
    it. The result, and how long the run took."""
    cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    program = ("sh", "-c", "echo up; exec sleep 30")
    plan = make_plan(cluster, JobSpec(program, replicas=2, instances=2))
    job = render_job(plan, "ssh", job_dir=str(tmp_path / "job"))
    agents = StreamAgents(["h1", "h2"])

    def sink(index: int, stream: str, line: str) -> None:
        if (index, line) == (1, "up"):
            on_up(agents)

    backend = SshBackend(agents, heartbeat=FAST.heartbeat, liveness=FAST.liveness)  # type: ignore[arg-type]
    started = time.monotonic()
    try:
        result = backend.run(job, RunOptions(grace_period=FAST.grace, sink=sink))
    finally:
        agents.close()
    return result, time.monotonic() - started


def test_a_silent_host_is_lost_after_the_host_timeout(tmp_path: Path) -> None:
    result, took = run_two_hosts(tmp_path, lambda agents: agents.behind["h2"].down.hold())
    lost, stopped = result.instances[1], result.instances[0]
    assert lost.state == InstanceState.LOST and "h2 stopped answering" in lost.detail
    assert stopped.state == InstanceState.STOPPED and result.root_cause == lost
    assert FAST.liveness <= took < 15.0


def test_a_host_gone_mid_record_is_lost_with_its_last_words(tmp_path: Path) -> None:
    def cut(agents: StreamAgents) -> None:
        behind = agents.behind["h2"]
        behind.down.hold()
        behind.stream.peer.deliver(b"o 1 half a li")
        behind.stream.peer.hang_up("Connection reset by peer")

    result, took = run_two_hosts(tmp_path, cut)
    lost = result.instances[1]
    assert lost.state == InstanceState.LOST and result.root_cause == lost
    assert lost.detail == "the agent on host h2 ended: Connection reset by peer"
    assert result.instances[0].state == InstanceState.STOPPED
    assert took < 15.0


def test_an_agent_started_here_has_its_start_beside_its_first_requests_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow start (a login on a loaded host; through a tree's gateway an ssh handshake too)
    is not the first request's time: it has START_TIMEOUT more until the agent says a word."""
    import poprun_py.agent.client as client

    monkeypatch.setattr(client, "START_TIMEOUT", 3.0)
    stream = FakeStream()

    class Conn:
        name = "h1"

        def agent_stream(self, argv: list[str]) -> FakeStream:
            return stream

        def agent_failure(self, stream: FakeStream) -> None:
            return None

        def send_program(self, stream: FakeStream, entry: str) -> None:
            stream.write(b"")

    agent = AgentConnection.start(Conn())  # type: ignore[arg-type]
    answer = b'R {"id": 1, "error": ""}\n'
    threading.Timer(0.6, stream.peer.deliver, args=(answer,)).start()
    assert agent.put([], timeout=0.2) == ""  # answered 0.6 s in: its start's allowance
    with pytest.raises(RemoteTimeout):  # once it has spoken, a request has its own time only
        agent.put([], timeout=0.2)
