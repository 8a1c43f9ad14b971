"""SSH as the remote edge: settings and ssh_config, known_hosts, connections and their pool,
remote command lines, the parallel ``exec`` fan-out (:mod:`~poprun_py.ssh.fanout`) and ``sync``
(:mod:`~poprun_py.ssh.sync`).

Example:

    >>> from poprun_py.ssh.settings import SshSettings
    >>> SshSettings.of(connect_timeout=5.0).connect_timeout
    5.0
"""
