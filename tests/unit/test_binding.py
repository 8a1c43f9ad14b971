"""Binding without numactl: the syscalls, the spawner's set-spawn-restore, the agent's copy,
the plan's "changes nothing" rule, and the numactl preflight check for templates that use it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from poprun_py.agent.client import Timing
from poprun_py.backends.ssh import _host_header
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import binds, make_plan
from poprun_py.core.spec import JobSpec, cluster_from_hosts
from poprun_py.core.topology import NumaNode, Topology, uniform
from poprun_py.errors import PreflightError
from poprun_py.hostside import binding
from poprun_py.hostside.binding import (
    MPOL_BIND,
    MPOL_DEFAULT,
    SYSCALLS,
    allowed_cpus,
    bound,
    get_mempolicy,
    set_mempolicy,
)
from poprun_py.hostside.bundle import bundle, payload
from poprun_py.hostside.supervision import Spawner
from poprun_py.preflight.probes import HostReport, PreflightReport, check_numactl
from poprun_py.render.job import render_job
from tests.integration.helpers import binding_case

CASE = binding_case()
"""CPUs and a NUMA node of this machine to bind to (any CPU count, node or cpuset)."""


def status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise KeyError(key)


# ---------------------------------------------------------------- syscalls


def test_syscall_numbers_of_the_supported_architectures() -> None:
    assert SYSCALLS["x86_64"] == (238, 239)
    assert SYSCALLS["aarch64"] == SYSCALLS["riscv64"] == (237, 236)  # the generic table
    assert binding.syscall_numbers() == SYSCALLS.get(os.uname().machine)


def test_set_and_get_mempolicy_round_trip_on_a_thread_of_its_own() -> None:
    seen: list[object] = []

    def work() -> None:
        set_mempolicy(MPOL_BIND, [CASE.node])  # a node this process may allocate on
        seen.append(get_mempolicy())
        set_mempolicy(MPOL_DEFAULT)
        seen.append(get_mempolicy())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [(MPOL_BIND, (CASE.node,)), (MPOL_DEFAULT, ())]
    assert get_mempolicy() == (MPOL_DEFAULT, ())  # per thread: this one never changed


def test_an_impossible_binding_is_an_oserror_and_changes_nothing() -> None:
    before = allowed_cpus(), get_mempolicy()
    with pytest.raises(OSError, match="cannot bind to CPUs 4000-4001"), bound((4000, 4001), ()):
        pass
    with pytest.raises(OSError, match="NUMA node 5000 is out of range"), bound((), (5000,)):
        pass
    assert (allowed_cpus(), get_mempolicy()) == before


def test_without_numa_policies_memory_stays_unbound_and_cpus_are_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(binding._CACHE, "numbers", None)  # as on an unknown architecture
    cpu = min(os.sched_getaffinity(0))
    with bound((cpu,), (0,)):
        assert os.sched_getaffinity(0) == {cpu}
    assert len(os.sched_getaffinity(0)) == len(allowed_cpus())


def test_spawner_binds_posix_spawn_and_popen_children_and_restores_itself() -> None:
    before = os.sched_getaffinity(0)
    spawner = Spawner({})
    try:
        for cwd in (None, "/"):  # posix_spawn, then Popen (a working directory)
            proc = spawner.start(("sleep", "5"), {}, cwd, (CASE.first,), (CASE.node,))
            try:
                assert status(proc.pid, "Cpus_allowed_list") == str(CASE.first)
                maps = Path(f"/proc/{proc.pid}/numa_maps").read_text().splitlines()
                assert {line.split()[1] for line in maps} == {f"bind:{CASE.node}"}
            finally:
                os.kill(proc.pid, 9)
                proc.wait()
                proc.close()
        assert os.sched_getaffinity(0) == before and get_mempolicy() == (MPOL_DEFAULT, ())
        plain = spawner.start(("true",), {}, None)
        assert plain.wait() == 0
        plain.close()
    finally:
        spawner.close()


# ---------------------------------------------------------------- the agent's copy


def test_the_agent_ships_the_binding_module_inlined_and_parses_as_python_3_7() -> None:
    source = bundle("agent").encode()
    assert b"from poprun_py" not in source and b"def bound(" in source
    assert source.count(b"from __future__ import annotations") == 1
    tree = ast.parse(source, feature_version=(3, 7))  # the agent runs on any Python 3.7+
    assert any(isinstance(n, ast.FunctionDef) and n.name == "set_mempolicy" for n in tree.body)
    assert payload("agent").data.endswith(source)


BIND_ON_OLD_PYTHON = """
import json, os, sys
exec(compile(sys.stdin.read(), "agent", "exec"))
cpu, node = min(os.sched_getaffinity(0)), int(sys.argv[1])
with bound([cpu], [node]):
    inside = sorted(os.sched_getaffinity(0)), list(get_mempolicy())
print(json.dumps({"cpu": cpu, "inside": inside, "after": list(get_mempolicy())}))
"""


@pytest.mark.old_pythons
@pytest.mark.parametrize("version", ["3.7", "3.8"])
def test_the_agents_inlined_binding_runs_on_old_pythons(version: str, tmp_path: Path) -> None:
    """The shipped agent source (binding inlined) run by a host's old Python binds for real:
    the CPU and MPOL_BIND to a node of this machine inside ``bound``, the default policy
    again after it."""
    from tests.integration.test_host_tools import old_python

    python = str(old_python(version))
    source = bundle("agent")
    out = subprocess.run(
        [python, "-S", "-I", "-c", BIND_ON_OLD_PYTHON, str(CASE.node)],
        input=source.replace('if __name__ == "__main__":\n    main()', ""),
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["inside"] == [[got["cpu"]], [MPOL_BIND, [CASE.node]]]
    assert got["after"] == [MPOL_DEFAULT, []]


def test_the_agent_source_alone_runs_without_poprun_py(tmp_path: Path) -> None:
    source = bundle("agent")
    code = "import sys; sys.argv = ['agent']; exec(compile(sys.stdin.read(), 'agent', 'exec'))"
    env = {"PATH": os.environ["PATH"]}
    out = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code + "; print(bound)"],
        input=source.replace('if __name__ == "__main__":\n    main()', ""),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "function bound" in out.stdout


def test_the_agent_header_carries_the_binding_as_data() -> None:
    cluster = cluster_from_hosts(parse_hosts("h1"), topology=uniform(2, 2))
    plan = make_plan(cluster, JobSpec(("prog",), replicas=2, instances=2))
    job = render_job(plan, "ssh", job_dir="/tmp/j")
    header = _host_header(job, "h1", "run", Timing(5.0, 0.5, 5.0, 10.0))
    got = [(i["argv"], i.get("cpus"), i.get("mems")) for i in header["instances"]]
    assert got == [(["prog"], [0, 1], [0]), (["prog"], [2, 3], [1])]


# ---------------------------------------------------------------- plan and preflight


def test_plan_binds_only_where_a_binding_changes_something() -> None:
    one = Topology((NumaNode(0, (0, 1, 2, 3)),))
    cluster = cluster_from_hosts(parse_hosts("h1,h2"), topology=one)
    whole = make_plan(cluster, JobSpec(("p",), replicas=2))
    assert [binds(whole, i) for i in whole.instances] == [False, False]
    assert whole.notes[-1] == (
        "binding would change nothing on h1, h2 (one NUMA node holds every CPU): "
        "those instances are not bound"
    )
    split = make_plan(cluster, JobSpec(("p",), replicas=4, instances=4))
    assert [binds(split, i) for i in split.instances] == [True] * 4
    assert not any("change nothing" in n for n in split.notes)
    off = make_plan(cluster, JobSpec(("p",), replicas=4, instances=4, numa_aware=False))
    assert not any(binds(off, i) for i in off.instances)


def test_numactl_is_a_preflight_fault_only_where_a_command_uses_it(tmp_path: Path) -> None:
    cluster = cluster_from_hosts(parse_hosts("h1,h2"), topology=uniform(2, 2))
    plan = make_plan(cluster, JobSpec(("prog",), replicas=4, instances=4))
    report = PreflightReport((HostReport("h1", numactl=False), HostReport("h2", numactl=True)))
    check_numactl(render_job(plan, "ssh", job_dir="/tmp/j"), report)  # binds itself: fine
    check_numactl(render_job(plan, "mpirun", job_dir="/tmp/j"), report)  # Open MPI binds
    mpiexec = render_job(plan, "mpiexec", job_dir="/tmp/j")  # ranks run under numactl
    with pytest.raises(PreflightError, match=r"^preflight failed on h1: numactl: ") as caught:
        check_numactl(mpiexec, report)
    assert [f.host for f in caught.value.faults] == ["h1"] and caught.value.exit_code == 3
    (tmp_path / "instance.j2").write_text("{{ (inst.numactl + program) | quoted }}\n")
    user = render_job(plan, "ssh", job_dir="/tmp/j", templates_dir=tmp_path)
    with pytest.raises(PreflightError):
        check_numactl(user, report)
