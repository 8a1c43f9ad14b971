"""The optional second network of a test cluster: a data bridge beside the management one.

With ``create_cluster(..., data_network=True)`` every host gets a second veth pair whose
host-side end has a name of its own per host (``data1`` on the first host, ``data2`` on the
second...: names that differ from host to host, as NICs' names do on real clusters) and an
address in ``198.19.<subnet index>.0/24``, on a bridge ``pd-<tag>`` whose gateway address
``198.19.<subnet index>.1`` is the root namespace's. SSH stays on the management network
(``eth0``, 198.18.x.x); traffic meant for the data network can be told apart by its addresses,
and :func:`set_data_link` takes a host's data link down (and up) to make a broken host.

Example:

    >>> data_address(3, 0), data_interface(1), data_bridge_name("pr-1234abcd")
    ('198.19.3.11', 'data2', 'pd-1234abcd')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Run = Callable[[Sequence[str]], str]


def data_subnet(subnet_index: int) -> str:
    """The data network of the cluster with this subnet index."""
    return f"198.19.{subnet_index}.0/24"


def data_gateway(subnet_index: int) -> str:
    """The root namespace's address on the data bridge."""
    return f"198.19.{subnet_index}.1"


def data_address(subnet_index: int, index: int) -> str:
    """Host ``index``'s (0-based) data address."""
    return f"198.19.{subnet_index}.{11 + index}"


def data_interface(index: int) -> str:
    """Host ``index``'s (0-based) data interface name: differs from host to host."""
    return f"data{index + 1}"


def data_bridge_name(bridge: str) -> str:
    """``pr-<tag>`` -> ``pd-<tag>`` (its veths are ``pd-<tag>-N``)."""
    return "pd-" + bridge.removeprefix("pr-")


def create_data_bridge(run: Run, bridge: str, subnet_index: int) -> None:
    """The data bridge with the root namespace's gateway address on it."""
    name = data_bridge_name(bridge)
    run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "addr", "add", f"{data_gateway(subnet_index)}/24", "dev", name])
    run(["ip", "link", "set", name, "up"])


def attach_data(run: Run, bridge: str, subnet_index: int, index: int, netns: str) -> None:
    """Host ``index``'s data interface in ``netns``, on the data bridge."""
    veth, inside = f"{data_bridge_name(bridge)}-{index + 1}", data_interface(index)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", inside, "netns", netns])
    run(["ip", "link", "set", veth, "master", data_bridge_name(bridge), "up"])
    address = f"{data_address(subnet_index, index)}/24"
    run(["ip", "-n", netns, "addr", "add", address, "dev", inside])
    run(["ip", "-n", netns, "link", "set", inside, "up"])


def set_data_link(run: Run, netns: str, index: int, up: bool) -> None:
    """Take host ``index``'s data interface down (``up=False``) or up again."""
    run(["ip", "-n", netns, "link", "set", data_interface(index), "up" if up else "down"])
