"""The check's verdict from its instances' reports (poprun_py.launch.check.judge): broken hosts
named, victims of another host's fault not blamed, slow hosts named, silent instances named."""

from __future__ import annotations

from typing import Any

from poprun_py.check_instance import check_devices
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import LaunchPlan, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.launch.check import judge, parse_lines, report_lines


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
