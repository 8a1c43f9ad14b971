"""SSH settings reach every remote command the same way: one option set (``--ssh-config``,
``--identity``, ``--user``, ``--known-hosts``, ``--accept-new-host-keys``, ``--connect-timeout``)
on launch, plan, render, exec and sync; flags first, then the cluster spec's ``ssh:``, also when
``--hosts`` picks hosts out of a spec (``-c spec.yaml --hosts ...``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import typer.main

from poprun_py.cli.app import app
from poprun_py.core.hosts import parse_hosts
from poprun_py.core.spec import SshOptions, cluster_from_hosts
from poprun_py.errors import UsageError
from poprun_py.launch import launcher
from poprun_py.prepare.job import LaunchOptions, prepare, ssh_settings
from poprun_py.prepare.specfile import parse_cluster, target_cluster

SSH_OPTIONS = {
    "--ssh-config",
    "--identity",
    "--user",
    "--known-hosts",
    "--accept-new-host-keys",
    "--connect-timeout",
}
SPEC = """\
name: lab
ssh: {known_hosts: /etc/lab/known_hosts, ssh_config: /etc/lab/ssh_config}
defaults: {connect_timeout: 4}
env: {A: "1"}
hosts:
  - {name: n1, address: 198.18.7.11, user: ops}
  - {name: n2, address: 198.18.7.12}
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(SPEC)
    return path


def options_of(command: str) -> set[str]:
    importlib.import_module("poprun_py.cli.launch_cmd")  # registers plan, render, launch
    importlib.import_module("poprun_py.cli.remote_cmd")  # registers exec, sync
    importlib.import_module("poprun_py.cli.provision_cmd")  # registers up, down
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {d for p in cmd.params if p.param_type_name == "option" for d in p.opts}


@pytest.mark.parametrize("command", ["launch", "plan", "render", "exec", "sync", "up", "down"])
def test_every_remote_command_takes_the_same_ssh_options(command: str) -> None:
    assert options_of(command) >= SSH_OPTIONS


def test_hosts_picked_from_a_spec_keep_its_ssh_settings() -> None:
    base = parse_cluster(SPEC, "lab.yaml")
    picked = cluster_from_hosts(parse_hosts("n2,extra"), base=base)
    assert (picked.known_hosts, picked.ssh_config) == (
        "/etc/lab/known_hosts",
        "/etc/lab/ssh_config",
    )
    assert picked.env == {"A": "1"} and picked.defaults.connect_timeout == 4
    assert [h.name for h in picked.hosts] == ["n2", "extra"]
    assert picked.host("n2").address == "198.18.7.12"


def test_launch_with_spec_and_hosts_uses_the_specs_ssh_settings(spec_file: Path) -> None:
    opts = LaunchOptions(program=("true",), cluster=str(spec_file), hosts="n1", backend="ssh")
    settings = launcher.ssh_settings(prepare(opts, environ={}))
    assert settings.known_hosts == Path("/etc/lab/known_hosts")
    assert settings.ssh_config == Path("/etc/lab/ssh_config")
    assert settings.connect_timeout == 4.0


def test_launch_flags_override_the_spec(spec_file: Path) -> None:
    opts = LaunchOptions(
        program=("true",),
        cluster=str(spec_file),
        hosts="n1,n2",
        backend="ssh",
        ssh_config="/mine/config",
        known_hosts="/mine/known",
        identity="/mine/key",
        user="me",
        accept_new_host_keys=True,
        connect_timeout=2.5,
    )
    prep = prepare(opts, environ={})
    settings = launcher.ssh_settings(prep)
    assert (settings.ssh_config, settings.known_hosts) == (
        Path("/mine/config"),
        Path("/mine/known"),
    )
    assert (settings.identity_file, settings.user) == ("/mine/key", "me")
    assert settings.accept_new_host_keys and settings.connect_timeout == 2.5
    assert prep.plan.cluster.ssh_config == "/mine/config"  # what Open MPI's own ssh gets too


def test_exec_and_sync_resolve_as_launch_does(spec_file: Path) -> None:
    spec = target_cluster("n1", str(spec_file))
    settings = ssh_settings(spec, SshOptions())
    assert settings.known_hosts == Path("/etc/lab/known_hosts")
    assert settings.ssh_config == Path("/etc/lab/ssh_config")
    assert settings.connect_timeout == 4.0
    flagged = ssh_settings(spec, SshOptions(ssh_config="/x", user="u", connect_timeout=1))
    assert (flagged.ssh_config, flagged.user, flagged.connect_timeout) == (Path("/x"), "u", 1.0)


def test_a_bad_connect_timeout_is_refused() -> None:
    spec = cluster_from_hosts(parse_hosts("h1"))
    with pytest.raises(UsageError, match="--connect-timeout must be more than 0"):
        ssh_settings(spec, SshOptions(connect_timeout=0))


def test_up_and_down_put_the_flags_before_what_the_provider_recorded() -> None:
    from poprun_py.providers.reach import ssh_settings as provisioned

    recorded = provisioned(known_hosts="/state/kh", ssh_config="/state/cfg")
    assert (str(recorded.known_hosts), recorded.user) == ("/state/kh", None)
    flags = SshOptions(ssh_config="/mine/cfg", identity="/mine/key", user="ops", connect_timeout=2)
    given = provisioned(known_hosts="/state/kh", ssh_config="/state/cfg", flags=flags)
    assert str(given.known_hosts) == "/state/kh"  # not given: the provider's
    assert (given.user, given.connect_timeout) == ("ops", 2)
    assert (str(given.ssh_config), given.identity_file) == ("/mine/cfg", "/mine/key")
    with pytest.raises(UsageError, match="--connect-timeout"):
        provisioned(known_hosts=None, flags=SshOptions(connect_timeout=0))
