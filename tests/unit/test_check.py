"""The check's verdict from its instances' reports (poprun_py.launch.check.judge): broken hosts
named, victims of another host's fault not blamed, slow hosts named, silent instances named."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from typing import Any

import pytest

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.hostside.check_instance import check_devices
from poprun_py.launch.check import judge, parse_lines, report_dict, report_lines


def plan(hosts: str = "h[1-4]") -> LaunchPlan:
    return make_plan(cluster_from_hosts(parse_hosts(hosts)), JobSpec(("x",), replicas=4))


def good(rank: int, latency: float = 0.05, bandwidth: float = 900.0) -> dict[str, Any]:
    return {
        "rank": rank,
        "ok": True,
        "allreduce": True,
        "latency_ms": latency,
        "bandwidth_MBps": bandwidth,
        "devices": "",
    }


def test_healthy_hosts_pass() -> None:
    report = judge(plan(), {i: good(i) for i in range(4)})
    assert report.faults == [] and all(h.ok for h in report.hosts)
    assert report_lines(report)[-1].startswith("check: 4/4 host(s) ok")


def test_the_unreachable_host_is_named_not_the_ones_waiting_for_it() -> None:
    reports = {i: good(i) for i in range(4)}
    for i in (0, 1, 3):
        reports[i].update(ok=False, allreduce=False, missing=[2], error="ranks [2] missing")
    reports[2] = {"rank": 2, "ok": False, "error": "cannot reach MASTER_ADDR 198.19.0.11:29500"}
    faults = judge(plan(), reports).faults
    assert [(f.host, f.detail) for f in faults] == [
        ("h3", "instance 2: cannot reach MASTER_ADDR 198.19.0.11:29500")
    ]


def test_the_json_report_has_every_hosts_figures_and_problems() -> None:
    reports = {i: good(i) for i in (0, 1, 2)}
    found = report_dict(judge(plan(), reports))
    assert found["ok"] is False and [h["host"] for h in found["hosts"]] == ["h1", "h2", "h3", "h4"]
    assert found["hosts"][0] == {
        "host": "h1", "instances": 1, "latency_ms": 0.05, "bandwidth_mbps": 900.0,
        "devices": "-", "gloo": "-", "ok": True, "problems": [],
    }  # fmt: skip
    assert found["hosts"][3]["ok"] is False and found["hosts"][3]["problems"]


def test_an_instance_without_a_report_is_named() -> None:
    reports = {i: good(i) for i in (0, 1, 2)}
    assert [f.host for f in judge(plan(), reports).faults] == ["h4"]


def test_slow_hosts_are_named() -> None:
    reports = {i: good(i) for i in range(4)}
    reports[1] = good(1, latency=5.0)
    reports[3] = good(3, bandwidth=20.0)
    faults = judge(plan(), reports).faults
    assert [(f.host, f.detail.split(":")[1].split()[0]) for f in faults] == [
        ("h2", "latency"),
        ("h4", "bandwidth"),
    ]


def test_when_nobody_reaches_the_first_host_it_is_named() -> None:
    reports = {0: good(0)}
    for i in (1, 2, 3):
        reports[i] = {"rank": i, "ok": False, "error": "cannot reach MASTER_ADDR h1:29500"}
    assert "h1" in {f.host for f in judge(plan(), reports).faults}


def test_report_lines_are_parsed_and_others_ignored() -> None:
    lines = ['POPRUN-CHECK {"rank": 3, "ok": true}', "POPRUN-CHECK not json", "hello"]
    assert parse_lines(lines) == {3: {"rank": 3, "ok": True}}


def test_device_variables_must_list_the_planned_devices() -> None:
    assert check_devices({"POPRUN_DEVICES": ""}) == (True, "")
    ok, why = check_devices({"POPRUN_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"})
    assert not ok and "the plan gives 1" in why
    ok, why = check_devices({"POPRUN_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}, "/nonexistent")
    assert not ok and "has 0 such GPU(s)" in why


def test_devices_are_counted_in_the_hosts_sysfs() -> None:
    from pathlib import Path

    dgx = str(Path(__file__).resolve().parents[1] / "fixtures" / "hw" / "dgx-h100")
    env = {"POPRUN_DEVICES": "6,7", "CUDA_VISIBLE_DEVICES": "6,7"}
    assert check_devices(env, dgx) == (True, "6,7")
    mi300 = dgx.replace("dgx-h100", "amd-mi300x")
    assert check_devices({"POPRUN_DEVICES": "8", "ROCR_VISIBLE_DEVICES": "8"}, mi300)[0] is False


def test_reports_are_written_as_json_dumps_writes_them() -> None:
    import json
    import random

    from poprun_py.hostside.check_instance import dumps

    rng = random.Random(15)
    alphabet = 'ab"\\\n\r\t\b\f\x00\x1f\x7f é€😀\udcff/'
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        report = {
            "error": text,
            text: [rng.randrange(-5, 5), rng.random() * 10 ** rng.randrange(-6, 6)],
            "ok": rng.random() < 0.5,
            "gloo": None,
            "bw": float("inf"),
        }
        assert dumps(report) == json.dumps(report, sort_keys=True)
        assert json.loads(dumps(report))["error"] == text


def test_instances_check_against_rank_0_and_the_missing_rank_is_named() -> None:
    """Instances in threads of this process, over real sockets: all pass; with a rank that
    never connects, the others report it missing at the deadline, and it alone is named."""
    import threading

    from poprun_py.hostside.check_instance import run
    from tests.ports import held_port

    def check(ranks: range, timeout: float) -> dict[int, dict[str, Any]]:
        reports: dict[int, dict[str, Any]] = {}
        with held_port() as port:  # until rank 0 has bound it (tests/ports.py)
            env = {"WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

            def one(rank: int) -> None:
                reports[rank] = run({**env, "RANK": str(rank)}, timeout)

            threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return reports

    good = check(range(3), 5.0)
    assert [good[r]["ok"] for r in range(3)] == [True, True, True], good
    assert all(good[r]["latency_ms"] >= 0 and good[r]["bandwidth_MBps"] > 0 for r in range(3))
    partial = check(range(2), 0.5)
    assert [partial[r].get("missing") for r in range(2)] == [[2], [2]], partial
    three = make_plan(cluster_from_hosts(parse_hosts("h[1-3]")), JobSpec(("x",), replicas=3))
    assert [f.host for f in judge(three, partial).faults] == ["h3"]


def test_the_shipped_check_program_parses_as_python_3_7() -> None:
    """The hosts' Python may be as old as the agent's oldest (3.7); the real run on 3.7 is in
    tests/integration/test_network.py."""
    from poprun_py.hostside.bundle import bundle

    ast.parse(bundle("check_instance"), feature_version=(3, 7))


@pytest.mark.old_pythons
def test_a_late_rank_is_still_served_on_python_3_7() -> None:
    """Rank 0 serves the check; on Python 3.7-3.9 its accept timeout is ``socket.timeout``,
    not yet ``TimeoutError``: a rank that connects after the first 0.1 s must still get in."""
    from poprun_py.hostside.bundle import from_env, payload
    from poprun_py.launch.check import CHECK_VAR
    from tests.integration.test_host_tools import old_python
    from tests.ports import held_port

    python = str(old_python("3.7"))
    base = {"PATH": os.environ["PATH"], "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    base |= {"POPRUN_HOST_NAME": "h1", CHECK_VAR: payload("check_instance").text}
    argv = [*from_env(python, CHECK_VAR, "--timeout", "10")]
    with held_port() as port:  # until rank 0 has bound it (tests/ports.py)
        base["MASTER_PORT"] = str(port)
        first = subprocess.Popen(argv, env={**base, "RANK": "0"}, stdout=subprocess.PIPE, text=True)
        late = ["sh", "-c", 'sleep 1; exec "$@"', "late", *argv]  # the late rank, 1 s after
        env = {**base, "RANK": "1"}
        second = subprocess.run(late, env=env, capture_output=True, text=True, check=False)
        out, _ = first.communicate(timeout=30)
    reports = [json.loads(o.split(" ", 1)[1]) for o in (out, second.stdout)]
    assert [r["ok"] for r in reports] == [True, True], reports
