"""Per-node mode (issue 23): every node runs ``poprun-py launch`` itself, no SSH between nodes.

A node learns who it is (:mod:`~poprun_py.pernode.identity`: its rank, the node count and the
coordinator, from flags or the environment that Kubernetes, Slurm or mpirun set), reads the
shared secret that authenticates it (:mod:`~poprun_py.pernode.secret`), and proves it made the
same plan as every other node (:mod:`~poprun_py.pernode.digest`). Node 0 also coordinates: the
other nodes join it over TCP and are driven by the agent protocol, as SSH hosts are.
docs/per-node.md is the user's guide.

Example:

    >>> from poprun_py.pernode.identity import resolve_identity
    >>> node = resolve_identity(None, None, None, {"PET_NODE_RANK": "1", "PET_NNODES": "2",
    ...                                           "PET_MASTER_ADDR": "trainer-0"})
    >>> node.rank, node.nnodes, node.address
    (1, 2, 'trainer-0:29400')
"""
