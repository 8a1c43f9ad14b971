"""The pure core: specs, hosts, topologies, the planner, shards, the instance environment and the
plan's views. Data in, data out: nothing here touches files, processes, sockets or the terminal
(a test enforces it), so every rule is tested with plain values and golden files.

Flow: :mod:`~poprun_py.core.spec` (what the cluster is) and :mod:`~poprun_py.core.hosts`
(host expressions) → :mod:`~poprun_py.core.plan` (hosts → instances → replicas, binding,
:mod:`~poprun_py.core.shard` input shards) → :mod:`~poprun_py.core.env` (each instance's
variables) and :mod:`~poprun_py.core.views` (tables, plan JSON). Beside the flow, the data that
the other layers share: the option catalog (:mod:`~poprun_py.core.options`), the one list of
backends and their capabilities (:mod:`~poprun_py.core.backends`), what a run gives back
(:mod:`~poprun_py.core.result`) and the one look of tables and messages
(:mod:`~poprun_py.core.look`).

Example:

    >>> from poprun_py.core.hosts import parse_hosts
    >>> [h.name for h in parse_hosts("node[1-3]")]
    ['node1', 'node2', 'node3']
"""
