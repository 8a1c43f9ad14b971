"""Programs that run on the hosts with the Python standard library alone -- the per-host agent
(:mod:`~poprun_py.agent.host`) and Open MPI's remote-shell shim
(:mod:`~poprun_py.agent.rsh_shim`) -- and poprun-py's end of them (:mod:`~poprun_py.agent.relay`).

Example:

    >>> from poprun_py.agent import host
    >>> host.__name__
    'poprun_py.agent.host'
"""
