"""poprun-py: one-key multi-host launches of distributed training.

The pure core turns a cluster spec and a job into a plan (``make_plan``); renderers turn the
plan into commands; backends run them. Instances read their layout with ``poprun_py.dist``.

Example:

    >>> from poprun_py import make_plan, JobSpec, cluster_from_hosts, parse_hosts
    >>> plan = make_plan(cluster_from_hosts(parse_hosts("h[1-2]")), JobSpec(("t.py",), 8, 4))
    >>> [i.host for i in plan.instances]
    ['h1', 'h1', 'h2', 'h2']
"""

from poprun_py.hosts import parse_hosts
from poprun_py.plan import LaunchPlan, make_plan
from poprun_py.spec import ClusterSpec, JobSpec, cluster_from_hosts

__version__ = "0.1.0"
__all__ = ["ClusterSpec", "JobSpec", "LaunchPlan", "__version__", "cluster_from_hosts",
           "make_plan", "parse_hosts"]
