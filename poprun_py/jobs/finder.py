"""Finding detached jobs: through this machine's registry, or by asking a cluster's hosts.

:func:`job_host` gives the host of one job's supervisor (and the job's record): the registry's
entry says which host and how to reach it; without an entry (the registry was lost, or the job
was launched elsewhere) every host of the cluster named with ``-c``/``--hosts`` is asked, this
machine first. :func:`all_jobs` lists the jobs of every supervisor host the registry knows, and
of every host of a named cluster, each host over one fresh connection, all in parallel;
:func:`prune_jobs` removes the ended ones (their directories there, their entries here).

Example::

    with job_host("c-20261201-120000-ab12", hosts=None, cluster=None) as (host, record):
        print(record.state)
    records, problems = all_jobs(None, "clusters/testhosts-4.yaml", SshOptions())
    pruned, problems = prune_jobs(None, None, SshOptions(), older_than=7 * 86400)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from poprun_py.core.spec import SshOptions
from poprun_py.errors import PoprunError, UsageError
from poprun_py.jobs import registry
from poprun_py.jobs.place import JobHost, LocalJobHost, RemoteJobHost
from poprun_py.jobs.record import JobRecord, from_json, observed

if TYPE_CHECKING:
    from poprun_py.core.spec import ClusterSpec
    from poprun_py.ssh.pool import ConnectionPool


def record_of(data: dict[str, Any]) -> JobRecord:
    """A hostops answer (a record with ``alive``) as the record as it stands."""
    return observed(from_json(data), supervisor_alive=bool(data.get("alive")))


@contextlib.contextmanager
def job_host(
    job_id: str, hosts: str | None, cluster: str | None, *, shown: bool = True
) -> Iterator[tuple[JobHost, JobRecord | None]]:
    """The host running ``job_id``'s supervisor and (``shown``, else None when the registry
    names the host) the job's record; UsageError (exit 2) for a job nobody knows."""
    entry = registry.find(job_id)
    if entry is not None and entry.local:
        yield _shown(LocalJobHost(), job_id, shown)
        return
    if entry is not None:
        spec = _cluster(entry.hosts, registry.cluster_copy(entry))
        with _pool(spec, SshOptions(**entry.ssh), [entry.supervisor]) as pool:
            conn = pool.open_all()[entry.supervisor]
            yield _shown(RemoteJobHost(conn), job_id, shown)
        return
    if hosts or cluster:
        with _pool(_cluster(hosts, cluster), SshOptions()) as pool:
            found = pool.each(lambda c: (c, RemoteJobHost(c).call("show", job_id)), connect=True)
            for got in found.values():
                if got.ok and got.value[1] is not None:
                    conn, shown_there = got.value
                    yield RemoteJobHost(conn), record_of(shown_there)
                    return
    local = LocalJobHost().call("show", job_id)
    if local is not None and local.get("supervisor") == "localhost":
        yield LocalJobHost(), record_of(local)
        return
    if hosts or cluster:
        raise UsageError(f"unknown job {job_id}: no host of the cluster has it")
    raise UsageError(
        f"unknown job {job_id}: this machine launched no such job "
        "(name its cluster with -c/--hosts to ask the cluster's hosts)"
    )


def _shown(host: JobHost, job_id: str, shown: bool = True) -> tuple[JobHost, JobRecord | None]:
    if not shown:
        return host, None
    data = host.call("show", job_id)
    if data is None:
        raise UsageError(f"unknown job {job_id}: host {host.name} has no such job any more")
    return host, record_of(data)


def all_jobs(
    hosts: str | None, cluster: str | None, ssh: SshOptions
) -> tuple[list[JobRecord], list[str]]:
    """Every job known here or on the named cluster's hosts, oldest first; and one line per
    host that could not be asked."""
    found: dict[str, JobRecord] = {}
    problems: list[str] = []
    entries = registry.entries()
    groups = _supervisor_groups([e for e in entries if e.ended is None])
    if hosts or cluster:
        groups.append((_cluster(hosts, cluster), ssh, None))
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as workers:
        for records, lines in workers.map(lambda g: _ask(*g), groups):
            problems += lines
            for record in records:
                found.setdefault(record.id, record)
    _remember_ended(entries, found)
    for entry in entries:
        if entry.ended is not None:
            found.setdefault(entry.id, from_json(entry.ended))
    for data in LocalJobHost().call("list"):
        if data.get("supervisor") == "localhost":
            found.setdefault(data["id"], record_of(data))
    return sorted(found.values(), key=lambda r: r.created), problems


def _remember_ended(entries: list[registry.Entry], found: dict[str, JobRecord]) -> None:
    """Keep each registry entry's ended job's record: ``jobs`` need not ask its host again
    (which may be long gone)."""
    from dataclasses import asdict, replace

    for entry in entries:
        record = found.get(entry.id)
        if entry.ended is None and record is not None and not record.active:
            kept = {k: v for k, v in asdict(record).items() if k != "options"}
            registry.save(replace(entry, ended=kept))


def _supervisor_groups(
    entries: list[registry.Entry],
) -> list[tuple[ClusterSpec, SshOptions, list[str] | None]]:
    """One (cluster, SSH flags, supervisor hosts) per way of reaching the registry's hosts."""
    groups: dict[tuple[Any, ...], tuple[ClusterSpec, SshOptions, list[str]]] = {}
    for entry in entries:
        if entry.local:
            continue
        key = (entry.hosts, entry.cluster, tuple(sorted(entry.ssh.items())))
        try:
            spec = _cluster(entry.hosts, registry.cluster_copy(entry))
        except PoprunError:
            continue  # its cluster spec is gone: `jobs -c SPEC` still finds the job
        group = groups.setdefault(key, (spec, SshOptions(**entry.ssh), []))
        if entry.supervisor not in group[2]:
            group[2].append(entry.supervisor)
    return list(groups.values())


def _ask(
    spec: ClusterSpec, ssh: SshOptions, names: list[str] | None
) -> tuple[list[JobRecord], list[str]]:
    """The jobs on the hosts ``names`` of ``spec`` (all of them: None)."""
    answers, problems = _on_hosts(spec, ssh, names, "list")
    return [record_of(data) for got in answers for data in got], problems


def _on_hosts(
    spec: ClusterSpec, ssh: SshOptions, names: list[str] | None, op: str, *args: str
) -> tuple[list[Any], list[str]]:
    """The answers of the hosts ``names`` of ``spec`` (all of them: None) to a hostops
    operation, and one line per host that could not be asked."""
    found: list[Any] = []
    problems: list[str] = []
    with _pool(spec, ssh, names) as pool:
        answers = pool.each(lambda c: RemoteJobHost(c).call(op, *args), connect=True)
    for host, got in answers.items():
        if got.fault is not None:
            what = "list the jobs" if op == "list" else f"{op} the jobs"
            problems.append(f"cannot {what} on host {host}: {got.fault}")
            continue
        found.append(got.value)
    return found, problems


def prune_jobs(
    hosts: str | None, cluster: str | None, ssh: SshOptions, older_than: float = 0.0
) -> tuple[list[str], list[str]]:
    """Remove every detached job that ended at least ``older_than`` seconds ago: its directory
    on this machine, on every supervisor host the registry names and on every host of the
    named cluster, and its registry entry here. The ids removed, and one line per host that
    could not be asked."""
    age = repr(float(older_than))
    pruned = set(LocalJobHost().call("prune", age))
    entries = registry.entries()
    groups = _supervisor_groups(entries)
    if hosts or cluster:
        groups.append((_cluster(hosts, cluster), ssh, None))
    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as workers:
        for answers, lines in workers.map(lambda g: _on_hosts(*g, "prune", age), groups):
            problems += lines
            pruned.update(job_id for got in answers for job_id in got)
    now = time.time()
    for entry in entries:
        ended = (entry.ended or {}).get("ended") or entry.created
        if entry.id in pruned or (entry.ended is not None and now - ended >= older_than):
            registry.remove(entry.id)
            pruned.add(entry.id)
    return sorted(pruned), problems


def _cluster(hosts: str | None, cluster: str | None) -> ClusterSpec:
    from poprun_py.prepare.specfile import target_cluster

    return target_cluster(hosts, cluster)


@contextlib.contextmanager
def _pool(
    spec: ClusterSpec, ssh: SshOptions, names: list[str] | None = None
) -> Iterator[ConnectionPool]:
    from poprun_py.ssh.pool import ConnectionPool
    from poprun_py.ssh.settings import settings_for

    wanted = [h for h in spec.hosts if names is None or h.name in names]
    if names is not None and len(wanted) < len(names):
        missing = sorted(set(names) - {h.name for h in wanted})
        raise UsageError(f"host {missing[0]} is no longer in cluster {spec.name}")
    with ConnectionPool(wanted, settings_for(spec, ssh)) as pool:
        yield pool


__all__ = ["all_jobs", "job_host", "prune_jobs", "record_of"]
