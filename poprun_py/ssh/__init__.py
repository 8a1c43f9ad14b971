"""SSH as the remote edge: settings and ssh_config, known_hosts, connections and their pool
(typed per-host results: :mod:`~poprun_py.ssh.hostresult`), remote command lines, the parallel
``exec`` fan-out (:mod:`~poprun_py.ssh.fanout`) and ``sync`` (:mod:`~poprun_py.ssh.sync`).
Two transports: Paramiko, and OpenSSH's own client (:mod:`~poprun_py.ssh.openssh`,
``--ssh-client``); the agents' byte streams over either are in :mod:`~poprun_py.ssh.streams`.
A tree (``--fanout K``, :mod:`~poprun_py.ssh.tree`) reaches most hosts through K gateways,
whose OpenSSH clients it runs there.

Example:

    >>> from poprun_py.ssh.settings import SshSettings
    >>> SshSettings.of(connect_timeout=5.0).connect_timeout
    5.0
"""
