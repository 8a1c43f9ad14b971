"""``up`` -> ``launch`` -> ``down`` on real test hosts (local provider), the static provider on
existing hosts, and the SSH wait against a real sshd. Needs root (network namespaces)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun_py.core.spec import ClusterSpec, HostSpec, ProviderSpec
from poprun_py.errors import ProvisionError
from poprun_py.prepare.specfile import load_cluster
from poprun_py.providers.lifecycle import down, up
from poprun_py.providers.local import LocalProvider
from poprun_py.providers.netns import TestCluster, destroy_cluster, host_pids, list_clusters
from poprun_py.providers.reach import wait_for_ssh
from poprun_py.providers.setup import MARKER_ROOT
from poprun_py.ssh.hostresult import values
from poprun_py.ssh.pool import ConnectionPool
from poprun_py.ssh.settings import SshSettings
from tests.hostfixtures import MakeCluster, require_hosts, session_tag
from tests.integration.helpers import poprun_cli

pytestmark = pytest.mark.hosts

REPO = Path(__file__).resolve().parents[2]
PROGRAM = "import os, socket; print('rank', os.environ['RANK'], 'on', socket.gethostname())\n"


TAG = session_tag()  # host names are machine-wide: keep concurrent sessions apart


_NUMBERS = itertools.count(1)


@pytest.fixture
def cluster_name() -> Iterator[str]:
    """A unique local cluster name, destroyed afterwards whatever the test did."""
    require_hosts()
    name = f"pa{os.getpid()}-{next(_NUMBERS)}"
    yield name
    destroy_cluster(name)
    assert name not in list_clusters()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POPRUN_PY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / "clusters"


def write_spec(path: Path, name: str, nodes: int, setup: str) -> Path:
    text = (
        f"name: {name}\n"
        f"provider: {{kind: local, num_nodes: {nodes}, host_prefix: pa{TAG}}}\n"
        "defaults: {backend: ssh}\n"
        "setup: |\n" + "".join(f"  {line}\n" for line in setup.splitlines())
    )
    path.write_text(text)
    return path


cli = functools.partial(poprun_cli, timeout=90)


def namespaces(name: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if f"poprun-{name}-" in line]


def processes(marker: str) -> str:
    found = subprocess.run(["pgrep", "-af", marker], check=False, capture_output=True, text=True)
    return found.stdout


def hosts_home() -> Path:
    """The home of the test hosts' login user, root, where setup keeps its markers (the hosts
    share this machine's users and filesystem): not the runner's $HOME, which may be another's."""
    return Path(pwd.getpwnam("root").pw_dir)


def assert_all_gone(name: str) -> None:
    assert namespaces(name) == []
    assert processes(f"testhosts/{name}/") == ""  # the sshds' command lines name the cluster
    assert f"testhosts {name}" not in Path("/etc/hosts").read_text()
    assert name not in list_clusters()
    assert not (hosts_home() / MARKER_ROOT / name).exists()


def hostnames(inventory: Path) -> dict[str, str]:
    """Host name -> `hostname` over SSH with strict host-key checking (keys recorded by up)."""
    spec = load_cluster(inventory)
    assert spec.known_hosts is not None
    settings = SshSettings(known_hosts=Path(spec.known_hosts), accept_new_host_keys=False)
    with ConnectionPool(list(spec.hosts), settings) as pool:
        pool.open_all()
        results = values(pool.each(lambda conn: conn.run(["hostname"])))
    return {host: r.stdout.strip() for host, r in results.items()}


def test_up_launch_down_end_to_end(cluster_name: str, state_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, f'echo "$(hostname)" >> {log}')
    started = time.monotonic()
    proc = cli("up", str(spec))
    up_seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    inventory = Path(proc.stdout.strip())
    assert inventory == state_dir / f"{cluster_name}.inventory.yaml"
    assert "setup ran on 2, unchanged on 0" in proc.stderr
    hosts = [f"pa{TAG}1", f"pa{TAG}2"]
    assert sorted(log.read_text().split()) == hosts
    assert hostnames(inventory) == {h: h for h in hosts}

    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    launched = cli(
        "launch",
        "--cluster",
        str(inventory),
        "--backend",
        "ssh",
        "--instances",
        "2",
        sys.executable,
        str(program),
    )
    assert launched.returncode == 0, launched.stderr
    assert sorted(line.split("] ", 1)[1] for line in launched.stdout.splitlines()) == [
        f"rank 0 on {hosts[0]}",
        f"rank 1 on {hosts[1]}",
    ]

    listing = cli("status", cluster_name, "--format", "json")
    (row,) = json.loads(listing.stdout)
    assert (row["provider"], row["phase"]) == ("local", "ready")
    assert [(n["name"], n["state"]) for n in row["nodes"]] == [(h, "running") for h in hosts]

    again = cli("up", str(spec))
    assert again.returncode == 0 and "setup ran on 0, unchanged on 2" in again.stderr
    assert f"reusing local cluster {cluster_name}" in again.stderr
    write_spec(tmp_path / "c.yaml", cluster_name, 2, f'echo "edited $(hostname)" >> {log}')
    edited = cli("up", str(spec))
    assert edited.returncode == 0 and "setup ran on 2, unchanged on 0" in edited.stderr
    assert log.read_text().count("edited") == 2

    started = time.monotonic()
    gone = cli("down", str(spec))
    down_seconds = time.monotonic() - started
    assert gone.returncode == 0, gone.stderr
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []
    assert cli("down", str(spec)).returncode == 0
    print(f"\nlocal 2 hosts: cli up {up_seconds:.2f}s, down {down_seconds:.2f}s")


def test_up_killed_halfway_then_down_removes_everything(
    cluster_name: str, state_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 4, "true")
    proc = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", "up", str(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    deadline = time.monotonic() + 30
    while not namespaces(cluster_name) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert namespaces(cluster_name), "up finished before it could be killed"
    gone = cli("down", str(spec))
    assert gone.returncode == 0, gone.stderr
    assert_all_gone(cluster_name)


def test_a_broken_local_cluster_is_rebuilt_and_a_different_shape_refused(
    cluster_name: str, state_dir: Path
) -> None:
    spec = ClusterSpec(
        cluster_name, (), provider=ProviderSpec(kind="local", num_nodes=2, host_prefix=f"pb{TAG}")
    )
    first = up(spec, provider=LocalProvider())
    broken = first.record.nodes[1].resource_id  # its network namespace
    for pid in host_pids(broken):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while host_pids(broken) and time.monotonic() < deadline:
        time.sleep(0.02)
    notes: list[str] = []
    second = up(spec, provider=LocalProvider(), reporter=_Notes(notes))
    assert any("incomplete: destroying and recreating" in n for n in notes)
    assert {n.state for n in LocalProvider().list_nodes(second.record)} == {"running"}
    bigger = ClusterSpec(
        cluster_name, (), provider=ProviderSpec(kind="local", num_nodes=3, host_prefix=f"pb{TAG}")
    )
    with pytest.raises(ProvisionError, match=r"the spec asks for .*run `poprun-py down`"):
        up(bigger, provider=LocalProvider())
    down(spec, provider=LocalProvider())
    assert_all_gone(cluster_name)


class _Notes:
    def __init__(self, notes: list[str]):
        self.notes = notes

    def start(self, step: str, total: int) -> None:
        pass

    def advance(self, step: str, amount: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        self.notes.append(message)


def test_static_provider_sets_up_and_cleans_only_its_own_files(
    make_test_cluster: MakeCluster, state_dir: Path, tmp_path: Path
) -> None:
    cluster = make_test_cluster(2, "ps")
    name = f"st{os.getpid()}"
    hosts = tuple(
        HostSpec(h.name, h.address, "root", h.port, str(cluster.identity_file))
        for h in cluster.hosts
    )
    spec = ClusterSpec(
        name,
        hosts,
        provider=ProviderSpec(kind="static"),
        setup=f"hostname >> {tmp_path / 'log'}",
        known_hosts=str(cluster.known_hosts),
    )
    result = up(spec)
    assert [o.ran for o in result.setup] == [True, True]
    assert sorted((tmp_path / "log").read_text().split()) == sorted(cluster.host_names)
    assert [o.ran for o in up(spec).setup] == [False, False]
    marker = hosts_home() / MARKER_ROOT / name
    assert sorted(p.name for p in marker.iterdir()) == sorted(cluster.host_names)
    removed = down(spec).removed
    assert [r.kind for r in removed] == ["setup-dir", "setup-dir"]
    assert not marker.exists()
    assert all(host_pids(h.netns) for h in cluster.hosts)  # the machines themselves stay
    assert down(spec).removed == tuple(removed)  # cleaning again is harmless


# ---------------------------------------------------------------- waiting for SSH, for real


def one_host(cluster: TestCluster) -> HostSpec:
    h = cluster.hosts[0]
    return HostSpec(h.name, h.address, "root", h.port, str(cluster.identity_file))


def test_wait_for_ssh_on_a_real_host(make_test_cluster: MakeCluster) -> None:
    cluster = make_test_cluster(1, "pw")
    host, sshd = one_host(cluster), cluster.hosts[0].sshd_pid
    wait_for_ssh([host], known_hosts=str(cluster.known_hosts), timeout=10)

    os.kill(sshd, signal.SIGSTOP)  # accepts TCP (kernel backlog) but never says hello
    try:
        started = time.monotonic()
        with pytest.raises(ProvisionError, match=f"^{host.name} did not answer SSH within 1.5s"):
            wait_for_ssh([host], known_hosts=str(cluster.known_hosts), timeout=1.5)
        # at its 1.5 s timeout, not never (the stopped sshd would hold it forever): "< 30" is
        # generous for a loaded 2-core machine (or one CPU)
        assert time.monotonic() - started < 30
        resume = threading.Timer(1.0, os.kill, (sshd, signal.SIGCONT))
        resume.start()
        started = time.monotonic()
        wait_for_ssh([host], known_hosts=str(cluster.known_hosts), timeout=20, interval=0.2)
        assert time.monotonic() - started >= 1.0
    finally:
        os.kill(sshd, signal.SIGCONT)


def test_wait_for_ssh_stops_at_once_on_an_unknown_host_key(
    make_test_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_test_cluster(1, "pk")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    started = time.monotonic()
    with pytest.raises(ProvisionError, match="did not answer SSH"):
        wait_for_ssh([one_host(cluster)], known_hosts=str(empty), timeout=30)
    # at once, not at the 30 s timeout: "< 20" leaves a loaded 2-core machine (or one CPU)
    # time for the ssh handshake and still tells the two apart
    assert time.monotonic() - started < 20
    wait_for_ssh([one_host(cluster)], known_hosts=str(empty), accept_new_host_keys=True, timeout=10)
    assert cluster.hosts[0].address in empty.read_text()


def test_up_and_down_take_the_ssh_options_every_remote_command_takes(
    make_test_cluster: MakeCluster, state_dir: Path, tmp_path: Path
) -> None:
    """A static spec naming only the hosts (no key, no known_hosts, no user): ``up`` and
    ``down`` get in with ``--ssh-config`` alone, as ``exec`` would, and are refused without."""
    cluster = make_test_cluster(2, "pq")
    name = f"sq{os.getpid()}"
    spec = tmp_path / "static.yaml"
    names = "".join(f"  - name: {h}\n" for h in cluster.host_names)
    spec.write_text(f"name: {name}\nprovider: {{kind: static}}\nsetup: hostname\nhosts:\n{names}")
    env_home = {**os.environ, "HOME": str(tmp_path)}  # no ~/.ssh of this machine's
    argv = [sys.executable, "-m", "poprun_py"]
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, timeout=120, env=env_home, check=False
    )
    refused = run([*argv, "up", str(spec), "--wait-timeout", "2"])
    assert refused.returncode == 1, refused.stderr  # a provider's failure: exit 1, one line
    assert refused.stderr.strip().splitlines()[-1].startswith("poprun-py: error: ")
    flags = ["--ssh-config", str(cluster.ssh_config), "--connect-timeout", "5"]
    went_up = run([*argv, "up", str(spec), *flags])
    assert went_up.returncode == 0, went_up.stderr
    marker = hosts_home() / MARKER_ROOT / name  # the hosts share this machine's filesystem
    assert sorted(p.name for p in marker.iterdir()) == sorted(cluster.host_names)
    went_down = run([*argv, "down", str(spec), *flags])
    assert went_down.returncode == 0, went_down.stderr
    assert not marker.exists()


# ---------------------------------------------------------------- one key: launch --up --down

WAITING = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1], 'started-' + os.environ['RANK']).touch()\n"
    "time.sleep(300)\n"
)


def job(tmp_path: Path, text: str) -> Path:
    """The program in a directory of its own (what --up's --sync pushes)."""
    (tmp_path / "job").mkdir(exist_ok=True)
    program = tmp_path / "job" / "prog.py"
    program.write_text(text)
    return program


def test_one_key_up_sync_launch_down_end_to_end(
    cluster_name: str, state_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "setup.log"
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, f'echo "$(hostname)" >> {log}')
    program = job(tmp_path, PROGRAM)
    argv = ["-c", str(spec), "--up", "--down", "--instances", "2", sys.executable, str(program)]
    proc = cli("launch", *argv)
    assert proc.returncode == 0, proc.stderr
    hosts = [f"pa{TAG}1", f"pa{TAG}2"]
    assert sorted(log.read_text().split()) == hosts  # the spec's setup ran on every node
    assert sorted(line.split("] ", 1)[1] for line in proc.stdout.splitlines()) == [
        f"rank 0 on {hosts[0]}",
        f"rank 1 on {hosts[1]}",
    ]
    assert f"cluster {cluster_name} is up: 2 node(s) (local)" in proc.stderr
    assert f"cluster {cluster_name} is down" in proc.stderr
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []
    assert processes(str(program)) == ""


def test_one_key_tears_down_after_a_failed_job_and_keeps_its_exit_code(
    cluster_name: str, state_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, "true")
    program = job(tmp_path, "import os, sys, time\nos.environ['RANK'] == '1' and sys.exit(7)\n")
    proc = cli("launch", "-c", str(spec), "--up", "--down", "-n", "2", sys.executable, str(program))
    assert proc.returncode == 7, proc.stderr
    assert f"cluster {cluster_name} is down" in proc.stderr
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []


def test_one_key_ctrl_c_during_the_job_tears_down_and_exits_130(
    cluster_name: str, state_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, "true")
    program = job(tmp_path, WAITING)
    argv = ["launch", "-c", str(spec), "--up", "--down", "-n", "2", "--grace-period", "2"]
    client = subprocess.Popen(
        [sys.executable, "-m", "poprun_py", *argv, sys.executable, str(program), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    started = [tmp_path / "started-0", tmp_path / "started-1"]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in started) and time.monotonic() < deadline:
        assert client.poll() is None, client.communicate()[1]
        time.sleep(0.02)
    assert all(p.exists() for p in started), "the instances never started"
    os.kill(client.pid, signal.SIGINT)
    _, err = client.communicate(timeout=60)
    assert client.returncode == 130, err
    assert f"cluster {cluster_name} is down" in err
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []
    assert processes(str(program)) == ""


def test_one_key_up_twice_reuses_the_cluster_then_down_removes_it(
    cluster_name: str, state_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, "true")
    program = job(tmp_path, PROGRAM)
    argv = ["launch", "-c", str(spec), "--up", "-n", "2", sys.executable, str(program)]
    first = cli(*argv)
    assert first.returncode == 0, first.stderr
    assert "setup ran on 2, unchanged on 0" in first.stderr
    assert f"cluster {cluster_name} stays up; `poprun-py down {spec}` removes it" in first.stderr
    assert len(namespaces(cluster_name)) == 2
    second = cli(*argv)
    assert second.returncode == 0, second.stderr
    assert f"reusing local cluster {cluster_name}" in second.stderr
    assert "setup ran on 0, unchanged on 2" in second.stderr
    assert len(second.stdout.splitlines()) == 2
    gone = cli("down", str(spec))
    assert gone.returncode == 0, gone.stderr
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []


def test_one_key_detached_is_torn_down_by_the_supervisor_when_the_job_ends(
    cluster_name: str, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "jobs-state"))
    go = tmp_path / "go"
    text = (
        "import os, pathlib, time\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
        "print('rank', os.environ['RANK'], 'done')\n"
    )
    spec = write_spec(tmp_path / "c.yaml", cluster_name, 2, "true")
    program = job(tmp_path, text)
    argv = ["-c", str(spec), "--up", "--down", "--detach", "-n", "2", sys.executable, str(program)]
    proc = cli("launch", *argv)
    assert proc.returncode == 0, proc.stderr
    assert f"cluster {cluster_name} is removed when the job ends" in proc.stderr
    job_id = proc.stdout.splitlines()[-1]
    assert len(namespaces(cluster_name)) == 2  # up while the job runs, without the client
    go.touch()
    waited = cli("wait", job_id)
    assert waited.returncode == 0, waited.stderr
    logs = cli("logs", job_id).stdout
    assert "rank 0 done" in logs and "rank 1 done" in logs
    assert f"cluster {cluster_name} is down" in logs
    assert_all_gone(cluster_name)
    assert list(state_dir.iterdir()) == []


def test_one_key_detached_on_static_hosts_cleans_them_from_the_first_host(
    make_test_cluster: MakeCluster, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "jobs-state"))
    cluster = make_test_cluster(2, "pz")
    name = f"sz{os.getpid()}"
    hosts = "".join(
        f"  - {{name: {h.name}, address: {h.address}, user: root}}\n" for h in cluster.hosts
    )
    spec = tmp_path / "static.yaml"
    spec.write_text(
        f"name: {name}\nprovider: {{kind: static}}\nsetup: hostname\nhosts:\n{hosts}"
        f"ssh: {{known_hosts: {cluster.known_hosts}, identity_file: {cluster.identity_file}}}\n"
        "defaults: {backend: ssh}\n"
    )
    program = job(tmp_path, "import os\nprint('rank', os.environ['RANK'], 'done')\n")
    argv = ["-c", str(spec), "--up", "--down", "--detach", "-n", "2", sys.executable, str(program)]
    proc = cli("launch", *argv)
    assert proc.returncode == 0, proc.stderr
    assert f"supervised on host {cluster.hosts[0].name}" in proc.stderr
    job_id = proc.stdout.splitlines()[-1]
    waited = cli("wait", job_id)
    assert waited.returncode == 0, waited.stderr
    assert f"cluster {name} is down" in cli("logs", job_id).stdout
    assert not (hosts_home() / MARKER_ROOT / name).exists()  # cleaned by the supervisor
    assert all(host_pids(h.netns) for h in cluster.hosts)  # the machines themselves stay
