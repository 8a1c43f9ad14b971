"""What the MPI launchers (Open MPI's ``mpirun``, MPICH's ``mpiexec``) add to a rendered job:
how the daemons start on remote hosts, and which network they use.

Example:

    >>> import ipaddress
    >>> covering([ipaddress.IPv4Address("198.18.0.11"), ipaddress.IPv4Address("198.18.0.12")])
    IPv4Network('198.18.0.8/29')
"""

from __future__ import annotations

import ipaddress
import os
from typing import TYPE_CHECKING

from poprun_py.errors import UsageError
from poprun_py.render.job import RenderArgs

if TYPE_CHECKING:
    from poprun_py.core.plan import LaunchPlan
    from poprun_py.prepare.job import Prepared


def mpirun_render_args(prep: Prepared) -> RenderArgs:
    """Open MPI's render arguments: the user's options plus the daemons' start, the interface
    selection, and whether it runs as root.

    Interfaces, unless the user chose them (an ``*_if_include``/``*_if_exclude`` in
    ``--mpi-args``): the ranks' TCP traffic (``btl_tcp_if_include``) on ``--network`` whenever
    it is given -- a CIDR needs nothing resolved --, else on the hosts' covering network
    (:func:`mpi_subnet`); the daemons' (``oob_tcp_if_include``) on ``--network`` when this
    machine, where mpirun's own daemon runs, has an address in it, else on the covering
    network. Neither when nothing narrow enough is known: Open MPI then chooses (it leaves
    loopback out by itself; an include list would override that)."""
    plan = prep.plan
    if user_chose_interfaces(prep.mpi_args):
        return RenderArgs(mpirun_args_for(prep), None, as_root(plan))
    subnet = mpi_subnet(plan, prep.mpi_args)
    if plan.network and here_on(plan.network):
        subnet = plan.network
    return RenderArgs(mpirun_args_for(prep), subnet, as_root(plan), mpi_network=plan.network)


def user_chose_interfaces(mpi_args: tuple[str, ...]) -> bool:
    """True when ``--mpi-args`` selects Open MPI's interfaces itself.

    >>> user_chose_interfaces(("--mca", "btl_tcp_if_exclude", "docker0"))
    True
    """
    return any("if_include" in a or "if_exclude" in a for a in mpi_args)


def here_on(network: str) -> bool:
    """True when this machine has an address in ``network``."""
    from poprun_py.prepare.discover import discover_hardware

    return discover_hardware(addresses=True).interface_in(network) is not None


def mpirun_args_for(prep: Prepared) -> tuple[str, ...]:
    """The user's mpirun options, plus how Open MPI starts its daemons on remote hosts: through
    poprun-py's agents (:func:`poprun_py.hostside.rsh_shim.mpirun_args`) unless the user chose
    otherwise; else with its own ssh, given ``plm_rsh_args -F <ssh_config>`` when the cluster
    names an ssh_config, so that it uses the same user, key and known_hosts."""
    if not prep.plan.cluster.all_local:
        from poprun_py.hostside.rsh_shim import mpirun_args

        relay = mpirun_args(prep.mpi_args, hosts=len(prep.plan.cluster.hosts))
        if relay:
            return (*prep.mpi_args, *relay)
    config = prep.plan.cluster.ssh_config
    if not config or "plm_rsh_args" in " ".join(prep.mpi_args):
        return prep.mpi_args
    if any(c.isspace() for c in config):
        raise UsageError(f"ssh_config path {config!r} has whitespace: Open MPI splits plm_rsh_args")
    return (*prep.mpi_args, "--mca", "plm_rsh_args", f"-F {config}")


def as_root(plan: LaunchPlan) -> bool:
    """True when the MPI launcher runs as root anywhere (Open MPI then needs a flag)."""
    return os.geteuid() == 0 or any(h.spec.user == "root" for h in plan.hosts)


WIDEST_SUBNET = 16
"""The widest covering network poprun-py selects for Open MPI by itself (a /16). Hosts whose
addresses only a wider network covers (10.1.0.5 and 10.200.0.5; hosts in different /8s, which
only 0.0.0.0/0 covers) are on different networks joined by routers: an include list that wide
also takes in interfaces that are not the cluster's (docker's 172.17.0.0/16, a VPN's) and, at
0.0.0.0/0, loopback, which Open MPI otherwise leaves out. A /16 is as wide as one site's
network usually is (an AWS VPC is at most a /16), and holds the test hosts' /24s."""


def mpi_subnet(plan: LaunchPlan, mpi_args: tuple[str, ...]) -> str | None:
    """Open MPI's interface selection (avoids start-up hangs on the wrong NIC): the smallest IPv4
    network holding every host address and -- when that is within a /16 -- this machine's own
    address towards them: mpirun's daemon runs here, and Open MPI ignores (with a warning) a
    selection that matches none of the machine's interfaces. None when the user chose already,
    the hosts are not all IPv4 addresses, or only a network wider than
    :data:`WIDEST_SUBNET` holds them (Open MPI then chooses)."""
    if user_chose_interfaces(mpi_args):
        return None
    if plan.cluster.all_local or len(plan.hosts) < 2:
        return None
    try:
        addrs = [ipaddress.IPv4Address(h.spec.target) for h in plan.hosts]
    except ipaddress.AddressValueError:
        return None
    net = covering(addrs)
    if net.prefixlen < WIDEST_SUBNET:
        return None
    here = source_address(str(addrs[0]))
    if here is not None and here not in net:
        wider = covering([*addrs, here])
        net = wider if wider.prefixlen >= WIDEST_SUBNET else net
    return str(net)


def covering(addrs: list[ipaddress.IPv4Address]) -> ipaddress.IPv4Network:
    """The smallest IPv4 network holding every address."""
    net = ipaddress.IPv4Network(f"{addrs[0]}/32")
    while not all(a in net for a in addrs):
        net = net.supernet()
    return net


def source_address(target: str) -> ipaddress.IPv4Address | None:
    """This machine's address on the route to ``target`` (a UDP connect sends nothing)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return ipaddress.IPv4Address(probe.getsockname()[0])
    except (OSError, ValueError):
        return None
