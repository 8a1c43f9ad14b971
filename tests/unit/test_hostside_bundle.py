"""One bundler and one bootstrap ship every program of poprun_py/hostside to the hosts."""

from __future__ import annotations

import ast
import json
import marshal
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from poprun_py.hostside import bundle as B
from poprun_py.hostside.bundle import Payload, bundle, from_env, over_stdin, payload

HOSTSIDE = Path(B.__file__).parent
MODULES = sorted(p.stem for p in HOSTSIDE.glob("*.py"))
ENTRIES = ("agent", "hostops", "check_instance", "step_dump")
OPTIONAL = {"torch"}  # check_instance's Gloo all-reduce, only with --torch 1 where torch is


def imported(tree: ast.AST) -> list[str]:
    """Every module an import statement of ``tree`` names (relative ones with their dots)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def bare_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **extra}


@pytest.mark.parametrize("name", MODULES)
def test_every_hostside_module_imports_only_the_stdlib_and_hostside_and_parses_as_3_7(
    name: str,
) -> None:
    tree = ast.parse((HOSTSIDE / f"{name}.py").read_text(), feature_version=(3, 7))
    for module in imported(tree):
        top = module.split(".")[0]
        assert top in sys.stdlib_module_names | OPTIONAL or module.startswith(B.PACKAGE + "."), (
            module
        )


@pytest.mark.parametrize("entry", ENTRIES)
def test_each_bundle_is_self_contained(entry: str) -> None:
    source = bundle(entry)
    tree = ast.parse(source, feature_version=(3, 7))
    assert not [m for m in imported(tree) if m.startswith(("poprun_py", "."))]
    assert source.startswith("from __future__ import annotations\n")
    assert source.count("from __future__ import annotations") == 1
    assert payload(entry).source == source.encode()
    assert marshal.loads(payload(entry).code).co_filename == "poprun-py"


def test_the_agent_bundle_carries_each_of_its_modules_once_before_it() -> None:
    source = bundle("agent")
    markers = ("def bound(", "def record(", "def signal_same(", "def dump_ranks(")
    for marker in markers:  # binding, protocol, identity, stackdump
        assert source.count(marker) == 1, marker
        assert source.index(marker) < source.index("class Agent")


def test_the_agent_runs_from_its_bundle_under_python3_s(tmp_path: Path) -> None:
    job = {"instances": [{"index": 3, "argv": ["echo", "hi"], "env": {}, "cwd": None}]}
    data = payload("agent").data + b"job " + json.dumps(job).encode() + b"\n"
    argv = over_stdin("--no-stdin-eof")
    out = subprocess.run(
        argv, input=data, capture_output=True, check=False, cwd=tmp_path, env=bare_env()
    )
    assert out.returncode == 0, out.stderr
    assert [r for r in out.stdout.decode().splitlines() if r[0] in "oxd"] == [
        "o 3 hi",
        "x 3 0",
        "d",
    ]


def test_hostops_runs_from_its_bundle_under_python3_s(tmp_path: Path) -> None:
    env = bare_env(POPRUN_PY_JOB_ROOT=str(tmp_path / "root"))
    out = subprocess.run(
        over_stdin("list"),
        input=payload("hostops").data,
        capture_output=True,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert (out.returncode, out.stdout, out.stderr) == (0, b"[]\n", b"")


def test_the_check_program_runs_from_the_environment_under_python_s(tmp_path: Path) -> None:
    """As ``check`` runs it: the payload in a variable named in the argv, not in it."""
    var = "POPRUN_TEST_PROGRAM"
    text = payload("check_instance").text
    argv = list(from_env(sys.executable, var, "--timeout", "10"))
    argv[1:1] = ["-S", "-I"]
    assert all(text not in a for a in argv)
    env = bare_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    env |= {"POPRUN_HOST_NAME": "h1", var: text}
    out = subprocess.run(
        argv, capture_output=True, check=False, text=True, cwd=tmp_path, env=env, timeout=30
    )
    report = json.loads(out.stdout.split(" ", 1)[1])
    assert (report["ok"], report["rank"]) == (True, 0), out.stderr


TOLD = "import os,sys;print(WHICH, sys.argv[1:], os.environ.get('V'), os.read(0, 99))"
CODE = marshal.dumps(compile(TOLD.replace("WHICH", "'code'"), "x", "exec"))
SOURCE = TOLD.replace("WHICH", "'source'").encode()


def started(shipped: Payload, where: str) -> str:
    """What the told program printed, its payload on stdin (``-``) or in the variable ``V``."""
    if where == "-":
        argv, env, data = over_stdin("a", "b"), bare_env(), shipped.data + b"rest"
    else:
        argv, env, data = list(from_env("python3", "V", "a", "b")), bare_env(V=shipped.text), b""
    out = subprocess.run(argv, input=data, capture_output=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode().strip()


@pytest.mark.parametrize("where", ["-", "V"])
def test_the_bootstrap_runs_the_code_where_the_magic_matches_else_the_source(where: str) -> None:
    """It reads exactly the payload (the rest of stdin is the program's), takes the variable out
    of the environment, and passes the program its arguments."""
    ask = "import importlib.util as u; print(u.MAGIC_NUMBER.hex())"
    python3 = subprocess.run(["sh", "-c", B.PYTHON3, ask], capture_output=True, check=True)
    magic = bytes.fromhex(python3.stdout.decode().strip())  # the host's python3's, as shipped
    rest = "b'rest'" if where == "-" else "b''"
    same = Payload(CODE, SOURCE, magic)
    assert started(same, where) == f"code ['a', 'b'] None {rest}"
    assert started(replace(same, magic=b"\0\0\0\0"), where) == f"source ['a', 'b'] None {rest}"
    assert started(replace(same, code=b""), where) == f"source ['a', 'b'] None {rest}"


@pytest.fixture
def fresh() -> Iterator[None]:
    B._BUILT.clear()
    B._module.cache_clear()
    yield
    B._BUILT.clear()
    B._module.cache_clear()


def test_the_payload_is_built_once_under_concurrent_calls(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[str] = []

    def slow_bundle(entry: str) -> str:
        builds.append(entry)
        time.sleep(0.05)
        return bundle(entry)

    monkeypatch.setattr(B, "bundle", slow_bundle)
    go = threading.Barrier(16)
    got: list[Payload] = []

    def ask() -> None:
        go.wait()
        got.append(payload("hostops"))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["hostops"] and len(got) == 16 and all(p is got[0] for p in got)


def test_imports_are_found_generically_recursively_each_once_in_order(
    fresh: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "main.py").write_text(
        '"""Entry."""\nfrom __future__ import annotations\n\nimport os\n'
        "from poprun_py.hostside.mid import (  # inlined\n    MID,  # a comment\n    low,\n)\n"
        "from poprun_py.hostside.low import LOW\n\n"
        "def f():\n    from poprun_py.hostside.low import LOW as L\n    return L\n\n"
        "print(MID, LOW, low(), f(), os.sep)\n"
    )
    (tmp_path / "mid.py").write_text(
        "from poprun_py.hostside.low import LOW, low\nMID = 'mid' + LOW\n"
    )
    (tmp_path / "low.py").write_text("LOW = 'low'\n\ndef low():\n    return LOW\n")
    monkeypatch.setattr(B, "__file__", str(tmp_path / "bundle.py"))
    source = bundle("main")
    assert source.count("LOW = 'low'") == 1
    assert source.index("LOW = 'low'") < source.index("MID = ") < source.index('"""Entry."""')
    out = subprocess.run(
        [sys.executable, "-S", "-c", source], capture_output=True, check=False, text=True
    )
    assert out.stdout == "midlow low low low /\n", out.stderr
    (tmp_path / "bad.py").write_text("from poprun_py.hostside import low\n")
    with pytest.raises(ValueError, match=r"bad\.py:1"):
        bundle("bad")
