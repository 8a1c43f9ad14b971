"""The digest of a plan that every node of a per-node job sends when it joins: nodes that made
different plans (other hosts, sizes, inputs, environment, program, or another poprun-py) are
refused before anything starts.

It is the SHA-256 of the plan's canonical JSON: the plan JSON of ``plan --format json``
(:func:`poprun_py.core.views.plan_dict`) with what that leaves out and the job still depends
on (every ``--env`` and spec ``env:`` value, the working directory, ``--eval-pad``) and
poprun-py's version, keys sorted, no spaces. The document holds secret ``--env`` values, so
only the digest leaves the node.

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> from poprun_py.core.plan import make_plan
    >>> from poprun_py.core.spec import JobSpec, cluster_from_hosts
    >>> cluster = cluster_from_hosts(parse_hosts("n[0-1]"))
    >>> one, same = (make_plan(cluster, JobSpec(("t.py",), 4, 2)) for _ in range(2))
    >>> plan_digest(one) == plan_digest(same), len(plan_digest(one))
    (True, 64)
    >>> plan_digest(one) == plan_digest(make_plan(cluster, JobSpec(("t.py",), 2, 2)))
    False
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from poprun_py import __version__
from poprun_py.core.plan import LaunchPlan
from poprun_py.core.views import plan_dict


def digest_document(plan: LaunchPlan) -> dict[str, Any]:
    """What the digest covers: the plan JSON, the environment, working directory and
    padding of the job, and poprun-py's version."""
    return {
        "plan": plan_dict(plan),
        "env": [[v.name, v.value] for v in plan.env],
        "workdir": plan.workdir,
        "eval_pad": plan.eval_pad,
        "poprun_py": __version__,
    }


def canonical_json(document: Any) -> bytes:
    """``document`` as JSON with sorted keys and no spaces, UTF-8: equal documents, equal
    bytes."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def plan_digest(plan: LaunchPlan) -> str:
    """The SHA-256 of the plan's canonical JSON, in hex (64 characters)."""
    return hashlib.sha256(canonical_json(digest_document(plan))).hexdigest()
