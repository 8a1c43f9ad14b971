"""What runs on the hosts: programs and modules that need only Python 3.7's standard library,
shipped to a host that has nothing of poprun-py (the client imports them too).

- :mod:`~poprun_py.hostside.agent`: the per-host agent, in :mod:`~poprun_py.hostside.protocol`;
- :mod:`~poprun_py.hostside.hostops`: a detached job's operations on its hosts (jobs/logs/stop);
- :mod:`~poprun_py.hostside.check_instance`: ``check``'s program, run as every instance;
- :mod:`~poprun_py.hostside.rsh_shim`: mpirun's and mpiexec's rsh agent;
- :mod:`~poprun_py.hostside.gateway`: a tree's gateway (``--fanout``), its subtree's ``ssh``
  clients relayed;
- their parts: :mod:`~poprun_py.hostside.binding` (CPU and memory binding syscalls),
  :mod:`~poprun_py.hostside.identity` (a process by pid and start time),
  :mod:`~poprun_py.hostside.private` (files only their owner reads),
  :mod:`~poprun_py.hostside.stackdump` (stacks of Python ranks),
  :mod:`~poprun_py.hostside.supervision` (the one supervision core: spawn, bind, lines, grace,
  leftovers; the local backend uses it too).

:mod:`~poprun_py.hostside.bundle` (client side) ships them: one bundle per program, its
``poprun_py.hostside`` imports inlined, compiled once, run by one bootstrap (bytecode where the
host's Python has the same magic number, else the source).

Example:

    >>> from poprun_py.hostside import protocol
    >>> protocol.STARTED
    b'p'
"""
