"""poprun-py's end of the per-host agents (:mod:`poprun_py.hostside.agent`): starting them over
a host's connection (:mod:`~poprun_py.agent.client`) and relaying the launchers' daemons and
rank output through them (:mod:`~poprun_py.agent.relay`). The agent protocol runs over the
transport seam, :mod:`~poprun_py.agent.stream` (a byte stream: a Paramiko channel, an OpenSSH
client process, or a per-node mode's TCP socket).

Example:

    >>> from poprun_py.agent import client
    >>> client.HEARTBEAT
    0.5
"""
