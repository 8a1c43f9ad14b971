"""The setup script: run once per node, and again whenever its content changes.

Each node keeps, under ``$HOME/.poprun-py/clusters/<cluster>/<node>/``, the script it last ran
(``setup.sh``) and the SHA-256 of its content (``setup.sha256``), written only after the script
succeeded. ``up`` sends the script with its digest; a node whose recorded digest matches skips
it, any other node runs it. So an edited script is re-run (ncluster issue #76: a done-marker
that ignored the content), and a failed run is retried by the next ``up``. The per-node
directory keeps nodes that share one filesystem (the local provider's hosts) apart.

The remote side is one fixed ``sh`` program; the cluster name, node name and digest travel as
its positional arguments and the script on stdin, so no shell text is built from data.

Example:

    >>> script_digest("echo hi\\n")[:12]
    'ab08508fdf5c'
    >>> setup_argv("demo", "n1", "ab12")[-3:]
    ['demo', 'n1', 'ab12']
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from poprun_py.errors import ProvisionError
from poprun_py.providers.base import NullReporter, Reporter

if TYPE_CHECKING:
    from poprun_py.core.spec import HostSpec
    from poprun_py.ssh.connection import Connection
    from poprun_py.ssh.settings import SshSettings

MARKER_ROOT = ".poprun-py/clusters"  # relative to the remote $HOME
SETUP_TIMEOUT = 3600.0
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_RAN = "poprun-py-setup: ran"
_UNCHANGED = "poprun-py-setup: unchanged"

# $1 cluster, $2 node, $3 digest; the script arrives on stdin. Scripts with a #! line run
# through their interpreter, others with `sh -e`. The digest is written (atomically) last.
SETUP_PROGRAM = f"""set -eu
dir="$HOME/{MARKER_ROOT}/$1/$2"
mkdir -p "$dir"
if [ -f "$dir/setup.sha256" ] && [ "$(cat "$dir/setup.sha256")" = "$3" ]; then
  cat >/dev/null
  echo "{_UNCHANGED}"
  exit 0
fi
rm -f "$dir/setup.sha256"
cat > "$dir/setup.sh"
chmod 700 "$dir/setup.sh"
cd "$HOME"
if [ "$(head -c 2 "$dir/setup.sh")" = "#!" ]; then
  "$dir/setup.sh" </dev/null
else
  sh -e "$dir/setup.sh" </dev/null
fi
printf '%s\\n' "$3" > "$dir/setup.sha256.tmp"
mv "$dir/setup.sha256.tmp" "$dir/setup.sha256"
echo "{_RAN}"
"""

# $1 cluster: remove what poprun-py put on the node, and the parents it made if now empty.
CLEAN_PROGRAM = f"""set -eu
rm -rf "$HOME/{MARKER_ROOT}/$1"
rmdir "$HOME/{MARKER_ROOT}" "$HOME/.poprun-py" 2>/dev/null || true
"""


@dataclass(frozen=True)
class SetupOutcome:
    """What the setup step did on one node."""

    host: str
    ran: bool  # False: the recorded digest matched, the script was skipped
    exit_code: int
    output: str  # the last lines of the script's stdout and stderr
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def script_digest(script: str) -> str:
    """The SHA-256 of the script's content (what decides whether it runs again)."""
    return hashlib.sha256(script.encode("utf-8")).hexdigest()


def _safe(name: str, what: str) -> str:
    if not _SAFE.fullmatch(name):
        raise ProvisionError(f"bad {what} name {name!r} for the setup directory")
    return name


def setup_argv(cluster: str, node: str, digest: str) -> list[str]:
    """The remote argv of the setup step (the script goes on stdin)."""
    return [
        "sh",
        "-c",
        SETUP_PROGRAM,
        "poprun-py-setup",
        _safe(cluster, "cluster"),
        _safe(node, "node"),
        digest,
    ]


def clean_argv(cluster: str) -> list[str]:
    """The remote argv removing the cluster's setup directories from a node."""
    return ["sh", "-c", CLEAN_PROGRAM, "poprun-py-clean", _safe(cluster, "cluster")]


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def outcome(host: str, exit_code: int, stdout: str, stderr: str, duration: float) -> SetupOutcome:
    """Read one node's result of :func:`setup_argv`."""
    lines = stdout.strip().splitlines()
    ran = exit_code != 0 or lines[-1:] != [_UNCHANGED]
    body = "\n".join(line for line in lines if line not in (_RAN, _UNCHANGED))
    output = _tail(f"{body}\n{stderr}")
    return SetupOutcome(host, ran, exit_code, output, duration)


def check_outcomes(outcomes: Sequence[SetupOutcome]) -> None:
    """Raise ProvisionError naming the first failed node (and how many others failed)."""
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return
    first = failed[0]
    more = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
    last = first.output.splitlines()[-1] if first.output else "no output"
    raise ProvisionError(
        f"setup script failed on {first.host} with exit code {first.exit_code}{more}: {last}"
    )


def run_setup(
    hosts: Sequence[HostSpec],
    cluster: str,
    script: str,
    settings: SshSettings,
    reporter: Reporter | None = None,
) -> tuple[SetupOutcome, ...]:
    """Run ``script`` on every host where its digest differs; raise if any node failed."""
    from poprun_py.providers.reach import on_each_host

    report = reporter or NullReporter()
    digest = script_digest(script)
    report.start("running the setup script", len(hosts))

    def one(conn: Connection, host: HostSpec) -> SetupOutcome:
        argv = setup_argv(cluster, host.name, digest)
        res = conn.run(argv, stdin=script.encode("utf-8"), timeout=SETUP_TIMEOUT)
        report.advance("running the setup script")
        return outcome(host.name, res.exit_code, res.stdout, res.stderr, res.duration)

    outcomes = on_each_host(hosts, settings, one)
    check_outcomes(outcomes)
    return outcomes


def clean_setup(hosts: Sequence[HostSpec], cluster: str, settings: SshSettings) -> tuple[str, ...]:
    """Remove the cluster's setup directories from every host; the hosts cleaned."""
    from poprun_py.providers.reach import on_each_host

    def one(conn: Connection, host: HostSpec) -> str:
        res = conn.run(clean_argv(cluster), timeout=60.0)
        if res.exit_code != 0:
            raise ProvisionError(f"cleaning {host.name} failed: {_tail(res.stderr, 1)}")
        return host.name

    return on_each_host(hosts, settings, one)
