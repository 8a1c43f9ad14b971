"""The layout's contracts, enforced: the pure core imports no I/O library and nothing of
poprun-py outside ``core/`` but ``errors``; no product module is named ``test*``; no module
grows past 600 lines; the package has no import circles."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import poprun_py

PACKAGE = Path(poprun_py.__file__).parent
IO_LIBRARIES = {
    "subprocess",
    "socket",
    "select",
    "selectors",
    "signal",
    "threading",
    "multiprocessing",
    "asyncio",
    "paramiko",
    "rich",
    "typer",
    "boto3",
    "botocore",
    "fabric",
}
MAX_LINES = 600


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages([str(PACKAGE)], "poprun_py."))


def source(name: str) -> Path:
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(name: str) -> set[str]:
    """Every module ``name`` imports, at any depth of its code (lazy imports included)."""
    tree = ast.parse(source(name).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(named)
            if not named <= KNOWN:  # not only submodules: the package itself is imported
                found.add(node.module)
    return found


KNOWN = frozenset(modules())
"""Every module of poprun-py. ``from pkg import module`` is an edge to the module only: Python
runs ``pkg/__init__`` before any of its modules anyway, so that edge would make every
registry (an ``__init__`` that creates its modules' classes on demand) a circle."""

CORE = [m for m in modules() if m.startswith("poprun_py.core")]


@pytest.mark.parametrize("name", CORE)
def test_the_core_does_no_io_and_depends_on_nothing_outside_it(name: str) -> None:
    found = imports(name)
    io = {m for m in found if m.split(".")[0] in IO_LIBRARIES}
    assert not io, f"{name} imports I/O libraries: {sorted(io)}"
    outside = {
        m
        for m in found
        if m.startswith("poprun_py")
        and m not in ("poprun_py", "poprun_py.errors")
        and not m.startswith(("poprun_py.core", "poprun_py.errors."))
    }
    assert not outside, f"{name} imports outside core/: {sorted(outside)}"


def test_the_contract_test_sees_the_core() -> None:
    assert {"poprun_py.core.plan", "poprun_py.core.spec", "poprun_py.core.env"} <= set(CORE)


def test_no_product_module_is_named_test() -> None:
    named = [m for m in modules() if m.rsplit(".", 1)[-1].startswith("test")]
    assert named == ["poprun_py.testing"] or not named, named


@pytest.mark.parametrize("name", modules())
def test_modules_stay_small(name: str) -> None:
    lines = len(source(name).read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def poprun_imports(name: str) -> set[str]:
    """The poprun_py modules ``name`` imports anywhere (lazy and TYPE_CHECKING ones too)."""
    known = set(modules())
    found = set()
    for imported in imports(name):
        target = imported
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target not in (name, "poprun_py"):
            found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strongly_connected(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                strongly_connected(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongly_connected(node)
    return found


def test_no_import_circles_between_modules() -> None:
    graph = {n: poprun_imports(n) for n in modules()}
    assert not circles(graph), f"import circles: {circles(graph)}"


def package(name: str) -> str:
    """The package under poprun_py that ``name`` belongs to (a top-level module: itself)."""
    return name.split(".")[1]


def test_no_import_circles_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for name in modules():
        graph.setdefault(package(name), set()).update(
            package(m) for m in poprun_imports(name) if package(m) != package(name)
        )
    assert not circles(graph), f"package circles: {circles(graph)}"


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports test files by their base name (rootdir mode): two of one name in
    different folders stop the whole session at collection."""
    tests = Path(__file__).resolve().parents[1]
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
