"""A plan as a Kubernetes manifest (``poprun-py render --backend k8s``): one pod per host of the
plan, each running ``poprun-py launch --per-node``.

Two kinds (``--k8s-kind``): a JobSet (``jobset``, the default: ``jobset.x-k8s.io/v1alpha2``,
one replicated Job ``node`` of N indexed pods, whose pods JobSet names
``<name>-node-0-<index>.<name>``), or an Indexed Job with a headless Service (``job``: pods
named ``<name>-<index>.<name>``, the Service being the pods' ``subdomain``). Every pod gets:

- the command ``poprun-py launch --per-node --hosts <every pod's name> --secret-file
  /var/run/poprun/secret --max-restarts=0 <the job's options> -- PROGRAM ARGS``; its rank is
  Kubernetes' ``JOB_COMPLETION_INDEX``, and ``POPRUN_NNODES`` and ``POPRUN_COORDINATOR`` (pod
  0's name) are in its environment;
- the plan's resources, requests = limits, when the host's topology is known: ``cpu`` (the
  host's CPUs), ``memory`` (its NUMA nodes' ``memory:`` together, as a quantity such as
  ``96Gi``, when the spec declares it) and ``nvidia.com/gpu`` (``amd.com/gpu`` for AMD) the
  host's devices;
- the shared secret as a file, from the Kubernetes Secret ``poprun-secret`` (key ``secret``),
  never its value;
- ``--max-restarts`` as Kubernetes' whole-job restart: JobSet's ``failurePolicy.maxRestarts``
  (each pod's Job has ``backoffLimit: 0``), or the Indexed Job's ``backoffLimitPerIndex``
  with ``maxFailedIndexes: 0``. Inside the pods poprun-py restarts nothing: a lost pod can only
  come back as a new pod, which Kubernetes makes.

The templates are ``pernode-jobset.j2`` and ``pernode-job.j2`` (each including
``pernode-pod.j2``), overridable with ``--templates`` like the others; every value is written as
JSON (``tojson``), which YAML reads as it is.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> cluster = cluster_from_hosts(parse_hosts("h1,h2"))
    >>> plan = make_plan(cluster, JobSpec(("train.py",), replicas=2))
    >>> request = Request(image="registry.example/train:1", kind="jobset")
    >>> text = render_manifest(plan, request, ["--replicas=2", "--", "train.py"])
    >>> "kind: JobSet" in text, pod_names(job_name(request, plan.program), "jobset", 2)
    (True, ('poprun-train-node-0-0.poprun-train', 'poprun-train-node-0-1.poprun-train'))
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poprun_py.core.plan import LaunchPlan
from poprun_py.core.topology import format_memory
from poprun_py.errors import RenderError, UsageError

KINDS: Mapping[str, str] = {"jobset": "pernode-jobset.j2", "job": "pernode-job.j2"}
"""``--k8s-kind`` -> its template."""
REPLICATED_JOB = "node"
"""The JobSet's one replicated Job: its pods are ``<name>-node-0-<index>``."""
SECRET_NAME, SECRET_KEY, SECRET_DIR = "poprun-secret", "secret", "/var/run/poprun"
SECRET_FILE = posixpath.join(SECRET_DIR, SECRET_KEY)
"""Where every pod finds the shared secret: the Secret's key, mounted read-only."""
NOT_IN_THE_POD: Mapping[str, str] = {
    "hosts": "the pods' own names replace the plan's hosts",
    "cluster": "the spec file stays here: the plan's sizes and env: go in its place",
    "backend": "each pod runs its own share per node",
    "max_restarts": "Kubernetes restarts the whole job (failurePolicy.maxRestarts)",
    "spare_hosts": "Kubernetes places a new pod where a lost one was",
    "sync": "the image carries the program",
    "templates": "a directory here, not in the image",
    "detach": "the job runs in Kubernetes already",
    "fmt": "it says how render prints",
    "dry_run": "it says how render prints",
    **{k: "no SSH between pods" for k in ("accept_new_host_keys", "known_hosts", "ssh_config")},
    **{k: "no SSH between pods" for k in ("ssh_client", "identity", "user", "connect_timeout")},
    **{k: "from the pod's environment" for k in ("node_rank", "nnodes", "coordinator")},
    "secret_file": f"the Secret, mounted at {SECRET_FILE}",
}
"""Options of ``launch`` that the pods' ``launch`` does not get, each with why."""
_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""A DNS-1035 label, which a Service's name must be (a JobSet makes one of its name too)."""
_MAX_LABEL = 63


@dataclass(frozen=True)
class Request:
    """What ``render --backend k8s`` was given: ``--image``, ``--k8s-kind``, ``--k8s-name``."""

    image: str | None
    kind: str = "jobset"
    name: str | None = None


def not_launched(backend: str) -> str:
    """The one line that refuses ``launch``/``check`` of a backend that is only rendered."""
    return (
        f"{backend} is rendered, not launched: poprun-py render --backend {backend} ... "
        "> job.yaml, then kubectl apply -f job.yaml"
    )


def render_manifest(
    plan: LaunchPlan,
    request: Request,
    launch_args: Sequence[str],
    max_restarts: int = 0,
    templates_dir: Path | None = None,
) -> str:
    """The manifest (YAML) for ``plan``; ``launch_args`` are the pods' ``launch`` options, then
    ``--`` and the program. UsageError (exit 2, one line) for no image, an unknown kind or a
    name Kubernetes refuses; RenderError for hosts that differ in resources."""
    from poprun_py.render.environment import render_template

    kind, image = _check(request)
    name = job_name(request, plan.program)
    count = len(plan.hosts)
    _check_name(name, kind, count)
    context = {
        "name": name,
        "kind": kind,
        "image": image,
        "nnodes": count,
        "max_restarts": max_restarts,
        "replicated_job": REPLICATED_JOB,
        "command": pod_command(name, kind, count, launch_args),
        "env": pod_env(name, kind, count),
        "resources": resources(plan),
        "secret": {"name": SECRET_NAME, "key": SECRET_KEY, "dir": SECRET_DIR},
        "plan": plan,
    }
    return render_template(KINDS[kind], context, templates_dir)


def _check(request: Request) -> tuple[str, str]:
    if request.kind not in KINDS:
        choices = " or ".join(KINDS)
        raise UsageError(f"--k8s-kind must be {choices}, got {request.kind!r}")
    if not request.image:
        raise UsageError(
            "render --backend k8s needs --image IMAGE: the container image with poprun-py "
            "and the program"
        )
    return request.kind, request.image


def job_name(request: Request, program: Sequence[str]) -> str:
    """``--k8s-name``, else ``poprun-<program>``: its first word that is not Python nor an
    option (``python3 train.py`` -> ``train``), without ``.py``, as a DNS label (lower case,
    ``-`` for anything else)."""
    if request.name:
        return request.name
    names = [posixpath.basename(w) for w in program if not w.startswith("-")]
    words = [w for w in names if not w.startswith("python")] or names
    base = (words[0] if words else "job").removesuffix(".py")
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "job"
    return f"poprun-{slug}"[:40].rstrip("-")


def _check_name(name: str, kind: str, count: int) -> None:
    longest = pod_names(name, kind, count)[-1].partition(".")[0]
    if not _LABEL.match(name) or len(longest) > _MAX_LABEL:
        raise UsageError(
            f"--k8s-name {name!r}: Kubernetes needs lower-case letters, digits and '-', "
            f"from a letter (its pods' names, such as {longest!r}, at most {_MAX_LABEL} "
            "characters)"
        )


def pod_names(name: str, kind: str, count: int) -> tuple[str, ...]:
    """Every pod's stable DNS name, by rank (within the namespace): JobSet's
    ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>``, the Indexed Job's
    ``<job>-<index>.<service>``; the subdomain and the Service are called ``name``."""
    return tuple(_pod_name(name, kind, str(i)) for i in range(count))


def hosts_expression(name: str, kind: str, count: int) -> str:
    """:func:`pod_names` as one ``--hosts`` range (``job-[0-3].job``), which poprun-py
    expands: one short word however many pods."""
    return _pod_name(name, kind, "0" if count == 1 else f"[0-{count - 1}]")


def _pod_name(name: str, kind: str, index: str) -> str:
    host = f"{name}-{REPLICATED_JOB}-0-{index}" if kind == "jobset" else f"{name}-{index}"
    return f"{host}.{name}"


def pod_command(name: str, kind: str, count: int, launch_args: Sequence[str]) -> list[str]:
    """What every pod runs: ``launch --per-node`` on every pod's name, the secret's file, no
    restarts of its own, then ``launch_args``."""
    head = ["poprun-py", "launch", "--per-node", "--hosts", hosts_expression(name, kind, count)]
    return [*head, f"--secret-file={SECRET_FILE}", "--max-restarts=0", *launch_args]


def pod_env(name: str, kind: str, count: int) -> list[tuple[str, str]]:
    """``POPRUN_NNODES`` and ``POPRUN_COORDINATOR`` (pod 0); the rank is Kubernetes'
    ``JOB_COMPLETION_INDEX``."""
    return [("POPRUN_NNODES", str(count)), ("POPRUN_COORDINATOR", pod_names(name, kind, 1)[0])]


def resources(plan: LaunchPlan) -> dict[str, str]:
    """One pod's requests (= limits) from the plan's hosts: ``cpu``, ``memory`` (when every
    NUMA node's is declared), and the devices as ``nvidia.com/gpu`` (``amd.com/gpu``); empty
    where no topology is known. RenderError when
    the hosts differ: every pod has the same template."""
    asks = {h.name: _host_resources(h.topology) for h in plan.hosts}
    first = next(iter(asks.values()), {})
    other = next((n for n, a in asks.items() if a != first), None)
    if other is not None:
        raise RenderError(
            f"host {other} needs {_describe(asks[other])}, host {plan.hosts[0].name} "
            f"{_describe(first)}: one pod template asks the same of every node"
        )
    return first


def _host_resources(topology: Any) -> dict[str, str]:
    if topology is None:
        return {}
    asks = {"cpu": str(len(topology.cpus))} if topology.cpus else {}
    if topology.memory:
        asks["memory"] = format_memory(topology.memory)
    if topology.devices:
        device = "amd.com/gpu" if topology.device_kind == "amd" else "nvidia.com/gpu"
        asks[device] = str(len(topology.devices))
    return asks


def _describe(asks: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in asks.items()) or "no declared topology"


def pod_values(values: Mapping[str, Any], plan: LaunchPlan) -> dict[str, Any]:
    """The render's option values for the pods' ``launch``: the plan's sizes and its env (a
    spec's ``defaults:`` and ``env:`` stay here with the spec) in place of the given ones; a
    secret variable by name only, never its value."""
    env = [e.name if e.secret else f"{e.name}={e.value}" for e in plan.env]
    return {
        **values,
        "replicas": plan.num_replicas,
        "instances": plan.num_instances,
        "devices_per_replica": plan.devices_per_replica,
        "group_size": plan.group_size,
        "numa_aware": plan.numa_aware,
        "env": env,
    }


def manifest_objects(text: str) -> list[Any]:
    """The manifest's objects (``--format json`` prints them as one ``v1`` List)."""
    import yaml

    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
