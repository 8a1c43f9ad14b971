"""``launch --up [--down]`` at the seams: a FakeProvider in the provider registry, a FakeBackend
in the backend registry, the real CLI, lifecycle, inventory and launcher in between."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from poprun_py.backends import BACKENDS
from poprun_py.cli import run
from poprun_py.core.spec import ClusterSpec, ProviderSpec
from poprun_py.process.signals import deferring
from poprun_py.providers import PROVIDERS
from poprun_py.providers.lifecycle import down
from poprun_py.providers.records import ProvisionRecord
from poprun_py.testing.fakes import FakeBackend, FakeProvider, FakeRunning, Script
from tests.unit.in_child import in_child

if TYPE_CHECKING:
    from poprun_py.core.result import RunOptions
    from poprun_py.process.signals import Control
    from poprun_py.providers.base import ProvisionContext
    from poprun_py.render.job import RenderedJob

SPEC = "name: ok\nprovider: {kind: local, num_nodes: 2}\ndefaults: {backend: ssh}\n"


@dataclass
class InterruptedBackend(FakeBackend):
    """Ctrl-C arrives as soon as the instances run."""

    def start(self, job: RenderedJob, options: RunOptions, control: Control) -> FakeRunning:
        running = super().start(job, options, control)
        control.interrupt()
        return running


@dataclass
class InterruptedProvider(FakeProvider):
    """Ctrl-C arrives while the nodes are being created (after the first was recorded)."""

    def create(self, spec: ClusterSpec, ctx: ProvisionContext) -> ProvisionRecord:
        super().create(spec, ctx)
        raise KeyboardInterrupt


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POPRUN_PY_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / "clusters"


def one_key(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    *flags: str,
    provider: FakeProvider | None = None,
    backend: FakeBackend | None = None,
    spec: str = SPEC,
) -> tuple[int, FakeProvider, FakeBackend]:
    provider = provider or FakeProvider()
    backend = backend or FakeBackend()
    monkeypatch.setitem(PROVIDERS, "local", lambda: provider)
    monkeypatch.setitem(BACKENDS, "ssh", lambda: backend)
    path = tmp_path / "c.yaml"
    path.write_text(spec)
    program = tmp_path / "t.py"
    program.write_text("print('hi')\n")
    code = run(["launch", "-c", str(path), *flags, "python3", str(program)])
    return code, provider, backend


def test_up_syncs_and_launches_on_the_inventory_hosts_then_down_removes_all(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, provider, backend = one_key(monkeypatch, tmp_path, "--up", "--down")
    assert code == 0, capsys.readouterr().err
    assert provider.calls == ["cost_notice", "create", "wait_until_reachable", "terminate"]
    assert backend.opened == [("ok-1", "ok-2")]  # the hosts up made, from its inventory
    assert backend.calls.index("sync") < backend.calls.index("start")  # --up implies --sync
    assert provider.created == [] and list(state.iterdir()) == []
    err = capsys.readouterr().err
    assert "cluster ok is up: 2 node(s)" in err and "cluster ok is down" in err


def test_without_down_the_cluster_stays_up_and_says_how_to_remove_it(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, provider, _ = one_key(monkeypatch, tmp_path, "--up")
    assert code == 0
    assert "terminate" not in provider.calls and provider.created == ["fake-1", "fake-2"]
    assert (state / "ok.inventory.yaml").exists()
    assert "cluster ok stays up; `poprun-py down " in capsys.readouterr().err


def test_a_failed_job_is_torn_down_and_keeps_its_exit_code(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend({0: Script(exit_code=7), 1: Script(hang=True)})
    code, provider, _ = one_key(monkeypatch, tmp_path, "--up", "--down", backend=backend)
    assert code == 7
    assert provider.calls[-1] == "terminate" and list(state.iterdir()) == []


def test_ctrl_c_during_the_job_tears_down_and_exits_130(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = InterruptedBackend({0: Script(hang=True), 1: Script(hang=True)})
    code, provider, _ = one_key(monkeypatch, tmp_path, "--up", "--down", backend=backend)
    assert code == 130
    assert provider.calls[-1] == "terminate" and list(state.iterdir()) == []


def test_ctrl_c_or_a_failure_during_up_still_tears_down(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, provider, backend = one_key(
        monkeypatch, tmp_path, "--up", "--down", provider=InterruptedProvider()
    )
    assert (code, provider.calls[-1], backend.calls) == (130, "terminate", [])
    assert list(state.iterdir()) == []
    code, provider, backend = one_key(
        monkeypatch, tmp_path, "--up", "--down", provider=FakeProvider(fail_on="create")
    )
    assert (code, provider.calls[-1], backend.calls) == (1, "terminate", [])


def test_a_failed_teardown_is_the_error_only_when_the_job_succeeded(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = FakeProvider(fail_on="terminate")
    code, _, _ = one_key(monkeypatch, tmp_path, "--up", "--down", provider=failing)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert last.startswith("poprun-py: error: tearing down cluster ok failed: fake provider")
    assert last.endswith(f"run `poprun-py down {tmp_path / 'c.yaml'}`")
    backend = FakeBackend({0: Script(exit_code=5), 1: Script(exit_code=5)})
    code, _, _ = one_key(monkeypatch, tmp_path, "--up", "--down", provider=failing, backend=backend)
    err = capsys.readouterr().err
    assert code == 5 and "tearing down cluster ok failed" in err


def test_a_cost_is_confirmed_before_anything_is_created(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115 - no terminal to ask on
    priced = FakeProvider(cost="2 nodes at $3/h")
    code, provider, _ = one_key(monkeypatch, tmp_path, "--up", "--down", provider=priced)
    assert (code, provider.calls) == (2, ["cost_notice"])
    assert "pass --yes to confirm" in capsys.readouterr().err
    code, provider, _ = one_key(monkeypatch, tmp_path, "--up", "--down", "--yes", provider=priced)
    assert code == 0 and provider.calls[-1] == "terminate"


NO_PROVIDER = "name: plain\nhosts: [{name: h1, address: 198.18.250.1}]\n"
BAD = [
    (
        "down-without-provider",
        ["--down"],
        NO_PROVIDER,
        "--down needs a cluster spec with a provider:",
    ),
    ("up-without-provider", ["--up"], NO_PROVIDER, "--up needs a cluster spec with a provider"),
    ("down-without-up", ["--down"], SPEC, "--down needs --up"),
    ("up-with-hosts", ["--up", "--hosts", "h9"], SPEC, "drop --hosts"),
    ("up-with-dry-run", ["--up", "--down", "--dry-run"], SPEC, "--dry-run starts nothing"),
]


@pytest.mark.parametrize(("flags", "spec", "text"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_one_key_flags_exit_2_with_one_line_and_create_nothing(
    flags: list[str],
    spec: str,
    text: str,
    state: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, provider, backend = one_key(monkeypatch, tmp_path, *flags, spec=spec)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and text in err, err
    assert (provider.calls, backend.calls) == ([], [])
    assert not state.exists()


def test_up_needs_a_spec_and_is_an_option_of_launch_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["launch", "--up", "true"]) == 2
    assert "--up needs --cluster/-c SPEC" in capsys.readouterr().err
    assert run(["plan", "--up", "--hosts", "h1", "true"]) == 2
    assert "--up is an option of launch only, not of plan" in capsys.readouterr().err


def test_teardown_finishes_through_ctrl_c_and_notes_it(tmp_path: Path) -> None:
    class SignalledProvider(FakeProvider):
        def terminate(self, spec, record, ctx):  # type: ignore[no-untyped-def]
            # the forked child's pid (in_child), never pytest's; handled before kill() returns
            os.kill(os.getpid(), signal.SIGINT)
            return super().terminate(spec, record, ctx)

    notes: list[str] = []

    class Notes:
        def start(self, step: str, total: int) -> None:
            pass

        def advance(self, step: str, amount: int = 1) -> None:
            pass

        def note(self, message: str) -> None:
            notes.append(message)

    spec = ClusterSpec("demo", (), provider=ProviderSpec(kind="local", num_nodes=1))

    def run() -> tuple[str, list[str], bool]:  # in a forked child: the SIGINT goes to it
        before = signal.getsignal(signal.SIGINT)
        result = down(
            spec, root=tmp_path, provider=SignalledProvider(), reporter=Notes(), hold_signals=True
        )
        return result.cluster, notes, signal.getsignal(signal.SIGINT) is before

    cluster, noted, restored = in_child(run)
    assert cluster == "demo"
    assert noted == ["signal 2: still tearing down cluster demo; it will finish"]
    assert restored  # the handler from before is back


def test_deferring_records_the_signals_and_restores_the_handlers() -> None:
    def run() -> tuple[list[int], bool]:  # in a forked child: the SIGTERM goes to it
        before = signal.getsignal(signal.SIGTERM)
        with deferring() as arrived:
            os.kill(os.getpid(), signal.SIGTERM)  # without deferring: the child dies of it
        return list(arrived), signal.getsignal(signal.SIGTERM) is before

    arrived, restored = in_child(run)
    assert arrived == [signal.SIGTERM]
    assert restored
