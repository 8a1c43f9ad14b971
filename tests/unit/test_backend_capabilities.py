"""Capabilities instead of names (issue 21, item 4): no module outside ``backends/`` compares a
backend's name, the registry (:data:`poprun_py.core.backends.REGISTRY`) is the one list of
backends, and each capability drives what it says (shown with a registered fake)."""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import poprun_py
from poprun_py.backends import BACKENDS, get_backend
from poprun_py.core.backends import REGISTRY, Capabilities
from poprun_py.errors import SpecError, UsageError
from poprun_py.jobs.detach import check_detachable, supervisor_host
from poprun_py.launch.launcher import job_dir_for
from poprun_py.prepare.job import DEFAULT_MASTER_PORT, LaunchOptions, Prepared, prepare
from poprun_py.prepare.program import SIMULATED
from poprun_py.prepare.specfile import load_cluster
from poprun_py.render.environment import LAUNCHER_TEMPLATES, TEMPLATES_DIR
from poprun_py.render.job import render_job
from poprun_py.testing.fakes import FakeBackend, registered

PACKAGE = Path(poprun_py.__file__).parent


def about_backends(node: ast.AST) -> bool:
    """``node`` names a backend: its source mentions one (``prep.backend``, ``backend_name``);
    a provider's kind or an option's name that happens to be ``local`` or ``ssh`` does not."""
    return "backend" in ast.unparse(node).lower()


def named(node: ast.AST, names: set[str]) -> bool:
    """``node`` is one of ``names``, or a literal collection holding one."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return any(isinstance(i, ast.Constant) and i.value in names for i in items)


def name_tests(source: str, names: set[str]) -> list[str]:
    """Every comparison, ``in`` test or ``match`` of a backend against one of ``names``, and
    every literal collection of two or more of them (a second list of backends), as source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s, names) for s in sides) and any(about_backends(s) for s in sides):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Match) and about_backends(node.subject):
            patterns = [c.pattern for c in node.cases]
            values = [p.value for p in patterns if isinstance(p, ast.MatchValue)]
            found += [f"case {ast.unparse(v)}" for v in values if named(v, names)]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            items = node.keys if isinstance(node, ast.Dict) else node.elts
            listed = [i for i in items if i is not None and named(i, names)]
            if len(listed) >= 2:
                found.append(ast.unparse(node))
    return found


def test_the_scan_catches_a_name_compared() -> None:
    source = (
        "if prep.backend == 'slurm': pass\n"
        "ok = backend in ('ssh', 'mpirun')\n"
        "other = record.backend_name != 'local'\n"
        "match job.backend:\n    case 'mpiexec': pass\n"
        "TEMPLATES = {'mpirun': 'mpirun.j2', 'slurm': 'srun.j2'}\n"
        "fine = provider.kind == 'local' and param.name != 'ssh' and w in ('aws', 'ssh-config')\n"
    )
    assert set(name_tests(source, set(REGISTRY))) == {
        "prep.backend == 'slurm'",
        "backend in ('ssh', 'mpirun')",
        "('ssh', 'mpirun')",
        "record.backend_name != 'local'",
        "case 'mpiexec'",
        "{'mpirun': 'mpirun.j2', 'slurm': 'srun.j2'}",
    }


def test_no_module_outside_backends_compares_a_backend_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "backends" or path == PACKAGE / "core/backends.py":
            continue  # the backends, and their one list
        rel = path.relative_to(PACKAGE.parent)
        tests = name_tests(path.read_text(encoding="utf-8"), set(REGISTRY))
        found += [f"{rel}: {t}" for t in tests]
    assert not found, "ask the backend's capabilities (core/backends.py) instead:\n" + "\n".join(
        found
    )


def test_the_registry_is_the_one_list(tmp_path: Path) -> None:
    assert list(BACKENDS) == list(REGISTRY) == list(LAUNCHER_TEMPLATES)
    for name in REGISTRY:
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"name: c\nhosts: [{{name: h1}}]\ndefaults: {{backend: {name}}}\n")
        assert load_cluster(str(spec)).defaults.backend == name
    spec = tmp_path / "nope.yaml"
    spec.write_text("name: c\nhosts: [{name: h1}]\ndefaults: {backend: nope}\n")
    with pytest.raises(SpecError, match=f"expected one of {', '.join(REGISTRY)},"):
        load_cluster(str(spec))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_backend_is_what_the_registry_says(name: str) -> None:
    backend = get_backend(name)
    module, _, cls = REGISTRY[name].where.partition(":")
    assert (type(backend).__module__, type(backend).__name__) == (module, cls)
    assert backend.name == name
    assert backend.capabilities == REGISTRY[name].capabilities
    template = backend.capabilities.launcher_template
    assert template is None or (TEMPLATES_DIR / template).is_file()


@contextlib.contextmanager
def fake(can: Capabilities) -> Iterator[Prepared]:
    """A job prepared for a fake backend with the capabilities ``can``, registered meanwhile."""
    with registered(FakeBackend(name="fake"), can):
        yield prepare(LaunchOptions(hosts="h1,h2", backend="fake", program=("true",)), {})


def test_runs_on_this_machine_makes_the_hosts_simulated_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("poprun_py.hostside.private.runtime_root", lambda: "/run/here")
    with fake(Capabilities()) as there:  # h1 and h2 are other machines
        assert not any(n.startswith(SIMULATED) for n in there.plan.notes)
        assert there.local_topology is None
        assert there.plan.master_port == DEFAULT_MASTER_PORT  # here: a free port here
        assert not job_dir_for(there.plan, None, there.backend).startswith("/run/here/")
        assert supervisor_host(there, here=False) == there.plan.hosts[0].spec
        check_detachable(there)
    with fake(Capabilities(runs_on_this_machine=True)) as here:  # h1 and h2 simulated here
        assert any(n.startswith(SIMULATED) for n in here.plan.notes)
        assert here.local_topology is not None
        assert {h.topology_source for h in here.plan.hosts} == {"this machine"}
        assert job_dir_for(here.plan, None, here.backend).startswith("/run/here/jobs/")
        check_detachable(here)
        assert supervisor_host(there, here=False) is None  # the supervisor runs here
        with pytest.raises(UsageError, match="--backend fake needs every host to be this"):
            check_detachable(there)  # a cluster of other machines


def test_outlives_client_refuses_detach() -> None:
    refused = pytest.raises(UsageError, match="--detach does not apply to the fake backend")
    with fake(Capabilities(outlives_client=True)) as prep, refused:
        check_detachable(prep)
    with fake(Capabilities(outlives_client=False)) as prep:
        check_detachable(prep)


def test_launcher_template_renders_a_whole_job_launcher(tmp_path: Path) -> None:
    with fake(Capabilities(launcher_template="mpirun.j2")) as prep:
        assert render_job(prep.plan, "fake", job_dir=str(tmp_path)).launcher[0] == "mpirun"
    with fake(Capabilities()) as prep:
        assert render_job(prep.plan, "fake", job_dir=str(tmp_path)).launcher == ()
