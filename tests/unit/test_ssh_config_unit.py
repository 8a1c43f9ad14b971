"""SSH configuration and host-key pieces without a remote host: ``ssh -G`` output mapping, the
fallback reader's Include handling, tokens, ProxyJump hops, and host certificates made by a real
``ssh-keygen -s`` checked as OpenSSH checks them."""

from __future__ import annotations

import base64
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from poprun_py.core.spec import HostSpec
from poprun_py.errors import UsageError
from poprun_py.ssh.config import endpoint_from, expand, openssh_options
from poprun_py.ssh.config_parser import FallbackConfig
from poprun_py.ssh.errors import HostKeyError
from poprun_py.ssh.known_hosts import (
    HostKey,
    KnownHosts,
    parse_certificate,
    parse_known_hosts,
    preferred_key_types,
    verify_host_key,
)
from poprun_py.ssh.settings import Endpoint, Hop, SshSettings, tilde

needs_ssh = pytest.mark.requires("ssh")
needs_keygen = pytest.mark.requires("ssh-keygen")


# ---------------------------------------------------------------- hops and tokens


@pytest.mark.parametrize(
    ("text", "hop"),
    [
        ("bastion", Hop("bastion")),
        ("admin@bastion:2222", Hop("bastion", "admin", 2222)),
        ("ssh://u@[fe80::1]:22", Hop("fe80::1", "u", 22)),
        ("fe80::1", Hop("fe80::1")),
    ],
)
def test_proxyjump_hops_parse(text: str, hop: Hop) -> None:
    assert Hop.parse(text) == hop


def test_bad_hop_is_bad_input() -> None:
    with pytest.raises(UsageError, match="bad ProxyJump hop"):
        Hop.parse("host:port")


def test_tokens_expand_where_openssh_does() -> None:
    values = {"h": "10.0.0.5", "p": "22", "%": "%", "n": "n1"}
    assert expand("/k/%n_%h:%p%%x%Z", values) == "/k/n1_10.0.0.5:22%x%Z"


# ---------------------------------------------------------------- ssh -G


@needs_ssh
def test_ssh_g_options_become_an_endpoint(tmp_path: Path) -> None:
    inc = tmp_path / "inc.conf"
    inc.write_text(
        "Host n1\n  HostName 198.18.9.1\n  Port 2200\n  ProxyJump j1,ops@j2:2222\n"
        "  IdentityFile %d/id_%h\n  CertificateFile /c/%n-cert.pub\n  HostKeyAlias nodes\n"
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  IdentityAgent none\n"
        "  ConnectTimeout 3\n"
    )
    config = tmp_path / "config"
    config.write_text(f"Include {inc}\nHost *\n  User alice\n  IdentityFile /k/second\n")
    options = openssh_options("n1", config, None, None)
    ep = endpoint_from(HostSpec("n1"), SshSettings(), options)
    assert (ep.hostname, ep.port, ep.user) == ("198.18.9.1", 2200, "alice")
    assert ep.jumps == (Hop("j1"), Hop("j2", "ops", 2222))
    home = pwd.getpwuid(os.getuid()).pw_dir  # ssh's %d: the passwd home, whatever $HOME says
    assert ep.identity_files == (f"{home}/id_198.18.9.1", "/k/second")
    assert ep.certificate_files == ("/c/n1-cert.pub",)
    assert ep.key_names == ("[nodes]:2200",) and ep.strict == "no" and ep.accept_new
    assert ep.record_to is None and ep.identity_agent == "none" and ep.connect_timeout == 3.0


@needs_ssh
def test_ssh_g_user_and_port_flags_reach_match(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Match user bob\n  HostName 198.18.9.7\n")
    options = openssh_options("n1", config, "bob", 2022)
    ep = endpoint_from(HostSpec("n1", user="bob", port=2022), SshSettings(), options)
    assert (ep.hostname, ep.port, ep.user) == ("198.18.9.7", 2022, "bob")


@needs_ssh
def test_ssh_g_errors_name_file_and_line(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host x\n  NoSuchThing 1\n")
    with pytest.raises(UsageError, match=r"config: line 2: Bad configuration option"):
        openssh_options("x", config, None, None)
    loop = tmp_path / "loop"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(UsageError, match=r"loop line 1: Include nested too deep"):
        openssh_options("x", loop, None, None)


def test_accept_new_flag_and_proxy_command_tokens() -> None:
    options = {"proxycommand": ["ssh -W %h:%p jump"], "stricthostkeychecking": ["ask"]}
    ep = endpoint_from(HostSpec("n1"), SshSettings(accept_new_host_keys=True), options)
    assert ep.proxy_command == "ssh -W n1:22 jump" and ep.strict == "accept-new"


# ---------------------------------------------------------------- the fallback reader


def test_fallback_include_relative_nested_and_system_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setattr("poprun_py.ssh.config_parser.user_home", lambda: str(home))
    (home / ".ssh" / "config").write_text("Host n*\n  Include conf.d/*.conf\n  Port 2200\n")
    (home / ".ssh" / "conf.d" / "a.conf").write_text("User ops\nHost other\n  User nobody\n")
    system = tmp_path / "etc" / "ssh_config"
    system.parent.mkdir()
    (system.parent / "sys.conf").write_text("IdentityFile /sys/key\n")
    system.write_text("Include sys.conf\nHost *\n  User late\n  Port 1\n")
    cfg = FallbackConfig.load(None, system=system)
    n1 = cfg.lookup("n1")
    assert n1["user"] == ["ops"] and n1["port"] == ["2200"]  # the Host line after the include
    assert n1["identityfile"] == ["/sys/key"]  # the system file, after the user's
    assert cfg.lookup("zz")["user"] == ["late"]


def test_home_is_the_passwd_entrys_as_for_openssh_not_home_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # ssh reads neither ~ nor ~/.ssh from $HOME
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert tilde("~/.ssh/id_x") == f"{home}/.ssh/id_x" and tilde("~") == home
    assert tilde("/abs/~x") == "/abs/~x" and tilde("rel") == "rel"
    ep = endpoint_from(HostSpec("n1"), SshSettings(), {})
    assert Path(home, ".ssh", "known_hosts") in ep.known_hosts
    assert all(not str(p).startswith(str(tmp_path)) for p in ep.known_hosts)


def test_fallback_bad_lines_and_loops_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("Host x\n  Port\n")
    with pytest.raises(UsageError, match=r"bad line 2: expected 'Keyword value'"):
        FallbackConfig.load(bad)
    with pytest.raises(UsageError, match="cannot read ssh config"):
        FallbackConfig.load(tmp_path / "missing")


# ---------------------------------------------------------------- host certificates


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _certify(tmp_path: Path, *args: str) -> tuple[HostKey, str]:
    """A host key certified by a CA with ``args``; (the HostKey, the CA's public line)."""
    if not (tmp_path / "ca").exists():
        _keygen(tmp_path / "ca")
        _keygen(tmp_path / "host")
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(tmp_path / "ca"), "-I", "id", *args,
         str(tmp_path / "host.pub")], check=True)  # fmt: skip
    cert = base64.b64decode((tmp_path / "host-cert.pub").read_text().split()[1])
    plain = base64.b64decode((tmp_path / "host.pub").read_text().split()[1])
    ca = " ".join((tmp_path / "ca.pub").read_text().split()[:2])
    return HostKey("ssh-ed25519", plain, cert), ca


def _ep(tmp_path: Path, name: str = "n1.lab", port: int = 22) -> Endpoint:
    names = (name,) if port == 22 else (f"[{name}]:{port}",)
    return Endpoint(
        name=name,
        hostname=name,
        port=port,
        user="root",
        identity_files=(),
        explicit_identity=False,
        key_names=names,
        known_hosts=(tmp_path / "kh",),
        record_to=None,
    )


@needs_keygen
def test_host_certificate_from_a_trusted_ca_is_accepted(tmp_path: Path) -> None:
    key, ca = _certify(tmp_path, "-h", "-n", "n1.lab")
    cert = parse_certificate(key.cert or b"")
    assert cert.cert_type == 2 and cert.principals == ("n1.lab",) and cert.key_id == "id"
    (tmp_path / "kh").write_text(f"@cert-authority *.lab {ca}\n")
    verify_host_key(_ep(tmp_path), key, KnownHosts())
    verify_host_key(_ep(tmp_path, port=2222), key, KnownHosts())  # [n1.lab]:2222 matches *.lab


@needs_keygen
@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("-h", "-n", "other.lab"), "not among its principals"),
        (("-n", "n1.lab"), "not a host certificate"),
        (("-h", "-n", "n1.lab", "-V", "20000101:20010101"), "expired"),
    ],
)
def test_bad_host_certificates_are_refused(tmp_path: Path, args: tuple[str, ...], why: str) -> None:
    key, ca = _certify(tmp_path, *args)
    (tmp_path / "kh").write_text(f"@cert-authority * {ca}\n")
    with pytest.raises(HostKeyError, match=why):
        verify_host_key(_ep(tmp_path), key, KnownHosts())


@needs_keygen
def test_forged_signature_and_revoked_ca_are_refused(tmp_path: Path) -> None:
    key, ca = _certify(tmp_path, "-h", "-n", "n1.lab")
    cert = key.cert or b""
    forged = HostKey(key.key_type, key.blob, cert[:-1] + bytes([cert[-1] ^ 1]))  # always differs
    (tmp_path / "kh").write_text(f"@cert-authority * {ca}\n")
    with pytest.raises(HostKeyError, match="signature does not verify"):
        verify_host_key(_ep(tmp_path), forged, KnownHosts())
    (tmp_path / "kh").write_text(f"@cert-authority * {ca}\n@revoked * {ca}\n")
    with pytest.raises(HostKeyError, match="@revoked"):
        verify_host_key(_ep(tmp_path), key, KnownHosts())


@needs_keygen
def test_certificate_without_a_matching_ca_falls_back_to_the_plain_key(tmp_path: Path) -> None:
    key, _ = _certify(tmp_path, "-h", "-n", "n1.lab")
    plain = " ".join((tmp_path / "host.pub").read_text().split()[:2])
    (tmp_path / "kh").write_text(f"n1.lab {plain}\n")
    verify_host_key(_ep(tmp_path), key, KnownHosts())


def test_cert_types_are_asked_for_first_when_a_ca_is_trusted() -> None:
    keys = parse_known_hosts("@cert-authority * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPs=\n")
    offered = ["ssh-ed25519", "rsa-sha2-512", "ssh-ed25519-cert-v01@openssh.com"]
    assert preferred_key_types(keys, offered)[0] == "ssh-ed25519-cert-v01@openssh.com"
    assert preferred_key_types([], offered)[-1] == "ssh-ed25519-cert-v01@openssh.com"


@needs_ssh
def test_user_flag_is_for_the_hosts_not_their_jump_hosts(tmp_path: Path) -> None:
    from poprun_py.ssh.config import Resolver

    config = tmp_path / "config"
    config.write_text("Host j1\n  User alice\nHost n1\n  ProxyJump j1,j2\n")
    resolver = Resolver(SshSettings(user="bob", ssh_config=config), kind="openssh")
    assert resolver.endpoint(HostSpec("n1")).user == "bob"
    assert resolver.hop(Hop("j1")).user == "alice"
    assert resolver.hop(Hop("j2", user="carol")).user == "carol"
    assert set(resolver.seconds) == {"n1", "j1", "j2"}
