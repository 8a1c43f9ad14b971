"""This machine's list of the detached jobs it launched: where each one's supervisor is.

One file per job, ``$XDG_STATE_HOME/poprun-py/jobs/ID.json`` (default
``~/.local/state/poprun-py/jobs``), mode 0600: the job's id, the host its supervisor runs on
and how to reach it again (the cluster spec -- a copy is kept beside the entry -- or
``--hosts``, and the SSH flags). No secret is in it. Losing it loses no job: ``jobs -c
CLUSTER`` asks every host of the cluster (:mod:`poprun_py.cli.jobs_cmd`).

Example:

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> save(Entry("c-1", "h1", cluster=None, hosts="h1,h2"), root)
    >>> [e.supervisor for e in entries(root)], find("c-1", root).hosts, find("c-2", root)
    (['h1'], 'h1,h2', None)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from poprun_py.hostside import private


@dataclass(frozen=True)
class Entry:
    """How to reach one job's supervisor again (``supervisor`` "localhost": this machine)."""

    id: str
    supervisor: str
    cluster: str | None = None  # the spec's path when launched (a copy is kept: cluster_copy)
    hosts: str | None = None
    ssh: dict[str, Any] = field(default_factory=dict)  # SshOptions as given
    created: float = 0.0
    ended: dict[str, Any] | None = None  # the job's record once seen ended: not asked again

    @property
    def local(self) -> bool:
        """True when the supervisor runs on this machine."""
        return self.supervisor == "localhost"


def state_root() -> Path:
    """Where the entries are kept."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "poprun-py" / "jobs"


def save(entry: Entry, root: Path | None = None, cluster_text: str | None = None) -> None:
    """Write ``entry`` (and a copy of its cluster spec) privately."""
    where = Path(private.private_dir(str(root or state_root())))
    if cluster_text is not None:
        write_private(where / f"{entry.id}.yaml", cluster_text)
    write_private(where / f"{entry.id}.json", json.dumps(asdict(entry), indent=1) + "\n")


def cluster_copy(entry: Entry, root: Path | None = None) -> str | None:
    """The spec to reach the job with: the original if it is still there, else the copy."""
    if entry.cluster and os.path.isfile(entry.cluster):
        return entry.cluster
    copy = (root or state_root()) / f"{entry.id}.yaml"
    return str(copy) if copy.is_file() else entry.cluster


def find(job_id: str, root: Path | None = None) -> Entry | None:
    """The entry of ``job_id``, if this machine launched it."""
    path = (root or state_root()) / f"{job_id}.json"
    try:
        return _entry(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def entries(root: Path | None = None) -> list[Entry]:
    """Every entry, oldest first."""
    where = root or state_root()
    found = [find(p.stem, where) for p in sorted(where.glob("*.json"))]
    return sorted((e for e in found if e is not None), key=lambda e: e.created)


def _entry(data: dict[str, Any]) -> Entry:
    known = Entry.__dataclass_fields__
    return Entry(**{k: v for k, v in data.items() if k in known})


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, mode 0600 (a reader sees old or new; two
    writers never collide): :func:`poprun_py.hostside.private.write_private`."""
    private.write_private(str(path), text)


def remove(job_id: str, root: Path | None = None) -> bool:
    """Forget ``job_id`` (its entry and its copy of the cluster spec); True if it was known."""
    where = root or state_root()
    found = False
    for suffix in (".json", ".yaml"):
        try:
            (where / f"{job_id}{suffix}").unlink()
            found = found or suffix == ".json"
        except FileNotFoundError:
            pass
    return found
