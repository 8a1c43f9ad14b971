"""poprun-py: one-key multi-host launches of distributed training.

The pure core turns a cluster spec and a job into a plan (``make_plan``); renderers turn the
plan into commands; backends run them. Instances read their layout with ``poprun_py.dist``.
The names below are imported lazily, so ``import poprun_py.dist`` inside every instance stays
cheap.

Example:

    >>> from poprun_py import make_plan, JobSpec, cluster_from_hosts, parse_hosts
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h[1-2]")), JobSpec(("t.py",), 8, 4))
    >>> [i.host for i in plan.instances]
    ['h1', 'h1', 'h2', 'h2']
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing's: importing typing costs every instance ~15 ms

__version__ = "0.1.0"

_LAZY = {
    "parse_hosts": "poprun_py.core.hosts",
    "LaunchPlan": "poprun_py.core.plan",
    "make_plan": "poprun_py.core.plan",
    "ClusterSpec": "poprun_py.core.spec",
    "JobSpec": "poprun_py.core.spec",
    "cluster_from_hosts": "poprun_py.core.spec",
}
__all__ = [
    "ClusterSpec",
    "JobSpec",
    "LaunchPlan",
    "__version__",
    "cluster_from_hosts",
    "make_plan",
    "parse_hosts",
]

if TYPE_CHECKING:
    from typing import Any

    from poprun_py.core.hosts import parse_hosts
    from poprun_py.core.plan import LaunchPlan, make_plan
    from poprun_py.core.spec import ClusterSpec, JobSpec, cluster_from_hosts


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'poprun_py' has no attribute {name!r}")
