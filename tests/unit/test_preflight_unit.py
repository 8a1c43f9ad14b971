"""Preflight without hosts: its warnings (a slow or unresolvable host name, a topology it could
not discover) are logged, one record each, when preflight ends, so the CLI prints them before
the launch; its check script, run here by the real /bin/sh, finds what is not executable."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.preflight import probes as pf
from poprun_py.ssh.connection import RemoteResult
from poprun_py.ssh.hostresult import HostResult
from poprun_py.ssh.settings import SshSettings

T = TypeVar("T")


class Host:
    """A host whose check script answers ``stdout``."""

    def __init__(self, name: str, stdout: str):
        self.name, self.stdout = name, stdout

    def run(self, argv: Sequence[str], *, timeout: float | None = None) -> RemoteResult:
        return RemoteResult(self.name, 0, self.stdout, "", 0.0)


class Pool:
    def __init__(self, hosts: dict[str, str]):
        self.hosts = tuple(HostSpec(name) for name in hosts)
        self.settings = SshSettings()
        self._hosts = {name: Host(name, out) for name, out in hosts.items()}

    def each(
        self, fn: Callable[[Host], T], hosts: Iterable[str] | None = None, *, connect: bool = False
    ) -> dict[str, HostResult[T]]:
        return {name: HostResult(fn(host)) for name, host in self._hosts.items()}


SYSFS = "topology sysfs\n/sys/devices/system/node/node0/cpulist:0-1\n"


def test_slow_name_and_missing_topology_are_logged_one_line_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    times = {"slow": (1.5, None), "fast": (0.01, None)}
    monkeypatch.setattr(pf, "resolve_time", lambda name: times[name])
    pool = Pool({"slow": SYSFS, "fast": "topology none\n"})
    with caplog.at_level(logging.WARNING, logger="poprun_py.preflight.probes"):
        report = pf.preflight(pool)
    assert report.faults == ()
    logged = [r.getMessage() for r in caplog.records]
    assert logged == list(report.warnings)
    assert logged[0].startswith("slow took 1.5 s to resolve")
    assert logged[1] == "fast: NUMA topology could not be discovered"
    assert all("\n" not in line for line in logged)


def test_no_warnings_no_records(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pf, "resolve_time", lambda name: (0.01, None))
    with caplog.at_level(logging.WARNING, logger="poprun_py.preflight.probes"):
        pf.preflight(Pool({"h1": SYSFS}))
    assert caplog.records == []


def test_a_path_that_is_no_executable_file_is_missing(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    plain.chmod(0o644)
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    checks = pf.Checks(commands=(str(plain), str(tool), str(tmp_path), "sh", "no-such-tool-x"))
    argv = pf.checks_argv(checks, numactl=False)
    out = subprocess.run(["/bin/sh", *argv[1:]], capture_output=True, text=True, check=True)
    faults, _ = pf.parse_check_output("h1", checks, out.stdout)
    assert [f.detail for f in faults] == [
        f"{plain}: not an executable file",
        f"{tmp_path}: not an executable file",
        "no-such-tool-x: not found on PATH",
    ]
