"""Scale: ``exec true`` (and ``launch --backend ssh|mpirun true``) on 256 and 1,024 test hosts,
poprun-py over both transports beside clush (flat, its default fanout) and pdsh (``-R ssh``, its
default fanout), in one run on this machine. Prints wall time, local CPU per host and max RSS per
tool. ``--stop`` adds a launch where one instance fails while every other ignores SIGTERM: the
time from the failure until poprun-py has stopped everything (at most the grace period + 3 s),
a search for the test user's processes left on the hosts, and whether any host was said lost.

The test hosts (issue 24): one network namespace holding N addresses in 198.19.0.0/20 (inside the
198.18.0.0/15 test range; the netns provider's clusters use 198.18.X.0/24), each answered by its own
sshd (one sshd process per address, bound to it alone, in PID and UTS namespaces of its own: each
host has its own name, and its /proc shows that host's processes, as a machine's does -- a shared
one made every host's agent search every host's processes for what a job left behind, and a shared
name made Open MPI's 1,024 daemons write one session directory). The root namespace reaches them
through one veth pair and one route via the namespace's end, so there is no bridge (which takes at
most 1,024 ports) and one neighbour entry instead of N (the kernel's default neighbour table
overflows at 1,024). This is honest for what is measured, the client: every host is a distinct
address and a distinct sshd, so every tool makes N TCP connections, N key exchanges, N
authentications and N sessions, and nothing is shared between hosts on the client side. What is not
real: the hosts' sshds run on the same 2 cores as the tool, so the hosts' work (the same for every
tool) slows every tool alike.

Logins are as a test user made for the run, ``poprunbench``, whose login shell is /bin/sh (dash)
with no rc files, so the shell does no extra work (root's ~/.bashrc costs ~0.1 s of CPU a login).

Local CPU is the tool's and every process it started (its ssh clients): ``wait4``'s rusage of
the tool's process tree. Max RSS is the largest single process of that tree (``ru_maxrss``), not
the sum: for pdsh and clush, each host's ssh client is a process of its own. "Its own process's"
is the tool's process alone (``/proc/PID/stat``, sampled every 20 ms until it exits): for a tree
(``--fanout K``, about the square root of the hosts as gateways) the target is 2 ms a host. A
tree's gateways run as the hosts' processes, so their ssh clients' CPU is in neither column: on
this one machine the gateways and the hosts' sshds share the launcher's two cores. clush's own
gateway mode is not run: it needs ClusterShell on every gateway host, and the test user cannot
reach this machine's (the launcher's Python is under /root).

Needs root; removes everything it made (namespace, veth, sshds, user, files) at the end, and
``--cleanup`` removes what a killed run left. Not a test: run it by hand.

Usage:

    python benchmarks/bench_scale.py [--hosts 256 1024] [--runs 1] [--launch] [--stop]
                                     [--tools ...]
    python benchmarks/bench_scale.py --cleanup
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from installed import compile_package, console_script  # noqa: E402

NETNS = "poprun-bench-scale"
VETH_ROOT, VETH_NS = "pbscale0", "pbscale1"
LINK_ROOT, LINK_NS = "198.19.254.1", "198.19.254.2"
HOST_NET = "198.19.0.0/20"
USER = "poprunbench"
SSHD = "/usr/sbin/sshd"
PER_SUBNET = 250
READY_TIMEOUT = 120.0


def address(index: int) -> str:
    """The address of host ``index`` (0-based): 198.19.0.1, ..., 198.19.0.250, 198.19.1.1..."""
    return f"198.19.{index // PER_SUBNET}.{index % PER_SUBNET + 1}"


def name(index: int) -> str:
    return f"sc{index + 1}"


def run(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed: {done.stderr.strip()[-300:]}")
    return done.stdout


# ---------------------------------------------------------------- the test hosts


@dataclass(frozen=True)
class Hosts:
    """What the tools need: the ssh config naming every host, and how many there are."""

    directory: Path
    count: int

    @property
    def ssh_config(self) -> Path:
        return self.directory / "ssh_config"


def make_user(directory: Path) -> None:
    home = directory / "home"
    home.mkdir()
    run("useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-p", "*", USER)  # "*": not locked
    shutil.chown(home, USER, USER)


def make_keys(directory: Path) -> list[str]:
    """A host key (every sshd's) and a client key; the authorized_keys file; the host key's
    public line."""
    for key in ("host_key", "client_key"):
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / key))
    (directory / "authorized_keys").write_text((directory / "client_key.pub").read_text())
    # the test user's: a tree's gateways (--fanout) log in to the other hosts with it, as that
    # user (root, here the launcher, still reads it)
    shutil.chown(directory / "client_key", USER, USER)
    return (directory / "host_key.pub").read_text().split()[:2]


def make_network(count: int) -> None:
    run("ip", "netns", "add", NETNS)
    run("ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NS, "netns", NETNS)
    run("ip", "addr", "add", f"{LINK_ROOT}/30", "dev", VETH_ROOT)
    run("ip", "link", "set", VETH_ROOT, "up")
    batch = [f"addr add {LINK_NS}/30 dev {VETH_NS}", f"link set {VETH_NS} up", "link set lo up"]
    batch += [f"addr add {address(i)}/32 dev lo" for i in range(count)]
    run("ip", "-n", NETNS, "-batch", "-", stdin="\n".join(batch) + "\n")
    run("ip", "route", "add", HOST_NET, "via", LINK_NS)


def sshd_config(directory: Path) -> Path:
    lines = [
        "Port 22",
        f"HostKey {directory / 'host_key'}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        f"AllowUsers {USER}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "LogLevel ERROR",
    ]
    path = directory / "sshd_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def start_sshds(directory: Path, count: int) -> None:
    """One daemonizing sshd per address, four started at a time; wait for every pid file."""
    config, pids = sshd_config(directory), directory / "pids"
    pids.mkdir()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    # Each sshd in a PID namespace of its own (with its own /proc), as each machine has: an
    # agent's search of /proc for what a job left behind sees that host's processes only, not
    # every host's (which would make each host's work grow with the number of hosts). And a
    # host name of its own (a UTS namespace): Open MPI's daemons name their session directory
    # in /tmp after the host, and 1,024 daemons writing one directory's files crashed them.
    host = directory / "host.sh"
    host.write_text(
        'hostname "h$(echo "$1" | tr . -)" && '
        f"exec {SSHD} -D -f {config} -E {directory / 'sshd.log'} "
        f'-o ListenAddress="$1" -o PidFile={pids}/"$1".pid\n'
    )
    script = f'unshare --pid --uts --fork --mount-proc sh {host} "$1" </dev/null >/dev/null 2>&1 &'
    addresses = "\n".join(address(i) for i in range(count)) + "\n"
    # The hosts get a /tmp of their own (one tmpfs in a mount namespace), as separate machines
    # would: the launcher's /tmp/poprun-py-0 here is root's, not the test user's.
    start = 'mount -t tmpfs tmpfs /tmp && exec xargs -P 4 -n 1 sh -c "$0" sh'
    run("ip", "netns", "exec", NETNS, "unshare", "--mount", "--propagation", "private",
        "sh", "-c", start, script, stdin=addresses)  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT
    while len(list(pids.iterdir())) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(list(pids.iterdir()))} of {count} sshds started")
        time.sleep(0.1)


def client_files(directory: Path, count: int, host_key: list[str]) -> None:
    head = [
        "Host sc* 198.19.*",  # mpirun's hosts by address: it resolves names itself
        f"  User {USER}",
        f"  IdentityFile {directory / 'client_key'}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {directory / 'known_hosts'}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
    ]
    blocks = [f"Host {name(i)}\n  HostName {address(i)}" for i in range(count)]
    (directory / "ssh_config").write_text("\n".join(head + blocks) + "\n")
    known = [f"{name(i)},{address(i)} {host_key[0]} {host_key[1]}" for i in range(count)]
    (directory / "known_hosts").write_text("\n".join(known) + "\n")


def create(count: int) -> Hosts:
    cleanup()  # what a killed run left
    directory = Path(tempfile.mkdtemp(prefix="poprun-bench-scale-", dir="/var/tmp"))  # not /tmp
    directory.chmod(0o755)  # the test user reaches its home under it
    hosts = Hosts(directory, count)
    try:
        make_user(directory)
        host_key = make_keys(directory)
        make_network(count)
        start_sshds(directory, count)
        client_files(directory, count, host_key)
    except BaseException:
        cleanup(directory)
        raise
    return hosts


def cleanup(directory: Path | None = None) -> None:
    """Stop every process in the namespace, remove it (its veth and route go with it), the
    user and ``directory``."""
    if NETNS in run("ip", "netns", "list", check=False).split():
        for _ in range(50):
            pids = [int(p) for p in run("ip", "netns", "pids", NETNS, check=False).split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        run("ip", "netns", "del", NETNS, check=False)
    run("ip", "link", "del", VETH_ROOT, check=False)
    run("userdel", USER, check=False)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------- the tools


def tools(hosts: Hosts, count: int, launch: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    cfg, expr = str(hosts.ssh_config), f"sc[1-{count}]"
    env = dict(os.environ)
    exec_argv = [*console_script(), "exec", "-H", expr, "--ssh-config", cfg]
    cmds = {
        "poprun-py exec": ([*exec_argv, "--", "true"], env),
        "poprun-py exec/openssh": ([*exec_argv, "--ssh-client", "openssh", "--", "true"], env),
    }
    tree = ["--fanout", str(gateways(count))]
    cmds[f"poprun-py exec/tree (fanout {gateways(count)})"] = (
        [*exec_argv, *tree, "--", "true"],
        env,
    )
    if launch:
        by_address = ",".join(address(i) for i in range(count))  # mpirun resolves names itself
        for backend, hosts_given in (("ssh", expr), ("mpirun", by_address)):
            if backend == "mpirun" and not shutil.which("mpirun"):
                continue
            argv = [*console_script(), "launch", "--backend", backend, "-H", hosts_given]
            cmds[f"poprun-py launch/{backend}"] = ([*argv, "--ssh-config", cfg, "true"], env)
            label = f"poprun-py launch/{backend}/tree (fanout {gateways(count)})"
            cmds[label] = ([*argv, "--ssh-config", cfg, *tree, "true"], env)
    clush = shutil.which("clush", path=str(Path(sys.executable).parent)) or shutil.which("clush")
    if clush:
        cmds["clush (flat)"] = ([clush, "-S", "-w", expr, "-o", f"-F {cfg}", "true"], env)
    if shutil.which("pdsh"):
        pdsh_env = {**env, "PDSH_SSH_ARGS": f"-F {cfg} -x %h"}
        cmds["pdsh -R ssh"] = (["pdsh", "-S", "-R", "ssh", "-w", expr, "true"], pdsh_env)
    return cmds


def gateways(count: int) -> int:
    """A tree's gateways for ``count`` hosts: about the square root (16 for 256, 32 for 1,024),
    so that the launcher and each gateway serve about as many connections."""
    return max(1, round(count**0.5))


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float
    max_rss_mib: float
    exit_code: int
    said: str
    own_cpu: float = float("nan")  # the tool's own process alone, without its children


def own_cpu(pid: int, seen: list[float]) -> None:
    """Sample the process's own user + system CPU (``/proc/PID/stat``) until it exits; the
    last sample is ``seen[0]`` (at most one sampling period short)."""
    ticks = os.sysconf("SC_CLK_TCK")
    while True:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        if fields[0] == "Z":
            return
        seen[:] = [(int(fields[11]) + int(fields[12])) / ticks]
        time.sleep(0.02)


def measure(argv: list[str], env: dict[str, str], log: Path) -> Measured:
    """Run one tool; wall time, and CPU and max RSS of its whole process tree (wait4)."""
    with open(log, "w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        seen: list[float] = [float("nan")]
        sampler = threading.Thread(target=own_cpu, args=(proc.pid, seen), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        sampler.join()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = [line.strip() for line in out if line.strip()]
    cpu = usage.ru_utime + usage.ru_stime
    said = f"{len(lines)} lines; first: {lines[0][:100]}" if lines else ""
    if proc.returncode != 0:
        shown = lines if len(lines) <= 16 else [*lines[:4], "...", *lines[-12:]]
        print("\n".join(f"    {line}" for line in shown), file=sys.stderr)
    return Measured(wall, cpu, usage.ru_maxrss / 1024, proc.returncode, said, seen[0])


# ---------------------------------------------------------------- stopping at scale

STOP_LABEL = "poprun-py launch/ssh, one fails"
GRACE = 5.0
FAILED_AT = "failed_at"  # in the test user's home: when the failing instance exited


def stop_tool(hosts: Hosts, count: int, fail_after: float) -> tuple[list[str], dict[str, str]]:
    """``launch --backend ssh`` of an instance per host that ignores SIGTERM (so only SIGKILL,
    after the grace period, stops it), where rank 0 exits 3 after ``fail_after`` seconds
    (once every host has started), writing the time first."""
    program = (
        'trap "" TERM; if [ "$RANK" = 0 ]; then sleep "$1"; '
        f'date +%s.%N > "$HOME/{FAILED_AT}"; exit 3; fi; exec sleep 600'
    )
    argv = [*console_script(), "launch", "--backend", "ssh", "-H", f"sc[1-{count}]",
            "--ssh-config", str(hosts.ssh_config), "--grace-period", f"{GRACE:g}",
            "sh", "-c", program, "sh", f"{fail_after:g}"]  # fmt: skip
    return argv, dict(os.environ)


def left_on_hosts() -> list[str]:
    """Every process of the test user still running (on any host): ``pgrep -a -u``."""
    return [line for line in run("pgrep", "-a", "-u", USER, check=False).splitlines() if line]


@dataclass(frozen=True)
class Stopped:
    """A failing launch: from the failure to poprun-py's exit; what was left on the hosts
    then (but sshd's own session processes, still closing) and 2 s later; hosts said lost."""

    measured: Measured
    seconds: float
    left_at_exit: tuple[str, ...]
    left_later: tuple[str, ...]
    lost_lines: int

    def ok(self) -> bool:
        code = self.measured.exit_code
        quick = 0 <= self.seconds <= GRACE + 3
        return code == 3 and quick and not self.left_later and not self.lost_lines


def measure_stop(hosts: Hosts, count: int, fail_after: float) -> Stopped:
    """Run :func:`stop_tool`; then search the hosts for what is left."""
    mark = hosts.directory / "home" / FAILED_AT
    mark.unlink(missing_ok=True)
    argv, env = stop_tool(hosts, count, fail_after)
    log = hosts.directory / "tool.log"
    got = measure(argv, env, log)
    ended = time.time()
    at_exit = [p for p in left_on_hosts() if "sshd" not in p]
    time.sleep(2.0)
    later = left_on_hosts()
    failed_at = float(mark.read_text()) if mark.exists() else float("nan")
    lost = sum(" lost" in line for line in log.read_text(errors="replace").splitlines())
    return Stopped(got, ended - failed_at, tuple(at_exit), tuple(later), lost)


def stop_row(count: int, got: Stopped) -> str:
    verdict = "ok" if got.ok() else f"FAILED (exit {got.measured.exit_code})"
    return (
        row(count, STOP_LABEL, replace(got.measured, exit_code=0))[: -len("ok |")]
        + f"{verdict}: stopped {got.seconds:.1f} s after the failure (grace {GRACE:g} s); "
        f"left: {len(got.left_at_exit)} at exit, {len(got.left_later)} 2 s later; "
        f"lines saying lost: {got.lost_lines} |"
    )


def available_mib() -> int:
    """MemAvailable from /proc/meminfo, in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def row(count: int, label: str, got: Measured) -> str:
    result = "ok" if got.exit_code == 0 else f"exit {got.exit_code}: {got.said}"
    per_host, own = 1000 * got.cpu / count, 1000 * got.own_cpu / count
    return (
        f"| {count:,} | {label} | {got.wall:.2f} s | {per_host:.1f} ms | {own:.1f} ms | "
        f"{got.max_rss_mib:.0f} MiB | {result} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--launch", action="store_true", help="also launch --backend ssh true")
    parser.add_argument("--tools", nargs="*", help="only these tools (labels as printed)")
    parser.add_argument("--stop", action="store_true", help=f"also: {STOP_LABEL}")
    parser.add_argument("--fail-after", type=float, default=30.0, help="seconds (--stop)")
    parser.add_argument("--cleanup", action="store_true", help="remove a killed run's leftovers")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_scale needs root (network namespace, sshd, a test user)")
    if args.cleanup:
        cleanup()
        return
    compile_package()
    most = max(args.hosts)
    t0, free = time.perf_counter(), available_mib()
    hosts = create(most)
    took, used = time.perf_counter() - t0, free - available_mib()
    print(f"{most:,} test hosts up in {took:.1f} s, using {used:,} MiB ({hosts.directory})")
    try:
        print("| hosts | tool | wall | local CPU per host | its own process's | max RSS | result |")
        print("|---|---|---|---|---|---|---|")
        for count in sorted(args.hosts):
            cmds = tools(hosts, count, args.launch)
            for _ in range(args.runs):
                for label, (argv, env) in cmds.items():
                    if args.tools and label not in args.tools:
                        continue
                    got = measure(argv, env, hosts.directory / "tool.log")
                    print(row(count, label, got), flush=True)
                if args.stop and (not args.tools or STOP_LABEL in args.tools):
                    stopped = measure_stop(hosts, count, args.fail_after)
                    print(stop_row(count, stopped), flush=True)
                    for line in [*stopped.left_at_exit, *stopped.left_later][:10]:
                        print(f"    left: {line[:120]}", file=sys.stderr)
        print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; the hosts'")
        print("sshds share these cores with the tools (the same work for every tool)")
    finally:
        cleanup(hosts.directory)


if __name__ == "__main__":
    main()
