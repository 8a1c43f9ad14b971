"""Transport, preflight, sync and exec pieces that need no remote host.

Remote command lines are run by a real local ``sh``/``bash`` (the same shells sshd would start),
so quoting and the environment-on-stdin preamble are proven byte for byte without ssh.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import paramiko
import pytest

from poprun_py.core.hosts import parse_hosts
from poprun_py.core.plan import make_plan
from poprun_py.core.spec import HostSpec, JobSpec, cluster_from_hosts
from poprun_py.errors import UsageError
from poprun_py.preflight.probes import (
    CHECK_SCRIPT,
    Checks,
    checks_argv,
    checks_for_plan,
    parse_check_output,
)
from poprun_py.prepare.discover import discover_local
from poprun_py.ssh.commands import env_block, remote_command
from poprun_py.ssh.config import endpoint_from
from poprun_py.ssh.errors import HostKeyError
from poprun_py.ssh.fanout import (
    HostOutcome,
    LineSplitter,
    fold,
    gathered,
    nodeset,
    problems,
    worst_exit_code,
)
from poprun_py.ssh.known_hosts import (
    HostKey,
    KnownHosts,
    parse_known_hosts,
    preferred_key_types,
    verify_host_key,
)
from poprun_py.ssh.settings import Endpoint, SshSettings
from poprun_py.ssh.sync import destination, rsync_argv, scan

NASTY = [
    "a b",
    "q'uo\"te",
    "$(touch /tmp/pwned-poprun)",
    "`id`",
    "; rm -rf x",
    "line1\nline2",
    "trail\n",
    "é☃ünï",
    "",
    " ",
    "*",
    "\\back\\slash",
    "-n",
]
ARGV_PROBE = ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))"]
SHELLS = [s for s in ("/bin/sh", "/bin/bash") if os.path.exists(s)]


def run_line(shell: str, line: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """What sshd does with a command line: ``$SHELL -c LINE``."""
    return subprocess.run([shell, "-c", line], input=stdin, capture_output=True, check=False)


# ---------------------------------------------------------------- remote_command


@pytest.mark.parametrize("shell", SHELLS)
def test_arguments_arrive_byte_for_byte(shell: str) -> None:
    proc = run_line(shell, remote_command([*ARGV_PROBE, *NASTY]))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == NASTY
    assert not os.path.exists("/tmp/pwned-poprun")


@pytest.mark.parametrize("shell", SHELLS)
def test_env_travels_on_stdin_and_the_rest_of_stdin_reaches_the_program(
    shell: str, tmp_path: Path
) -> None:
    env = {"SECRET": "s3cr'et\nwith $(newline)\n", "EMPTY": "", "UNI": "ñ☃", "SP": " a  b "}
    probe = (
        "import os, sys, json;"
        "print(json.dumps([{k: os.environ.get(k) for k in sys.argv[1:]}, os.getcwd(),"
        " sys.stdin.read()]))"
    )
    line = remote_command(["python3", "-c", probe, *env], env, cwd=str(tmp_path))
    for value in env.values():
        if value.strip():
            assert value.strip() not in line  # no value is ever in the command line
    proc = run_line(shell, line, env_block(env) + b"rest of\nstdin")
    assert proc.returncode == 0, proc.stderr
    got_env, cwd, stdin = json.loads(proc.stdout)
    assert got_env == env
    assert cwd == str(tmp_path)
    assert stdin == "rest of\nstdin"


def test_report_pid_gives_the_programs_pid_first() -> None:
    line = remote_command(["python3", "-c", "import os; print(os.getpid())"], report_pid=True)
    first, second = run_line("/bin/sh", line).stdout.decode().split()
    assert first == second


def test_missing_workdir_fails_before_the_program_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    line = remote_command(["touch", str(marker)], cwd=str(tmp_path / "nope"))
    assert run_line("/bin/sh", line).returncode != 0
    assert not marker.exists()


def test_bad_env_names_and_empty_commands_are_refused() -> None:
    with pytest.raises(UsageError):
        env_block({"A B": "x"})
    with pytest.raises(UsageError):
        env_block({"A": "nul\0byte"})
    with pytest.raises(UsageError):
        remote_command([])


# ---------------------------------------------------------------- known_hosts

KEY_A = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + b"A" * 36).decode()
KEY_B = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + b"B" * 36).decode()
BLOB_A, BLOB_B = base64.b64decode(KEY_A), base64.b64decode(KEY_B)


def endpoint(
    tmp_path: Path, files: list[Path], accept_new: bool = False, port: int = 22
) -> Endpoint:
    names = ("198.18.9.12", "h2") if port == 22 else ("[198.18.9.12]:2222", "[h2]:2222")
    return Endpoint(
        name="h2",
        hostname="198.18.9.12",
        port=port,
        user="root",
        identity_files=(),
        explicit_identity=False,
        key_names=names,
        known_hosts=tuple(files),
        record_to=tmp_path / "recorded",
        strict="accept-new" if accept_new else "yes",
    )


def test_known_hosts_patterns_hashed_negated_wildcard_and_port() -> None:
    hashed = paramiko.HostKeys.hash_host("h7")
    text = (
        "# comment\n\n"
        f"{hashed} ssh-ed25519 {KEY_A}\n"
        f"*.example,!bad.example ssh-ed25519 {KEY_A}\n"
        f"[h8]:2222 ssh-ed25519 {KEY_B}\n"
        f"@cert-authority *.ca ssh-ed25519 {KEY_A}\n"
        f"@revoked h9 ssh-ed25519 {KEY_B}\n"
        "malformed line\n"
    )
    keys = parse_known_hosts(text)
    assert [k.matches("h7") for k in keys][:1] == [True]
    assert keys[1].matches("ok.example") and not keys[1].matches("bad.example")
    assert keys[2].matches("[h8]:2222") and not keys[2].matches("h8")
    assert keys[3].marker == "cert-authority" and keys[3].matches("n.ca")
    assert keys[4].revoked and keys[4].matches("h9")
    assert len(keys) == 5  # malformed line skipped


def test_matching_key_is_accepted(tmp_path: Path) -> None:
    known = tmp_path / "kh"
    known.write_text(f"h2,198.18.9.12 ssh-ed25519 {KEY_A}\n")
    verify_host_key(endpoint(tmp_path, [known]), HostKey("ssh-ed25519", BLOB_A), KnownHosts())


def test_changed_key_is_refused_even_with_accept_new(tmp_path: Path) -> None:
    known = tmp_path / "kh"
    known.write_text(f"h2 ssh-ed25519 {KEY_A}\n")
    ep = endpoint(tmp_path, [known], accept_new=True)
    with pytest.raises(HostKeyError) as err:
        verify_host_key(ep, HostKey("ssh-ed25519", BLOB_B), KnownHosts(), peer="198.18.9.12")
    assert str(err.value) == (
        "host key for h2 (198.18.9.12) does not match known_hosts: possible man-in-the-middle "
        "(refused whatever StrictHostKeyChecking says; remove the old key to go on)"
    )
    assert not (tmp_path / "recorded").exists()


def test_unknown_key_is_refused_unless_accept_new_then_recorded(tmp_path: Path) -> None:
    with pytest.raises(HostKeyError, match=r"not in known_hosts .*--accept-new-host-keys"):
        verify_host_key(endpoint(tmp_path, []), HostKey("ssh-ed25519", BLOB_A), KnownHosts())
    verify_host_key(
        endpoint(tmp_path, [], accept_new=True), HostKey("ssh-ed25519", BLOB_A), KnownHosts()
    )
    recorded = tmp_path / "recorded"
    assert recorded.read_text() == f"198.18.9.12,h2 ssh-ed25519 {KEY_A}\n"
    assert recorded.stat().st_mode & 0o777 == 0o600
    # read back by a fresh lookup: now known
    verify_host_key(endpoint(tmp_path, [recorded]), HostKey("ssh-ed25519", BLOB_A), KnownHosts())


def test_revoked_key_is_refused(tmp_path: Path) -> None:
    known = tmp_path / "kh"
    known.write_text(f"@revoked h2 ssh-ed25519 {KEY_A}\n")
    with pytest.raises(HostKeyError, match="revoked"):
        verify_host_key(
            endpoint(tmp_path, [known], True), HostKey("ssh-ed25519", BLOB_A), KnownHosts()
        )


def test_known_key_types_are_asked_for_first() -> None:
    keys = parse_known_hosts(f"h ssh-rsa {KEY_A}\n")
    offered = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    assert preferred_key_types(keys, offered)[:2] == ["rsa-sha2-512", "rsa-sha2-256"]


# ---------------------------------------------------------------- endpoints and ssh config

CONFIG = """
Host h*
    HostName 198.18.9.%h
    User alice
    Port 2222
    IdentityFile ~/.ssh/id_test
    UserKnownHostsFile /tmp/kh1 /tmp/kh2
Host aliased
    HostKeyAlias shared
    StrictHostKeyChecking accept-new
"""


def options(name: str) -> dict[str, list[str]]:
    found = paramiko.SSHConfig.from_text(CONFIG).lookup(name)
    return {k: v if isinstance(v, list) else [v] for k, v in found.items()}


def resolve_endpoint(
    host: HostSpec, settings: SshSettings, opts: dict[str, list[str]], home: Path
) -> Endpoint:
    """``endpoint_from`` for a user whose home (OpenSSH's: the passwd entry's) is ``home``."""
    with (
        mock.patch("poprun_py.ssh.config.user_home", lambda: str(home)),
        mock.patch("poprun_py.ssh.settings.user_home", lambda: str(home)),
    ):
        return endpoint_from(host, settings, opts, expanded=True)


def test_ssh_config_supplies_address_user_port_identity_and_known_hosts(tmp_path: Path) -> None:
    ep = resolve_endpoint(HostSpec("h1"), SshSettings(), options("h1"), home=tmp_path)
    assert (ep.hostname, ep.user, ep.port) == ("198.18.9.h1", "alice", 2222)
    assert ep.identity_files == (os.path.expanduser("~/.ssh/id_test"),)
    assert not ep.explicit_identity
    assert ep.key_names == ("[198.18.9.h1]:2222", "[h1]:2222")
    assert ep.known_hosts[:2] == (Path("/tmp/kh1"), Path("/tmp/kh2"))
    assert ep.record_to == Path("/tmp/kh1")


def test_host_spec_then_flags_then_config(tmp_path: Path) -> None:
    host = HostSpec("h1", address="198.18.9.5", user="bob", port=22)
    settings = SshSettings(user="carol", identity_file="/k", known_hosts=tmp_path / "extra")
    ep = resolve_endpoint(host, settings, options("h1"), home=tmp_path)
    assert (ep.hostname, ep.user, ep.port) == ("198.18.9.5", "bob", 22)
    assert ep.identity_files == ("/k",) and ep.explicit_identity  # no agent, no default keys
    assert ep.known_hosts[0] == tmp_path / "extra" and ep.record_to == tmp_path / "extra"
    flags = resolve_endpoint(HostSpec("h1"), settings, options("h1"), home=tmp_path)
    assert flags.user == "carol"


def test_host_key_alias_and_accept_new_from_config(tmp_path: Path) -> None:
    ep = resolve_endpoint(HostSpec("aliased"), SshSettings(), options("aliased"), home=tmp_path)
    assert ep.key_names == ("shared",)
    assert ep.accept_new
    assert ep.known_hosts == (tmp_path / ".ssh" / "known_hosts", Path("/etc/ssh/ssh_known_hosts"))


# ---------------------------------------------------------------- exec output


def test_identical_outputs_fold_under_one_node_set_header() -> None:
    outcomes = [
        HostOutcome("n1", 0, "same\n"),
        HostOutcome("n3", 0, "same\n"),
        HostOutcome("n2", 0, "same\n"),
        HostOutcome("gpu7", 1, "other\n", "oops\n"),
        HostOutcome("n4", 255, error="cannot reach n4"),
    ]
    assert fold(outcomes, "stdout") == [(["n1", "n3", "n2"], "same\n"), (["gpu7"], "other\n")]
    text = gathered(outcomes, "stdout")
    assert text.splitlines() == [
        "---------------",
        "n[1-3] (3)",
        "---------------",
        "same",
        "---------------",
        "gpu7",
        "---------------",
        "other",
    ]
    assert nodeset(["node02", "node01", "node10"]) == "node[01-02,10]"
    assert worst_exit_code(outcomes) == 255
    assert problems(outcomes) == ["gpu7: exited with exit code 1", "cannot reach n4"]


def test_line_splitter_keeps_partial_lines_and_multibyte_characters() -> None:
    lines: list[tuple[str, str, str]] = []
    split = LineSplitter("h1", lambda *a: lines.append(a))
    data = "ab\nc☃d\nlast".encode()
    for i in range(len(data)):  # one byte at a time: ☃ arrives in three pieces
        split.feed("stdout", data[i : i + 1])
    split.feed("stderr", b"err\n")
    split.flush()
    assert lines == [
        ("h1", "stdout", "ab"),
        ("h1", "stdout", "c☃d"),
        ("h1", "stderr", "err"),
        ("h1", "stdout", "last"),
    ]


# ---------------------------------------------------------------- preflight pieces


def plan_for(program: tuple[str, ...], numa: bool = True):  # type: ignore[no-untyped-def]
    cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    return make_plan(cluster, JobSpec(program, replicas=2, numa_aware=numa, workdir="/srv/job"))


def test_checks_for_plan_finds_interpreter_and_script() -> None:
    checks = checks_for_plan(plan_for(("python3", "-u", "train.py", "--lr", "1")))
    assert (checks.workdir, checks.commands, checks.files) == (
        "/srv/job",
        ("python3",),
        ("train.py",),
    )
    assert checks.numactl_hosts == frozenset({"h1", "h2"})
    assert checks_for_plan(plan_for(("python3", "-m", "pkg.train"))).files == ()
    # a script named by path runs as it is (prepare has already put a non-executable .py
    # under the instance's Python: prepare/program.py), so the check looks for the command
    script = checks_for_plan(plan_for(("./train.py",), numa=False))
    assert script.commands == ("./train.py",) and script.files == ()
    assert script.numactl_hosts == frozenset()
    assert checks_for_plan(plan_for(("hostname",))).commands == ("hostname",)


def test_check_script_run_by_a_real_shell(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    checks = Checks(
        workdir=str(tmp_path),
        commands=("sh", "no-such-tool-xyz", "./missing.sh"),
        files=("train.py", "gone.py"),
        numactl_hosts=frozenset({"h1"}),
    )
    argv = checks_argv(checks, numactl=True)
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    faults, report = parse_check_output("h1", checks, proc.stdout)
    details = [f.detail for f in faults]
    assert "no-such-tool-xyz: not found on PATH" in details
    assert f"./missing.sh: not an executable file in {tmp_path}" in details
    assert f"gone.py: no such file in {tmp_path}" in details
    assert not any("train.py" in d or d.startswith("sh:") for d in details)
    assert report.topology == discover_local()
    assert report.topology_source == "sysfs"
    assert argv[2] == CHECK_SCRIPT  # the script is fixed; inputs are separate arguments


def test_missing_workdir_hides_relative_file_faults(tmp_path: Path) -> None:
    checks = Checks(workdir=str(tmp_path / "nope"), files=("train.py",), topology=False)
    argv = checks_argv(checks, False)
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    faults, report = parse_check_output("h1", checks, out)
    assert [(f.check, f.detail) for f in faults] == [
        ("workdir", f"working directory {tmp_path / 'nope'} is missing")
    ]
    assert report.topology is None


def test_lscpu_fallback_and_missing_numactl_are_parsed() -> None:
    text = "numactl 0\ntopology lscpu\n# CPU,Node\n0,0\n1,1\n"
    faults, report = parse_check_output("h1", Checks(numactl_hosts=frozenset({"h1"})), text)
    assert faults == [] and report.numactl is False  # a fault only where a command needs it
    assert report.topology is not None and [n.cpus for n in report.topology.numa_nodes] == [
        (0,),
        (1,),
    ]


# ---------------------------------------------------------------- sync pieces


def test_scan_lists_dirs_files_links_with_destinations(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("x")
    (root / "sub" / "b.txt").write_text("yy")
    (root / "link").symlink_to("a.py")
    entries = scan([str(root)], dest="/remote")
    got = [(e.rel, e.kind, e.remote, e.size) for e in entries]
    assert got == [
        ("proj", "dir", "/remote/proj", 0),
        ("sub", "dir", "/remote/proj/sub", 0),
        ("a.py", "file", "/remote/proj/a.py", 1),
        ("link", "link", "/remote/proj/link", 0),
        ("sub/b.txt", "file", "/remote/proj/sub/b.txt", 2),
    ]
    assert destination(str(root), None) == str(root)
    with pytest.raises(UsageError, match="no such file"):
        scan([str(tmp_path / "missing")])


def test_rsync_argv_same_path_or_dest() -> None:
    cfg = Path("/tmp/x/ssh_config")
    same = rsync_argv(cfg, "h1", ["/srv/job"], None)
    assert same[-3:] == ["--no-implied-dirs", "/srv/job", "h1:/"] and "--relative" in same
    assert same[same.index("-e") + 1] == 'ssh -F "/tmp/x/ssh_config"'
    assert rsync_argv(cfg, "h1", ["/srv/job"], "/dst/")[-2:] == ["/srv/job", "h1:/dst/"]


def test_cli_exec_help_is_fast_to_import() -> None:
    """The exec/sync command module imports neither paramiko nor rich at import time."""
    code = (
        "import sys, poprun_py.cli.remote_cmd;"
        "print(any(m in sys.modules for m in ('paramiko', 'rich.progress', 'invoke')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
