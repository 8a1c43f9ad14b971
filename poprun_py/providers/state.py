"""Per-cluster state: one JSON file (mode 0600, written atomically) plus the files beside it.

The state directory is ``$POPRUN_PY_STATE_DIR/clusters`` when that variable is set, else
``$XDG_STATE_HOME/poprun-py/clusters`` (``~/.local/state/poprun-py/clusters``). For a cluster
``NAME`` it holds:

    NAME.json            the ProvisionRecord (what exists; see providers.base)
    NAME.inventory.yaml  the hosts, for ``poprun-py launch --cluster``
    NAME.known_hosts     the nodes' host keys
    NAME.pem             the private key of a cloud key pair

Every file is written to a temporary name and renamed over the old one, so a killed process
leaves either the old or the new file, never half of one.

Example:

    >>> import tempfile
    >>> from poprun_py.providers.records import ProvisionRecord
    >>> state = ClusterState("demo", Path(tempfile.mkdtemp()))
    >>> state.save(ProvisionRecord("demo", "static"))
    >>> state.load().provider, oct(state.record_path.stat().st_mode & 0o777)
    ('static', '0o600')
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from poprun_py.errors import ProvisionError, UsageError
from poprun_py.hostside import private
from poprun_py.providers.records import ProvisionRecord

STATE_ENV = "POPRUN_PY_STATE_DIR"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_SUFFIXES = (".json", ".inventory.yaml", ".known_hosts", ".pem")


def state_root() -> Path:
    """The directory holding every cluster's state files (see the module docstring)."""
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(override).expanduser() / "clusters"
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "poprun-py" / "clusters"


def check_cluster_name(name: str) -> str:
    """Return ``name`` if it can name state files and cloud resources."""
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise UsageError(f"bad cluster name {name!r}: use [A-Za-z0-9_.-], at most 64 characters")
    return name


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600, its directory made 0700
    (:func:`poprun_py.hostside.private.write_private`)."""
    private.write_private(private.private_dir(str(path.parent)) + "/" + path.name, text)


@dataclass(frozen=True)
class ClusterState:
    """The state files of one cluster under ``root`` (default :func:`state_root`)."""

    name: str
    root: Path

    @staticmethod
    def of(name: str, root: Path | None = None) -> ClusterState:
        """The state of cluster ``name`` (the name is checked)."""
        return ClusterState(check_cluster_name(name), root or state_root())

    @property
    def record_path(self) -> Path:
        return self.root / f"{self.name}.json"

    @property
    def inventory_path(self) -> Path:
        return self.root / f"{self.name}.inventory.yaml"

    @property
    def known_hosts_path(self) -> Path:
        return self.root / f"{self.name}.known_hosts"

    @property
    def key_path(self) -> Path:
        return self.root / f"{self.name}.pem"

    def load(self) -> ProvisionRecord | None:
        """The saved record, or None when there is none."""
        try:
            data = json.loads(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ProvisionError(f"cannot read state file {self.record_path}: {exc}") from exc
        try:
            return ProvisionRecord.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProvisionError(f"damaged state file {self.record_path}: {exc!r}") from exc

    def save(self, record: ProvisionRecord) -> None:
        """Write the record atomically, mode 0600."""
        write_private(self.record_path, json.dumps(record.to_dict(), indent=2) + "\n")

    def remove(self) -> None:
        """Delete every state file of this cluster (missing files are fine)."""
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                (self.root / f"{self.name}{suffix}").unlink()


def list_states(root: Path | None = None) -> Iterator[ClusterState]:
    """The states of every cluster that has a state file, by name."""
    base = root or state_root()
    for path in sorted(base.glob("*.json")):
        name = path.name.removesuffix(".json")
        if _NAME.fullmatch(name):
            yield ClusterState(name, base)
