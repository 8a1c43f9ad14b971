"""Issue 21, item 1: each option is described once (``poprun_py.core.options.OPTIONS``), and the
typer parameters, the spec's ``defaults:`` schema, LaunchOptions, the Slurm batch argv, the
detach record and the reference (docs/cli.md) are derived from it: the reference is not stale,
every option has an entry, and a new option is one entry."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from poprun_py.cli import option_model
from poprun_py.cli.options import EVERY, LAUNCHING, OPTIONS, Flag, Int, taken_by, takes
from poprun_py.cli.reference import _commands, reference
from poprun_py.core.backends import REGISTRY
from poprun_py.core.options import SPEC_DEFAULTS
from poprun_py.core.spec import ClusterSpec, Defaults
from poprun_py.core.topology import Topology
from poprun_py.errors import SpecError
from poprun_py.prepare.job import LaunchOptions
from poprun_py.prepare.specfile import parse_cluster

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_checked_in_reference_is_current() -> None:
    assert DOCS.read_text(encoding="utf-8") == reference(), (
        "docs/cli.md is stale: python -m poprun_py.cli.reference > docs/cli.md"
    )


@pytest.mark.parametrize("command", EVERY)
def test_every_option_of_a_command_that_takes_the_catalog_has_an_entry(command: str) -> None:
    names = [p.name for p in _commands()[command].params]
    catalog = [f.name for f in taken_by(command)]
    if command in LAUNCHING:
        assert names == catalog, "every option of plan/render/launch/check is an entry"
    else:
        assert set(catalog) <= set(names)


def test_the_entries_that_are_fields_are_launch_options_fields() -> None:
    entries = {f.name: f for f in OPTIONS.values() if f.field}
    assert set(entries) == {f.name for f in fields(LaunchOptions)}
    for f in fields(LaunchOptions):
        default = f.default if f.default is not dataclasses.MISSING else None
        assert default == (() if entries[f.name].many else entries[f.name].default), f.name


SPEC_KEYS = {
    "defaults": Defaults,
    "ssh": ClusterSpec,
    "": ClusterSpec,
    "hosts[].topology": Topology,
}
SPEC_FIELDS = {"ssh.client": "ssh_client"}  # the spec's key, where its field is named otherwise


@pytest.mark.parametrize("flag", [f for f in OPTIONS.values() if f.spec_key], ids=str)
def test_every_spec_key_is_one_the_spec_has(flag: Flag) -> None:
    assert flag.spec_key is not None
    section, _, key = flag.spec_key.rpartition(".")
    key = SPEC_FIELDS.get(flag.spec_key, key)
    names = {f.name for f in fields(SPEC_KEYS[section])}
    assert key in names, flag.spec_key


# ---------------------------------------------------------------- a new option is one entry

FAKE = Flag(
    "fake_knob", ("--fake-knob",), Int, None, "Running", "A knob.", "defaults.fake", field=False
)


def with_fake(**changes: Any) -> dict[str, Flag]:
    return {**OPTIONS, "fake_knob": dataclasses.replace(FAKE, **changes)}


def test_a_new_entry_is_a_typer_parameter_of_every_command_that_takes_it() -> None:
    seen: dict[str, Any] = {}
    entries = with_fake()
    app = typer.Typer(add_completion=False)

    @app.command()
    @takes("launch", entries)
    def launch(ctx: typer.Context, **given: Any) -> None:
        seen.update(given)

    params = {p.name: p for p in typer.main.get_command(app).params}
    assert list(params) == [f.name for f in taken_by("launch", entries)]
    assert params["fake_knob"].opts == ["--fake-knob"] and params["fake_knob"].help == "A knob."
    result = CliRunner().invoke(app, ["--fake-knob", "3", "--", "t.py"])
    assert result.exit_code == 0, result.output
    assert seen["fake_knob"] == 3 and seen["program"] == ["t.py"]


def test_a_new_entry_that_is_a_field_goes_into_launch_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = with_fake(field=True)
    with pytest.raises(TypeError, match=r"'fake_knob'.*LaunchOptions has no such field"):
        option_model.launch_options({"fake_knob": 3}, entries)
    extended = dataclasses.make_dataclass(
        "Extended", [("fake_knob", "int | None", None)], bases=(LaunchOptions,), frozen=True
    )
    monkeypatch.setattr(option_model, "LaunchOptions", extended)
    assert option_model.launch_options({"fake_knob": 3}, entries).fake_knob == 3  # type: ignore[attr-defined]


def test_a_new_entry_reaches_the_batch_job_unless_it_says_why_not() -> None:
    values = {"fake_knob": 3, "replicas": 2, "program": ("t.py",)}
    argv = option_model.batch_argv(values, False, with_fake())
    assert argv[-4:] == ["--replicas=2", "--fake-knob=3", "--", "t.py"]
    assert "--fake-knob=3" not in option_model.batch_argv(values, False, with_fake(batch="no"))


def test_a_new_entry_reaches_the_detach_record_unless_it_says_why_not() -> None:
    assert option_model.detached_cli({"fake_knob": 3}, with_fake()) == {"fake_knob": 3}
    assert option_model.detached_cli({"fake_knob": None}, with_fake()) == {}
    assert option_model.detached_cli({"fake_knob": 3}, with_fake(detach="the client")) == {}
    assert option_model.detached_cli({"fake_knob": 3}, with_fake(field=True)) == {}  # launch part


def test_a_new_entry_is_in_the_reference() -> None:
    text = reference(with_fake(batch="a reason for the batch job"))
    assert "| `--fake-knob` | int |  | `defaults.fake` | A knob. |" in text
    assert "- `--fake-knob`: a reason for the batch job" in text


# ---------------------------------------------------------------- the spec's defaults: keys

SPEC_TYPES = {int: "int | None", bool: "bool | None", str: "str | None"}


def test_the_spec_defaults_keys_are_the_defaults_fields_both_ways() -> None:
    assert set(SPEC_DEFAULTS) == {f.name for f in fields(Defaults)}
    for f in fields(Defaults):
        entry = SPEC_DEFAULTS[f.name]
        if entry.words:
            assert (f.type, f.default) == ("tuple[str, ...]", ()), f.name
        else:
            kind = "float | None" if entry.duration else SPEC_TYPES[entry.base]
            assert (f.type, f.default) == (kind, None), f.name


def test_a_spec_defaults_key_is_checked_as_its_entry_says() -> None:
    bad = {
        "replicas: 0": "defaults.replicas: must be at least 1, got 0",
        "devices_per_replica: -1": "defaults.devices_per_replica: must be at least 0, got -1",
        "master_port: 70000": "defaults.master_port: must be at most 65535, got 70000",
        "backend: nope": f"defaults.backend: expected one of {', '.join(REGISTRY)}, got 'nope'",
        "grace_period: -1": "defaults.grace_period: -1.0 must be 0 or more",
        "timeout: 0": "defaults.timeout: 0.0 must be more than 0",
        "mpi_args: x": "defaults.mpi_args: expected a list, got 'x'",
        "python: ''": "defaults.python: must not be empty",
    }
    for line, message in bad.items():
        with pytest.raises(SpecError) as info:
            parse_cluster(f"name: c\ndefaults:\n  {line}\n", "c.yaml")
        assert str(info.value) == f"c.yaml:3: {message}", line
    spec = parse_cluster("name: c\ndefaults:\n  mpi_args: [-x, y]\n  timeout: 2m\n", "c.yaml")
    assert spec.defaults.mpi_args == ("-x", "y") and spec.defaults.timeout == 120.0
