"""The spec schema's faults, word for word, at the key path where they were found.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): a cluster spec
with a fault is refused with one line naming the key (``hosts.1.port: must be at most 65535,
got 70000``); these tests pin each kind of value's line and path, which the other tests checked
only in part.
"""

from typing import Any

import pytest

from poprun_py.core.schema import (
    Bool,
    Either,
    Float,
    Int,
    ListOf,
    MapOf,
    Obj,
    OneOf,
    Record,
    SchemaFault,
    Spec,
    Str,
    check,
)


def fault(spec: Spec, value: Any) -> tuple[str, tuple[str | int, ...]]:
    """The fault's line and its path, with ``spec`` checked inside ``{"outer": [value]}``."""
    with pytest.raises(SchemaFault) as caught:
        check(Obj({"outer": ListOf(spec)}), {"outer": [value]})
    return str(caught.value), caught.value.path


@pytest.mark.parametrize(
    ("spec", "value", "line"),
    [
        (Str(), 3, "outer.0: expected a string, got 3"),
        (Str(), [1], "outer.0: expected a string, got a list"),
        (Str(min_len=1), "", "outer.0: must not be empty"),
        (Str(pattern="[a-z]+"), "A1", "outer.0: 'A1' is not allowed here (pattern [a-z]+)"),
        (Int(), "7", "outer.0: expected an integer, got '7'"),
        (Int(), True, "outer.0: expected an integer, got True"),
        (Int(ge=1), 0, "outer.0: must be at least 1, got 0"),
        (Int(le=65535), 65536, "outer.0: must be at most 65535, got 65536"),
        (Float(), "1.5", "outer.0: expected a number, got '1.5'"),
        (Float(), {"a": 1}, "outer.0: expected a number, got a dict"),
        (Float(gt=0), 0, "outer.0: must be greater than 0, got 0"),
        (Float(ge=0.5), 0.25, "outer.0: must be at least 0.5, got 0.25"),
        (Bool(), "yes", "outer.0: expected true or false, got 'yes'"),
        (OneOf(("a", "b")), "c", "outer.0: expected one of a, b, got 'c'"),
        (ListOf(Int()), "x", "outer.0: expected a list, got 'x'"),
        (ListOf(Int(), min_len=2), [1], "outer.0: needs at least 2 item(s)"),
        (ListOf(Int()), [1, "x"], "outer.0.1: expected an integer, got 'x'"),
        (MapOf(Str()), "x", "outer.0: expected a mapping, got 'x'"),
        (MapOf(Str()), {1: "a"}, "outer.0.1: keys must be strings"),
        (MapOf(Str()), {"k": 1}, "outer.0.k: expected a string, got 1"),
        (Obj({"a": Int()}), "x", "outer.0: expected a mapping, got 'x'"),
        (Obj({"a": Int()}), {"b": 1}, "outer.0.b: unknown key"),
        (Obj({"a": Int()}, required=("a",)), {}, "outer.0.a: required key is missing"),
        (
            Either((Float(gt=0), Str(min_len=1))),
            [],
            "outer.0: expected a number, got a list or expected a string, got a list",
        ),
    ],
)
def test_each_kind_of_value_names_its_fault_and_where(spec: Spec, value: Any, line: str) -> None:
    text, path = fault(spec, value)
    assert text == line
    assert ".".join(map(str, path)) == line.split(": ", 1)[0]


def test_a_fault_at_the_top_has_no_path_prefix() -> None:
    with pytest.raises(SchemaFault) as caught:
        check(Int(), "x")
    assert (str(caught.value), caught.value.path) == ("expected an integer, got 'x'", ())


def test_a_number_within_bounds_comes_back_as_a_float() -> None:
    assert check(Float(ge=0.5), 1) == 1.0
    assert isinstance(check(Float(ge=0.5), 1), float)
    assert check(Int(le=3), 3) == 3


def test_a_checked_object_refuses_an_unknown_attribute_by_name() -> None:
    record = check(Obj({"a": Int(default=1)}), {})
    assert isinstance(record, Record)
    with pytest.raises(AttributeError) as caught:
        _ = record.nope
    assert caught.value.args == ("nope",)


def test_a_checked_object_shows_its_values() -> None:
    assert repr(check(Obj({"a": Int(default=1)}), {})) == "Record({'a': 1})"
