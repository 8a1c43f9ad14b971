"""The agent protocol is written once (poprun_py/hostside/protocol.py), shipped with the agent."""

from __future__ import annotations

import ast
from pathlib import Path

from poprun_py.hostside import protocol as P
from poprun_py.hostside.bundle import bundle


def test_records_round_trip() -> None:
    for kind in P.INSTANCE_RECORDS:
        assert P.parse(P.record(kind, 7, b"some text")) == (kind, 7, b"some text")
    assert P.parse(P.record(P.EXITED, 0, 3)) == (P.EXITED, 0, b"3")
    assert P.parse(P.HEARTBEAT_LINE)[1] == -1 and P.parse(P.DONE)[0] == P.DONE
    assert P.parse(b"o x noise")[1] == -1
    for indexes in (frozenset(), frozenset({3}), frozenset({0, 12, 5})):
        assert P.dump_indexes(P.dump_line(indexes)) == indexes


def test_the_shipped_agent_carries_the_protocol_module_itself() -> None:
    source = bundle("agent").encode()
    assert b"from poprun_py" not in source
    tree = ast.parse(source, feature_version=(3, 7))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"record", "parse", "bound", "dump_in_background", "dump_line"} <= defined
    for line in Path(P.__file__).read_text().splitlines():
        if " = " in line and not line.startswith(" "):  # every constant, as written
            assert line in source.decode()
