"""Preflight: what is checked on every host before anything starts (reachable, python3, the
program, numactl, the topology, devices, free ports, clocks), and the report the launcher
prints. Below the backends, which run it in their sessions, and above ssh and the agents.

Example:

    >>> from poprun_py.preflight.probes import Checks
    >>> Checks().topology, Checks().network
    (True, None)
"""
