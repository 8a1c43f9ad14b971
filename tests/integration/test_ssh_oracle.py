"""OpenSSH as the oracle: for a matrix of client set-ups on real sshd test hosts,
``ssh -o BatchMode=yes HOST true`` and ``poprun-py exec --hosts HOST -- true`` must agree (both get
in, or both are refused, poprun-py's refusal one clear line).

Topology (one 4-host cluster for the module): ``bastion`` is reachable; ``inner1`` and ``inner2``
are reachable only through it (a ``blackhole`` host route in the root namespace); ``certs`` runs a
second sshd on port 2222 presenting a host certificate (signed with ``ssh-keygen -s``) and
trusting a user CA, and a third on 2223 with a certificate for the wrong principal. Both tools
are pointed at the same config file (``-F`` / ``--ssh-config``) and known_hosts files, never at
``~/.ssh``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from poprun_py.providers.netns import TestCluster, TestHost
from poprun_py.ssh.config import RESOLVER_ENV
from tests import requirements
from tests.hostfixtures import _Clusters, add_route, delete_route
from tests.integration.helpers import sessions_started, strays

PY = sys.executable


@dataclass(frozen=True)
class Lab:
    """The module's topology and the client-side files both tools share."""

    cluster: TestCluster
    bastion: TestHost
    inner1: TestHost
    inner2: TestHost
    certs: TestHost
    dir: Path
    key: Path  # authorized on every host's port 22
    user_key: Path  # not authorized anywhere; has a user certificate
    host_ca_pub: str
    known: Path  # plain known_hosts of every host's port 22

    def host_key(self, host: TestHost) -> str:
        pub = self.cluster.state_dir / "hosts" / host.name / "ssh_host_ed25519_key.pub"
        return " ".join(pub.read_text().split()[:2])


def _run(argv: list[str], timeout: float = 30.0, **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done.stdout


def _extra_sshd(lab_dir: Path, cluster: TestCluster, host: TestHost, port: int, extra: str) -> None:
    """A second sshd in ``host``'s namespace on ``port``: its config plus ``extra`` lines."""
    base = (cluster.state_dir / "hosts" / host.name / "sshd_config").read_text()
    conf = lab_dir / f"sshd_{host.name}_{port}"
    text = base.replace("Port 22\n", f"Port {port}\n").replace(
        "PidFile ", f"PidFile {lab_dir}/sshd_{port}.pid\n# was: "
    )
    conf.write_text(text + extra)
    log = lab_dir / f"sshd_{port}.log"
    _run(["ip", "netns", "exec", host.netns, "/usr/sbin/sshd", "-f", str(conf), "-E", str(log)])
    deadline = time.monotonic() + 10
    while True:
        import socket

        try:
            with socket.create_connection((host.address, port), timeout=0.2):
                return
        except OSError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)


def _certify_host(lab_dir: Path, cluster: TestCluster, host: TestHost, principal: str) -> Path:
    """A copy of ``host``'s key with a host certificate for ``principal`` (and, when that is the
    host's name, its address: ssh checks the HostName)."""
    key = cluster.state_dir / "hosts" / host.name / "ssh_host_ed25519_key"
    copy = lab_dir / f"hostkey_{principal}"
    shutil.copy(key, copy)
    shutil.copy(f"{key}.pub", f"{copy}.pub")
    os.chmod(copy, 0o600)
    ca = str(lab_dir / "host_ca")
    names = f"{principal},{host.address}" if principal == host.name else principal
    _run(["ssh-keygen", "-q", "-s", ca, "-I", principal, "-h", "-n", names, f"{copy}.pub"])
    return copy


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    clusters = _Clusters()
    routes: list[str] = []
    try:
        cluster = clusters.make(4, "o")
        bastion, inner1, inner2, certs = cluster.hosts
        d = tmp_path_factory.mktemp("oracle")
        for ca in ("host_ca", "user_ca"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / ca)])
        user_key = d / "user_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(user_key)])
        _run(["ssh-keygen", "-q", "-s", str(d / "user_ca"), "-I", "u", "-n", "root",
              f"{user_key}.pub"])  # fmt: skip
        good = _certify_host(d, cluster, certs, certs.name)
        bad = _certify_host(d, cluster, certs, "someone-else")
        trust = f"TrustedUserCAKeys {d / 'user_ca.pub'}\n"
        for port, key in ((2222, good), (2223, bad)):
            extra = f"HostKey {key}\nHostCertificate {key}-cert.pub\n{trust}"
            _extra_sshd(d, cluster, certs, port, extra.replace(f"HostKey {key}\n", ""))
        for host in (inner1, inner2):  # recorded: a killed session's go with the next session
            add_route("blackhole", host.address)
            routes.append(host.address)
        yield Lab(
            cluster,
            bastion,
            inner1,
            inner2,
            certs,
            d,
            cluster.identity_file,
            user_key,
            (d / "host_ca.pub").read_text().strip(),
            cluster.known_hosts,
        )
    finally:
        try:
            for address in routes:
                delete_route("blackhole", address)
        finally:
            clusters.destroy_all()


# ---------------------------------------------------------------- the two clients


@dataclass(frozen=True)
class Outcome:
    ssh: subprocess.CompletedProcess[str]
    poprun: subprocess.CompletedProcess[str]

    @property
    def agree(self) -> bool:
        return (self.ssh.returncode == 0) == (self.poprun.returncode == 0)


MODE = {"name": "openssh", "resolver": "openssh", "client": ""}
CLIENT_MODE = "openssh-client"  # ssh -G, and OpenSSH's client as the transport (--ssh-client)


@pytest.fixture(scope="module", params=["openssh", "paramiko", CLIENT_MODE], autouse=True)
def _resolver(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every case runs with ``ssh -G`` and with the fallback reader (over Paramiko, as
    ``auto`` chooses for these set-ups), and over OpenSSH's client (issue 24)."""
    over_openssh = request.param == CLIENT_MODE
    MODE["name"] = request.param
    MODE["resolver"] = "openssh" if over_openssh else request.param
    MODE["client"] = "openssh" if over_openssh else ""
    yield
    MODE.update(name="openssh", resolver="openssh", client="")


def both(
    lab: Lab, name: str, config: str, host: str, files: dict[str, str] | None = None
) -> Outcome:
    """Write ``config`` (``{d}`` is a fresh directory per tool, for files a tool may change)
    and run both clients; each gets its own copy of ``files`` (name -> text) in ``{d}``."""
    results = []
    for tool in ("ssh", "poprun"):
        d = lab.dir / MODE["name"] / name / tool
        d.mkdir(parents=True)
        for fname, text in (files or {}).items():
            (d / fname).parent.mkdir(parents=True, exist_ok=True)
            (d / fname).write_text(fill(lab, text, d))
        cfg = d / "config"
        cfg.write_text(fill(lab, config, d))
        if tool == "ssh":
            argv = ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", host, "true"]
            if os.environ.get("ORACLE_DEBUG"):
                argv.insert(1, "-vv")
        else:
            argv = [PY, "-m", "poprun_py", "exec", "--hosts", host, "--ssh-config", str(cfg)]
            argv += ["--ssh-client", MODE["client"]] if MODE["client"] else []
            argv += ["--", "true"]
        env = {**os.environ, "SSH_AUTH_SOCK": "", RESOLVER_ENV: MODE["resolver"]}
        results.append(
            subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, env=env)
        )
    return Outcome(*results)


def fill(lab: Lab, text: str, d: Path) -> str:
    """``{d}``, ``{lab}`` and ``{key}`` in ``text`` replaced."""
    return text.replace("{d}", str(d)).replace("{lab}", str(lab.dir)).replace("{key}", str(lab.key))


def assert_agree(out: Outcome, *, get_in: bool) -> None:
    detail = f"ssh: {out.ssh.returncode} {out.ssh.stderr!r}; poprun-py: {out.poprun.returncode} "
    detail += repr(out.poprun.stderr)
    assert out.agree, detail
    assert (out.ssh.returncode == 0) == get_in, detail
    if not get_in:  # poprun-py's refusal: one clear line
        lines = [ln for ln in out.poprun.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("poprun-py: "), detail


def block(alias: str, host: TestHost, port: int = 22, **more: str) -> str:
    """A Host block reaching ``host`` as root with the lab's key and known_hosts."""
    lines = [f"Host {alias}", f"  HostName {host.address}", f"  Port {port}", "  User root"]
    lines += ["  IdentityFile {key}", "  IdentitiesOnly yes", "  GlobalKnownHostsFile /dev/null"]
    if "UserKnownHostsFile" not in more:
        lines.append("  UserKnownHostsFile {lab}/known")
    lines += [f"  {k} {v}" for k, v in more.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module", autouse=True)
def _shared_known_hosts(lab: Lab) -> None:
    (lab.dir / "known").write_text(lab.known.read_text())


# ---------------------------------------------------------------- configuration semantics


def test_plain_config(lab: Lab) -> None:
    assert_agree(both(lab, "plain", block("b", lab.bastion), "b"), get_in=True)


def test_include_only_config_with_glob_and_nesting(lab: Lab) -> None:
    files = {
        "inc/a.conf": "Include {d}/nested/*.conf\n",
        "inc/z.conf": block("other", lab.certs),
        "nested/b.conf": block("b", lab.bastion),
    }
    assert_agree(both(lab, "include", "Include {d}/inc/*.conf\n", "b", files), get_in=True)


def test_include_inside_host_block(lab: Lab) -> None:
    inner = "  HostName {h}\n  User root\n  IdentityFile {k}\n  IdentitiesOnly yes\n"
    files = {"inner.conf": inner.format(h=lab.bastion.address, k=lab.key)}
    config = "Host b\n  Include {d}/inner.conf\n  UserKnownHostsFile {lab}/known\n"
    assert_agree(both(lab, "include-in-host", config, "b", files), get_in=True)


def test_include_loop_is_bad_input_naming_file_and_line(lab: Lab) -> None:
    files = {"loop.conf": "Include {d}/loop.conf\n"}
    out = both(lab, "include-loop", "Host b\n  Include {d}/loop.conf\n", "b", files)
    assert out.ssh.returncode != 0
    assert out.poprun.returncode == 2, out.poprun.stderr
    lines = out.poprun.stderr.strip().splitlines()
    assert len(lines) == 1 and "loop.conf line 1" in lines[0], lines


def test_malformed_and_unreadable_configs_are_bad_input(lab: Lab) -> None:
    out = both(lab, "malformed", block("b", lab.bastion) + "  NoSuchOption yes\n", "b")
    assert out.ssh.returncode != 0
    if MODE["resolver"] == "paramiko":  # documented (docs/ssh.md): ignored, not refused
        assert out.poprun.returncode == 0, out.poprun.stderr
    else:
        assert out.poprun.returncode == 2
        lines = out.poprun.stderr.strip().splitlines()
        assert len(lines) == 1
        assert re.search(r"config: line \d+: Bad configuration option", lines[0])
    missing = subprocess.run(
        [PY, "-m", "poprun_py", "exec", "--hosts", "b", "--ssh-config", "/nonexistent", "--",
         "true"], check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_match_host_originalhost_and_negation(lab: Lab) -> None:
    rest = block("*", lab.bastion).split("\n", 2)[2]  # Port, User, IdentityFile...
    addr = lab.bastion.address
    config = f"Match originalhost b !host {lab.certs.address}\n  HostName {addr}\n" + rest
    assert_agree(both(lab, "match", config, "b"), get_in=True)
    negated = f"Host b\n  HostName {addr}\nMatch !originalhost b\n" + rest
    assert_agree(both(lab, "match-neg", negated, "b"), get_in=False)


def test_match_host_after_hostname_and_match_final(lab: Lab) -> None:
    addr = lab.bastion.address
    rest = block("*", lab.bastion).split("\n", 2)[2]
    first_pass = f"Host b\n  HostName {addr}\nMatch host {addr}\n" + rest
    assert_agree(both(lab, "match-host", first_pass, "b"), get_in=True)
    final = f"Host b\n  HostName {addr}\nMatch final host {addr}\n" + rest
    assert_agree(both(lab, "match-final", final, "b"), get_in=True)


def test_match_exec_and_final(lab: Lab) -> None:
    config = "Match exec false\n  Port 2999\n" + "Match final exec true\n"
    config += (
        block("*", lab.bastion).split("\n", 1)[1].replace(f"  HostName {lab.bastion.address}\n", "")
    )
    config = f"Host b\n  HostName {lab.bastion.address}\n" + config
    assert_agree(both(lab, "match-exec", config, "b"), get_in=True)


def test_tokens_in_identity_and_known_hosts_files(lab: Lab) -> None:
    keys = lab.dir / f"tokens-keys-{MODE['name']}"
    keys.mkdir()
    shutil.copy(lab.key, keys / f"{lab.bastion.address}-root")
    shutil.copy(lab.known, keys / "known-b-22")
    config = f"Host b\n  HostName {lab.bastion.address}\n  User root\n  IdentitiesOnly yes\n"
    config += f"  IdentityFile {keys}/%h-%r\n  UserKnownHostsFile {keys}/known-%n-%p\n"
    assert_agree(both(lab, "tokens", config, "b"), get_in=True)


def test_several_identity_files(lab: Lab) -> None:
    config = block("b", lab.bastion).replace(
        "  IdentityFile {key}\n", f"  IdentityFile {lab.user_key}\n  IdentityFile {{key}}\n"
    )
    assert_agree(both(lab, "identities", config, "b"), get_in=True)


# ---------------------------------------------------------------- ProxyJump and ProxyCommand


def _jump_config(lab: Lab, target: TestHost, jump: str) -> str:
    return block("b", lab.bastion) + block("t", target, ProxyJump=jump)


def test_inner_hosts_are_unreachable_without_a_jump(lab: Lab) -> None:
    assert_agree(both(lab, "nojump", block("t", lab.inner1), "t"), get_in=False)


def test_proxyjump_through_the_bastion(lab: Lab) -> None:
    assert_agree(both(lab, "jump", _jump_config(lab, lab.inner1, "b"), "t"), get_in=True)


def test_proxyjump_user_host_port_form(lab: Lab) -> None:
    config = block(lab.bastion.address, lab.bastion)
    config += block("t", lab.inner1, ProxyJump=f"root@{lab.bastion.address}:22")
    assert_agree(both(lab, "jump-uhp", config, "t"), get_in=True)


def test_proxyjump_chain(lab: Lab) -> None:
    config = block("b", lab.bastion) + block(lab.inner2.address, lab.inner2)
    config += block("t", lab.inner1, ProxyJump=f"b,{lab.inner2.address}")
    assert_agree(both(lab, "jump-chain", config, "t"), get_in=True)


def test_proxyjump_none_overrides_a_later_default(lab: Lab) -> None:
    config = block("b", lab.bastion) + block("t", lab.inner1, ProxyJump="none")
    config += "Host *\n  ProxyJump b\n"
    assert_agree(both(lab, "jump-none", config, "t"), get_in=False)


def test_proxyjump_to_an_unknown_host_is_one_line(lab: Lab) -> None:
    config = block("t", lab.inner1, ProxyJump="no-such-bastion.invalid")
    out = both(lab, "jump-unknown", config, "t")
    assert_agree(out, get_in=False)
    assert "no-such-bastion.invalid" in out.poprun.stderr


def test_proxycommand(lab: Lab) -> None:
    cfg = "{d}/config"
    config = block("b", lab.bastion)
    config += block("t", lab.inner1, ProxyCommand=f"ssh -F {cfg} -W %h:%p b")
    assert_agree(both(lab, "proxycommand", config, "t"), get_in=True)


# ---------------------------------------------------------------- host keys


def test_hashed_known_hosts(lab: Lab) -> None:
    config = block("b", lab.bastion, UserKnownHostsFile=str(_hashed(lab)))
    assert_agree(both(lab, "hashed", config, "b"), get_in=True)


def _hashed(lab: Lab) -> Path:
    path = lab.dir / "known-hashed"
    if not path.exists():
        path.write_text(lab.known.read_text())
        _run(["ssh-keygen", "-q", "-H", "-f", str(path)])
        assert "|1|" in path.read_text()
    return path


def test_host_key_alias(lab: Lab) -> None:
    files = {"known": f"the-alias {lab.host_key(lab.bastion)}\n"}
    config = block("b", lab.bastion, HostKeyAlias="the-alias", UserKnownHostsFile="{d}/known")
    assert_agree(both(lab, "alias", config, "b", files), get_in=True)


def test_cert_authority_host_certificate_on_another_port(lab: Lab) -> None:
    known = f"@cert-authority * {lab.host_ca_pub}\n"
    config = block("c", lab.certs, 2222, UserKnownHostsFile="{d}/known")
    out = both(lab, "cert-authority", config, "c", {"known": known})
    assert_agree(out, get_in=True)


def test_host_certificate_for_another_principal_is_refused(lab: Lab) -> None:
    known = f"@cert-authority * {lab.host_ca_pub}\n"
    config = block("c", lab.certs, 2223, UserKnownHostsFile="{d}/known")
    out = both(lab, "cert-principal", config, "c", {"known": known})
    assert_agree(out, get_in=False)
    said = "not a listed principal" if MODE["client"] else "principals"  # ssh's own words
    assert said in out.poprun.stderr


def test_revoked_ca_and_revoked_key(lab: Lab) -> None:
    known = f"@cert-authority * {lab.host_ca_pub}\n@revoked * {lab.host_ca_pub}\n"
    config = block("c", lab.certs, 2222, UserKnownHostsFile="{d}/known")
    assert_agree(both(lab, "revoked-ca", config, "c", {"known": known}), get_in=False)
    key = lab.host_key(lab.bastion)
    known = f"{lab.bastion.address} {key}\n@revoked * {key}\n"
    config = block("b", lab.bastion, UserKnownHostsFile="{d}/known")
    assert_agree(both(lab, "revoked-key", config, "b", {"known": known}), get_in=False)


def test_plain_key_on_a_non_22_port(lab: Lab) -> None:
    known = f"[{lab.certs.address}]:2222 {lab.host_key(lab.certs)}\n"
    config = block("c", lab.certs, 2222, UserKnownHostsFile="{d}/known")
    assert_agree(both(lab, "port-key", config, "c", {"known": known}), get_in=True)
    # known for the host itself only: ssh checks "without port identifier", and so do we
    portless = f"{lab.certs.address} {lab.host_key(lab.certs)}\n"
    assert_agree(both(lab, "port-key-22", config, "c", {"known": portless}), get_in=True)
    other = f"{lab.certs.address} {lab.host_key(lab.bastion)}\n"  # some other key: unknown
    assert_agree(both(lab, "port-key-other", config, "c", {"known": other}), get_in=False)


def test_strict_host_key_checking_no_with_dev_null(lab: Lab) -> None:
    config = block("b", lab.bastion, UserKnownHostsFile="/dev/null", StrictHostKeyChecking="no")
    assert_agree(both(lab, "strict-no", config, "b"), get_in=True)


def test_strict_yes_refuses_and_accept_new_records(lab: Lab) -> None:
    config = block("b", lab.bastion, UserKnownHostsFile="{d}/known", StrictHostKeyChecking="yes")
    assert_agree(both(lab, "strict-yes", config, "b", {"known": ""}), get_in=False)
    config = config.replace("StrictHostKeyChecking yes", "StrictHostKeyChecking accept-new")
    assert_agree(both(lab, "accept-new", config, "b", {"known": ""}), get_in=True)
    for tool in ("ssh", "poprun"):
        assert (lab.dir / MODE["name"] / "accept-new" / tool / "known").read_text().strip(), tool


def test_changed_key_is_refused_by_poprun_even_with_strict_no(lab: Lab) -> None:
    """The one deliberate disagreement: OpenSSH lets a changed key through with
    StrictHostKeyChecking no (for public-key logins); poprun-py never does, and says so."""
    known = f"{lab.bastion.address} {lab.host_key(lab.certs)}\n"
    config = block("b", lab.bastion, UserKnownHostsFile="{d}/known", StrictHostKeyChecking="no")
    out = both(lab, "changed", config, "b", {"known": known})
    if MODE["client"] == "openssh":  # ssh itself decides: both get in
        assert_agree(out, get_in=True)
        return
    assert out.ssh.returncode == 0
    assert out.poprun.returncode == 255
    assert "whatever StrictHostKeyChecking says" in out.poprun.stderr


# ---------------------------------------------------------------- user certificates


def test_user_certificate(lab: Lab) -> None:
    config = block("c", lab.certs, 2222, UserKnownHostsFile="{d}/known").replace(
        "{key}", str(lab.user_key)
    )
    known = f"@cert-authority * {lab.host_ca_pub}\n"
    assert_agree(both(lab, "user-cert", config, "c", {"known": known}), get_in=True)
    no_ca = block("c", lab.certs).replace("{key}", str(lab.user_key))  # port 22 trusts no CA
    assert_agree(both(lab, "user-cert-22", no_ca, "c"), get_in=False)


def test_certificate_file_option(lab: Lab) -> None:
    cert = lab.dir / "separate-cert.pub"
    shutil.copy(f"{lab.user_key}-cert.pub", cert)
    key = lab.dir / "separate-key"
    shutil.copy(lab.user_key, key)
    os.chmod(key, 0o600)
    config = block("c", lab.certs, 2222, UserKnownHostsFile="{d}/known", CertificateFile=str(cert))
    config = config.replace("{key}", str(key))
    known = f"@cert-authority * {lab.host_ca_pub}\n"
    assert_agree(both(lab, "cert-file", config, "c", {"known": known}), get_in=True)


# ---------------------------------------------------------------- every remote command, jumped


def _inner_config(lab: Lab) -> Path:
    """A config reaching inner1 and inner2 (as ``t1``, ``t2``) only through the bastion."""
    path = lab.dir / MODE["name"] / "inner.conf"
    if not path.exists():
        text = block("b", lab.bastion)
        text += block("t1", lab.inner1, ProxyJump="b") + block("t2", lab.inner2, ProxyJump="b")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(lab, text, path.parent))
    return path


def _poprun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SSH_AUTH_SOCK": "", RESOLVER_ENV: MODE["resolver"]}
    client = ["--ssh-client", MODE["client"]] if MODE["client"] else []
    return subprocess.run(
        [PY, "-m", "poprun_py", args[0], *client, *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize("method", ["rsync", "sftp"])
def test_sync_through_the_bastion(lab: Lab, method: str) -> None:
    cfg = _inner_config(lab)
    src = lab.dir / MODE["name"] / f"sync-{method}"
    src.mkdir(parents=True)
    (src / "data.txt").write_text(f"via {method}\n")
    out = _poprun(
        "sync", "--hosts", "t1,t2", "--ssh-config", str(cfg), "--method", method, str(src)
    )
    assert out.returncode == 0, out.stderr
    assert f"({method})" in out.stderr
    got = _poprun(
        "exec", "--hosts", "t1,t2", "--ssh-config", str(cfg), "--", "cat", f"{src}/data.txt"
    )
    assert got.returncode == 0, got.stderr
    assert sorted(got.stdout.splitlines()) == [f"t1: via {method}", f"t2: via {method}"]


def _spec(lab: Lab) -> Path:
    path = lab.dir / MODE["name"] / "inner.yaml"
    hosts = "hosts:\n  - name: t1\n  - name: t2\n"
    path.write_text(f"name: inner\n{hosts}ssh: {{ssh_config: {_inner_config(lab)}}}\n")
    return path


def test_launch_ssh_backend_through_the_bastion(lab: Lab) -> None:
    code = "import os, socket; print(os.environ['RANK'], socket.gethostname())"
    out = _poprun("launch", "-c", str(_spec(lab)), "--backend", "ssh", PY, "-c", code)
    assert out.returncode == 0, out.stderr
    ranks = sorted(line.split()[-2:][0] for line in out.stdout.splitlines() if line.strip())
    assert ranks == ["0", "1"], out.stdout
    assert _strays(lab) == {}


def _strays(lab: Lab, seconds: float = 10.0) -> dict[str, list[int]]:
    """Processes left on the hosts (besides the sshds), once sessions had time to close."""
    extra = {int(p.read_text()) for p in lab.dir.glob("sshd_*.pid")}
    deadline = time.monotonic() + seconds
    while True:
        found = {h: [p for p in pids if p not in extra] for h, pids in strays(lab.cluster).items()}
        found = {h: pids for h, pids in found.items() if pids}
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["mpirun", "mpiexec"])
def test_mpi_behind_a_jump_host_is_refused_in_preflight(lab: Lab, backend: str) -> None:
    requirements.require({"mpirun": "mpirun", "mpiexec": "mpiexec.hydra"}[backend])
    spec = _spec(lab)
    before = sessions_started(lab.cluster)
    out = _poprun("launch", "-c", str(spec), "--backend", backend, PY, "-c", "pass")
    assert out.returncode == 3, out.stderr
    assert "behind a ProxyJump" in out.stderr and "connect back" in out.stderr
    assert sessions_started(lab.cluster) == before  # refused before any host was reached


def test_one_bad_host_config_starts_nothing_anywhere(lab: Lab) -> None:
    d = lab.dir / MODE["name"] / "one-bad"
    d.mkdir(parents=True)
    cfg = d / "config"
    text = block("b", lab.bastion) + block("bad", lab.certs, ProxyJump="b:notaport")
    cfg.write_text(fill(lab, text, d))
    marker = d / "ran"
    before = sessions_started(lab.cluster)
    out = _poprun("exec", "--hosts", "b,bad", "--ssh-config", str(cfg), "--", "touch", str(marker))
    assert out.returncode == 2, out.stderr
    assert "ProxyJump" in out.stderr and "b:notaport" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not marker.exists()
    assert sessions_started(lab.cluster) == before
