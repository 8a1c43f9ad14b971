"""The SSH option group, described once (``poprun_py.cli.options.SSH_FLAGS``, entries of
``OPTIONS``): every command
that should take a flag has it, as described; every command hands the flags on as one
``SshOptions``, each by its name; and one builder (``poprun_py.ssh.settings.settings_for``)
puts them before the cluster spec's values, on the ``up``/``down`` paths too, which used to
ignore the spec's ``defaults.connect_timeout``."""

from __future__ import annotations

import contextlib
import importlib
import typing
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer.main

from poprun_py.cli import run
from poprun_py.cli.app import app
from poprun_py.cli.options import EVERY, H_SSH, SSH_FLAGS
from poprun_py.cli.options import Flag as SshFlag
from poprun_py.core.spec import SshOptions
from poprun_py.errors import UsageError
from poprun_py.prepare.specfile import parse_cluster
from poprun_py.ssh.settings import settings_for

for _module in ("launch_cmd", "remote_cmd", "provision_cmd", "jobs_cmd"):
    importlib.import_module(f"poprun_py.cli.{_module}")  # registers the commands

STATIC = "name: lab\nprovider: {kind: static}\nhosts: [{name: n1}, {name: n2}]\n"
TAKES = [(command, flag) for command in EVERY for flag in SSH_FLAGS if command in flag.commands]
LACKS = [(command, flag) for command in EVERY for flag in SSH_FLAGS if command not in flag.commands]


def params_of(command: str) -> dict[str, Any]:
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in cmd.params}


def given(flag: SshFlag) -> tuple[list[str], Any]:
    """Words that give ``flag`` a value other than its default, and that value."""
    if flag.default is False:
        return [flag.decls[0]], True
    if float in typing.get_args(flag.type):
        return [flag.decls[0], "2.5"], 2.5
    if flag.name == "ssh_client":  # one of auto | paramiko | openssh
        return [flag.decls[0], "openssh"], "openssh"
    if flag.name == "fanout":  # a number of gateways
        return [flag.decls[0], "3"], 3
    return [flag.decls[0], f"/given/{flag.name}"], f"/given/{flag.name}"


def test_the_group_is_the_fields_of_ssh_options() -> None:
    assert [f.name for f in SSH_FLAGS] == [
        "connect_timeout",
        "accept_new_host_keys",
        "known_hosts",
        "ssh_config",
        "ssh_client",
        "fanout",
        "identity",
        "user",
    ]
    assert {f.name for f in SSH_FLAGS} == {f.name for f in fields(SshOptions)}
    assert all(f.default == getattr(SshOptions(), f.name) for f in SSH_FLAGS)


@pytest.mark.parametrize(("command", "flag"), TAKES, ids=[f"{c}-{f.name}" for c, f in TAKES])
def test_every_command_that_should_take_a_flag_has_it_as_described(
    command: str, flag: SshFlag
) -> None:
    param = params_of(command).get(flag.name)
    assert param is not None, f"{command} lacks {flag.decls[0]}"
    assert tuple(param.opts) == flag.decls
    assert (param.default, param.help) == (flag.default, flag.help)
    assert param.rich_help_panel == H_SSH


@pytest.mark.parametrize(("command", "flag"), LACKS, ids=[f"{c}-{f.name}" for c, f in LACKS])
def test_a_command_outside_a_flags_list_has_no_ssh_flag_of_that_name(
    command: str, flag: SshFlag
) -> None:
    param = params_of(command).get(flag.name)
    # up and down have an --accept-new-host-keys of their own: the provider's trust in fresh
    # static nodes, outside the SSH panel; jobs has none
    assert param is None or (command in ("up", "down") and param.rich_help_panel != H_SSH)


def test_the_help_shows_every_flag_with_its_help() -> None:
    from typer.testing import CliRunner

    for command in EVERY:
        out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output
        for flag in SSH_FLAGS:
            if command in flag.commands:
                assert flag.decls[0] in out and flag.help[:30] in out, (command, flag.name)


class Captured(UsageError):
    """Raised by a seam once it has what the command built (exit 2, nothing done)."""


def argv_of(command: str, words: list[str], spec: Path) -> list[str]:
    if command in ("up", "down"):
        return [command, str(spec), *words]
    if command == "exec":
        return [command, "-H", "n1", *words, "--", "true"]
    if command in ("sync", "jobs"):
        return [command, "-H", "n1", *words]
    return [command, "-H", "n1", *words, "true"]  # plan, render, launch, check


@pytest.fixture
def seams(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Each command's hand-off point, replaced: it records what the command built."""
    from poprun_py.cli import launch_cmd, remote_cmd
    from poprun_py.jobs import finder
    from poprun_py.providers import lifecycle

    seen: dict[str, Any] = {}
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def prepare(opts: Any, environ: Any = None) -> Any:
        seen["ssh"] = opts.ssh
        raise Captured("prepared")

    @contextlib.contextmanager
    def connected(hosts: Any, cluster: Any, ssh: SshOptions) -> Iterator[Any]:
        seen["ssh"] = ssh
        raise Captured("connected")
        yield  # pragma: no cover

    def all_jobs(hosts: Any, cluster: Any, ssh: SshOptions) -> Any:
        seen["ssh"] = ssh
        return [], []

    def provisioning(spec: Any, **kw: Any) -> Any:
        seen.update(kw)
        raise Captured("provisioned")

    monkeypatch.setattr(launch_cmd, "prepare", prepare)
    monkeypatch.setattr(remote_cmd, "_connected", connected)
    monkeypatch.setattr(finder, "all_jobs", all_jobs)
    monkeypatch.setattr(lifecycle, "up", provisioning)
    monkeypatch.setattr(lifecycle, "down", provisioning)
    return seen


@pytest.mark.parametrize("command", EVERY)
def test_every_command_hands_its_flags_on_as_ssh_options_by_name(
    command: str, seams: dict[str, Any], tmp_path: Path
) -> None:
    spec = tmp_path / "lab.yaml"
    spec.write_text(STATIC)
    words: list[str] = []
    expected: dict[str, Any] = {}
    for flag in SSH_FLAGS:
        if command in flag.commands:
            flag_words, value = given(flag)
            words += flag_words
            expected[flag.name] = value
    if command in ("up", "down"):
        words.append("--accept-new-host-keys")  # the provider's own flag
    run(argv_of(command, words, spec))
    assert seams["ssh"] == SshOptions(**expected)
    if command in ("up", "down"):  # it goes to the provider, not among the SSH flags
        assert seams["accept_new_host_keys"] is True


def spec_setting(key: str, value: Any) -> str:
    """A cluster spec that sets ``key`` (``ssh.known_hosts``) to ``value``."""
    section, name = key.split(".")
    return f"name: lab\nhosts: [{{name: n1}}]\n{section}: {{{name}: {value}}}\n"


KEYED = [f for f in SSH_FLAGS if f.spec_key]


@pytest.mark.parametrize("flag", KEYED, ids=[f.name for f in KEYED])
def test_a_flag_comes_before_its_spec_key(flag: SshFlag) -> None:
    spec_value = 4.0 if float in typing.get_args(flag.type) else f"/spec/{flag.name}"
    spec_value = "paramiko" if flag.name == "ssh_client" else spec_value
    assert flag.spec_key is not None
    spec = parse_cluster(spec_setting(flag.spec_key, spec_value), "lab.yaml")

    def built(ssh: SshOptions) -> Any:
        value = getattr(settings_for(spec, ssh), flag.name)
        return value if isinstance(value, float) else str(value)

    assert built(SshOptions()) == spec_value
    _, flag_value = given(flag)
    assert built(SshOptions(**{flag.name: flag_value})) == flag_value


def test_the_spec_key_is_named_in_the_flags_help() -> None:
    assert all("the cluster spec's" in f.help for f in KEYED)


# --- up and down: the spec's defaults.connect_timeout, which the provider paths ignored ---

TIMED = STATIC + "defaults: {connect_timeout: 4}\nsetup: 'true'\n"


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The settings every provider step reaches the hosts with (nothing is reached)."""
    from poprun_py.providers import lifecycle, reach, setup

    settings: list[Any] = []

    def probe(s: Any) -> Any:
        settings.append(("wait", s))
        return lambda host: None

    def run_setup(hosts: Any, name: str, script: str, s: Any, reporter: Any) -> Any:
        settings.append(("setup", s))
        return ()

    def clean_setup(hosts: Any, name: str, s: Any) -> Any:
        settings.append(("clean", s))
        return []

    monkeypatch.setattr(reach, "ssh_probe", probe)
    monkeypatch.setattr(lifecycle, "run_setup", run_setup)
    monkeypatch.setattr(setup, "clean_setup", clean_setup)
    return settings


def timeouts(settings: list[Any]) -> dict[str, float]:
    return {step: s.connect_timeout for step, s in settings}


def test_up_and_down_use_the_specs_connect_timeout(reached: list[Any], tmp_path: Path) -> None:
    from poprun_py.providers.lifecycle import down, up

    spec = parse_cluster(TIMED, "lab.yaml")
    up(spec, root=tmp_path)
    down(spec, root=tmp_path)
    assert timeouts(reached) == {"wait": 4.0, "setup": 4.0, "clean": 4.0}


def test_up_and_downs_connect_timeout_flag_comes_before_the_spec(
    reached: list[Any], tmp_path: Path
) -> None:
    from poprun_py.providers.lifecycle import down, up

    spec = parse_cluster(TIMED, "lab.yaml")
    flags = SshOptions(connect_timeout=2.5, user="ops")
    up(spec, root=tmp_path, ssh=flags)
    down(spec, root=tmp_path, ssh=flags)
    assert timeouts(reached) == {"wait": 2.5, "setup": 2.5, "clean": 2.5}
    assert {s.user for _, s in reached} == {"ops"}


def test_without_flag_or_spec_value_the_providers_default_stays(
    reached: list[Any], tmp_path: Path
) -> None:
    from poprun_py.providers.lifecycle import down, up

    spec = parse_cluster(STATIC, "lab.yaml")
    up(spec, root=tmp_path, wait_timeout=3)
    down(spec, root=tmp_path)
    assert timeouts(reached) == {"wait": 3.0, "clean": 10.0}  # wait: within the wait itself


@pytest.mark.parametrize("command", ["up", "down"])
def test_a_bad_connect_timeout_stops_up_and_down_before_anything_is_done(
    command: str, reached: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from poprun_py.providers.state import STATE_ENV, ClusterState

    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))
    spec = tmp_path / "lab.yaml"
    spec.write_text(TIMED)
    assert run([command, str(spec), "--connect-timeout", "0"]) == 2
    assert reached == []
    assert ClusterState.of("lab").load() is None


@pytest.mark.parametrize("command", ["exec", "sync", "jobs", "launch"])
def test_a_bad_connect_timeout_is_one_line_and_exit_2(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    argv = argv_of(command, ["--connect-timeout", "0"], tmp_path / "unused.yaml")
    assert run(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--connect-timeout must be more than 0" in err[0], err
