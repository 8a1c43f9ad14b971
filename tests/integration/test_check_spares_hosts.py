"""Bad hosts swapped before they cost a run, on real test hosts (network namespaces with sshd, a
management and a data network): ``launch --check --spare-hosts`` with a planned host whose data
link is down (the check finds it: it cannot reach MASTER_ADDR) and a spare whose link is down
too: the bad spare is not used, the good one takes the bad host's place, the job runs on the
replaced set, and the summary and ``plan-check.json`` say which host replaced which and why.
With --check a spare passes the same check before it replaces a host lost mid-run. The same
with ``--detach``: the client's check swaps, the supervisor runs the replaced set and checks a
spare before a restart. Afterwards nothing but sshd runs on any host."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.launch.launcher import JOBS_ROOT
from poprun_py.providers import netns_data
from poprun_py.providers.netns import TestCluster
from tests.hostfixtures import MakeCluster
from tests.integration.test_launch_hosts_cli import only_sshd, poprun, spec_for
from tests.integration.test_long_run_hosts import cut, started, stopped_at_the_end

pytestmark = pytest.mark.hosts

SHOW = 'echo "ran $RANK on $POPRUN_HOST_NAME"'


def data_link(cluster: TestCluster, index: int, up: bool) -> None:
    def run(argv: list[str]) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout

    netns_data.set_data_link(run, cluster.hosts[index].netns, index, up=up)


@pytest.fixture
def cluster(make_test_cluster: MakeCluster) -> Iterator[TestCluster]:
    """Four hosts with a data network: 0 and 1 planned, 2 and 3 the spares."""
    made = make_test_cluster(4, "cs", data_network=True)
    yield made
    for k in range(4):
        data_link(made, k, up=True)
        cut(made, k, up=True)


def check_args(cluster: TestCluster, spec: Path, *more: str, backend: str = "ssh") -> list[str]:
    assert cluster.data_subnet is not None
    return [
        "launch", "-c", str(spec), "-b", backend, "-n", "2", "-r", "2", "--spare-hosts", "2",
        "--network", str(cluster.data_subnet), "--check", "--check-timeout", "3", *more,
    ]  # fmt: skip


def test_a_host_that_fails_the_check_is_replaced_by_a_spare_that_passes_it(
    cluster: TestCluster, tmp_path: Path
) -> None:
    h0, h1, s1, s2 = (h.name for h in cluster.hosts)
    data_link(cluster, 1, up=False)  # a planned host: the check finds it
    data_link(cluster, 2, up=False)  # the first spare: not used
    out = tmp_path / "logs"
    args = check_args(cluster, spec_for(cluster, tmp_path), "-o", str(out), "--", "sh", "-c", SHOW)
    proc = poprun(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ran = sorted(re.findall(r"ran (\d) on (\S+)", proc.stdout))
    assert ran == [("0", h0), ("1", s2)], proc.stdout
    why = rf"instance 1: cannot reach MASTER_ADDR {re.escape(cluster.hosts[0].data_address)}"
    summary = [line for line in proc.stderr.splitlines() if line.startswith("poprun-py: check:")]
    assert len(summary) == 2, proc.stderr
    assert re.match(rf"poprun-py: check: spare host {s2} in place of {h1} \({why}", summary[0])
    assert re.match(rf"poprun-py: check: spare host {s1} failed the check \({why}", summary[1])
    assert f"warning: check: spare host {s1} takes the place of host {h1}" in proc.stderr
    assert proc.stderr.count("check: 2/2 host(s) ok") == 1  # the third check passed
    record = json.loads((out / "plan-check.json").read_text())
    assert record["replaced"] == {h1: s2} and re.match(why, record["why"][h1])
    assert list(record["spares_failed"]) == [s1]
    assert [h["name"] for h in record["plan"]["hosts"]] == [h0, s2]
    only_sshd(cluster)


def test_when_no_spare_passes_the_check_the_launch_stops_with_exit_3(
    cluster: TestCluster, tmp_path: Path
) -> None:
    h1 = cluster.hosts[1].name
    for k in (1, 2, 3):
        data_link(cluster, k, up=False)
    marker = tmp_path / "ran"
    args = check_args(cluster, spec_for(cluster, tmp_path), "--", "touch", str(marker))
    proc = poprun(*args, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert "no spare host left" in proc.stderr and h1 in proc.stderr.split("fault(s)")[-1]
    assert f"spare host {cluster.hosts[3].name} failed too" in proc.stderr
    only_sshd(cluster)


RUN_THEN_END = (
    'echo "attempt $POPRUN_RESTART_COUNT $RANK on $POPRUN_HOST_NAME"; '
    '[ "$POPRUN_RESTART_COUNT" = 0 ] && exec sleep 12; exit 0'
)
"""Attempt 0 runs 12 s (long enough to lose a host; it ends by itself on the cut host too),
attempt 1 ends at once."""


SPARE_FAILS = {"ssh": ": cannot reach MASTER_ADDR", "mpirun": " gave no report"}
"""Why a spare whose data link is down fails the check: under mpirun, ORTE's daemon cannot
start there (its out-of-band traffic goes over the data network), so the check program never
runs there."""


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_a_spare_that_fails_the_check_does_not_replace_a_lost_host(
    cluster: TestCluster, tmp_path: Path, backend: str
) -> None:
    h0, h1, s1, s2 = (h.name for h in cluster.hosts)
    data_link(cluster, 2, up=False)  # the first spare cannot reach MASTER_ADDR
    more = ["--max-restarts", "1", "--host-timeout", "3s", "--", "sh", "-c", RUN_THEN_END]
    args = check_args(cluster, spec_for(cluster, tmp_path), *more, backend=backend)
    job_dirs = set(Path(JOBS_ROOT).glob(f"{cluster.name}-*"))
    with stopped_at_the_end(started(args, tmp_path, env=dict(os.environ))) as run:
        try:
            run.wait_for(r"attempt 0 1 on", 1)
            cut(cluster, 1, up=False)
            code, out, err = run.finish(timeout=90)
        finally:
            cut(cluster, 1, up=True)
    assert code == 0, err
    assert "check: 2/2 host(s) ok" in err  # before the launch: the spares are not in the plan
    why = SPARE_FAILS[backend]
    assert re.search(rf"restart: spare host {s1} failed the check \(instance 1{why}", err), err
    assert f"spare host {s2} takes the place of lost host {h1}" in err
    assert f"spare host {s1} takes the place" not in err
    assert sorted(re.findall(r"attempt 1 (\d) on (\S+)", out)) == [("0", h0), ("1", s2)], out
    assert re.search(rf"attempt 1: ok \({s2} in place of {h1}\)", err), err
    assert set(Path(JOBS_ROOT).glob(f"{cluster.name}-*")) == job_dirs  # the failed check's too
    only_sshd(cluster, settle=15.0)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own registry of detached jobs (XDG_STATE_HOME)."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def detached(args: list[str], tmp_path: Path) -> tuple[str, str]:
    """``launch ... --detach``: the job id and the client's stderr."""
    split = args.index("--")
    proc = poprun(*args[:split], "--detach", *args[split:], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[-1], proc.stderr


def job_row(job: str, tmp_path: Path) -> dict[str, object]:
    proc = poprun("jobs", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)
    return next(r for r in rows if r["id"] == job)


def test_detached_a_host_that_fails_the_check_is_replaced_as_attached(
    cluster: TestCluster, tmp_path: Path, registry: Path
) -> None:
    """The client's check swaps the hosts (its tables and warnings on the client's stderr); the
    supervisor runs the job on the replaced set; its log has the attached launch's summary
    lines, its logs directory ``plan-check.json``."""
    h0, h1, s1, s2 = (h.name for h in cluster.hosts)
    data_link(cluster, 1, up=False)  # a planned host: the check finds it
    data_link(cluster, 2, up=False)  # the first spare: not used
    args = check_args(cluster, spec_for(cluster, tmp_path), "--", "sh", "-c", SHOW)
    job, err = detached(args, tmp_path)
    try:
        assert f"warning: check: spare host {s1} takes the place of host {h1}" in err
        assert err.count("check: 2/2 host(s) ok") == 1, err
        waited = poprun("wait", job, cwd=tmp_path)
        assert waited.returncode == 0, waited.stderr
    finally:
        poprun("stop", job, cwd=tmp_path)
    row = job_row(job, tmp_path)
    assert row["hosts"] == [h0, s2] and row["supervisor"] == h0, row
    job_dir = Path(str(row["job_dir"]))
    log = (job_dir / "output.log").read_text()
    assert sorted(re.findall(r"ran (\d) on (\S+)", log)) == [("0", h0), ("1", s2)], log
    why = rf"instance 1: cannot reach MASTER_ADDR {re.escape(cluster.hosts[0].data_address)}"
    summary = [line for line in log.splitlines() if line.startswith("poprun-py: check:")]
    assert len(summary) == 2, log
    assert re.match(rf"poprun-py: check: spare host {s2} in place of {h1} \({why}", summary[0])
    assert re.match(rf"poprun-py: check: spare host {s1} failed the check \({why}", summary[1])
    record = json.loads((job_dir / "logs" / "plan-check.json").read_text())
    assert record["replaced"] == {h1: s2} and re.match(why, record["why"][h1])
    assert list(record["spares_failed"]) == [s1]
    assert [h["name"] for h in record["plan"]["hosts"]] == [h0, s2]
    only_sshd(cluster)


def test_detached_a_spare_that_fails_the_check_does_not_replace_a_lost_host(
    cluster: TestCluster, tmp_path: Path, registry: Path
) -> None:
    """The supervisor checks a spare before a restart uses it, as an attached launch does."""
    h0, h1, s1, s2 = (h.name for h in cluster.hosts)
    data_link(cluster, 2, up=False)  # the first spare cannot reach MASTER_ADDR
    more = ["--max-restarts", "1", "--host-timeout", "3s", "--", "sh", "-c", RUN_THEN_END]
    job, err = detached(check_args(cluster, spec_for(cluster, tmp_path), *more), tmp_path)
    log = Path(str(job_row(job, tmp_path)["job_dir"])) / "output.log"
    try:
        assert "check: 2/2 host(s) ok" in err  # on the client, before the job was detached
        deadline = time.monotonic() + 30
        while not re.search(r"attempt 0 1 on", log.read_text()):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        cut(cluster, 1, up=False)
        waited = subprocess.run(
            [sys.executable, "-m", "poprun_py", "wait", job],
            cwd=tmp_path, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    finally:
        cut(cluster, 1, up=True)
        poprun("stop", job, cwd=tmp_path)
    text = log.read_text()
    assert waited.returncode == 0, text
    assert re.search(rf"restart: spare host {s1} failed the check \(instance 1: cannot reach", text)
    assert f"spare host {s2} takes the place of lost host {h1}" in text
    assert f"spare host {s1} takes the place" not in text
    assert sorted(re.findall(r"attempt 1 (\d) on (\S+)", text)) == [("0", h0), ("1", s2)], text
    assert re.search(rf"attempt 1: ok \({s2} in place of {h1}\)", text), text
    only_sshd(cluster, settle=15.0)
