"""GPUs, RDMA NICs and network interfaces of a host, parsed from text; and what they add to a
topology. Pure: the text comes from :data:`DISCOVERY_SCRIPT` (run in preflight's login session
on remote hosts, and by ``prepare.discover`` here); nothing here reads a file.

The script prints one line per finding:

- ``gpu BUS CLASS VENDOR NUMA``: a PCI function of class 0x03xx (display) from NVIDIA (0x10de)
  or AMD (0x1002), with its ``numa_node`` (``-1``: the firmware does not say);
- ``ib NAME NUMA PORTS``: an RDMA device of ``/sys/class/infiniband`` and its port numbers;
- ``net NAME NUMA``: a network interface (``-`` when it has no PCI device);
- ``smi INDEX, BUS``: ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader``, the
  CUDA ordinals (sysfs order is not CUDA order);
- ``addr ...``: ``ip -o -4 addr show`` lines, the interfaces' addresses (only when asked for).

Example:

    >>> hw = parse_discovery(
    ...     "gpu 0000:18:00.0 0x030200 0x10de 0\\n"
    ...     "gpu 0000:9a:00.0 0x030200 0x10de 1\\n"
    ...     "ib mlx5_0 0 1\\n"
    ...     "addr 2: eth0    inet 198.19.0.11/24 brd 198.19.0.255 scope global eth0\\n")
    >>> [(g.index, g.vendor, g.numa) for g in hw.gpus], hw.rdma[0].name
    ([(0, 'nvidia', 0), (1, 'nvidia', 1)], 'mlx5_0')
    >>> hw.interface_in("198.19.0.0/16")
    ('eth0', '198.19.0.11')
    >>> from poprun_py.core.topology import uniform
    >>> topo = with_hardware(uniform(2, 4), hw)
    >>> [(n.devices, n.nics) for n in topo.numa_nodes], topo.device_kind
    ([((0,), ('mlx5_0:1',)), ((1,), ())], 'nvidia')
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

from poprun_py.core.topology import Topology, TopologyError

VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
UNKNOWN_NUMA = -1


@dataclass(frozen=True)
class Gpu:
    """One GPU: its ordinal as its framework counts it, vendor, PCI address and NUMA node."""

    index: int
    vendor: str
    bus: str
    numa: int  # -1: unknown


@dataclass(frozen=True)
class Rdma:
    """One RDMA device (``mlx5_0``) with its NUMA node and ports."""

    name: str
    numa: int
    ports: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class Interface:
    """A network interface, its NUMA node (-1 unknown or virtual) and its IPv4 addresses."""

    name: str
    numa: int = UNKNOWN_NUMA
    addresses: tuple[str, ...] = ()  # "198.18.0.11/24"


@dataclass(frozen=True)
class Hardware:
    """What discovery found on one host."""

    gpus: tuple[Gpu, ...] = ()
    rdma: tuple[Rdma, ...] = ()
    interfaces: tuple[Interface, ...] = ()
    cuda_ordinals: bool = False  # GPU indexes come from nvidia-smi

    def interface_in(self, cidr: str) -> tuple[str, str] | None:
        """``(name, address)`` of the first interface holding an address in ``cidr``."""
        net = parse_cidr(cidr)
        for iface in self.interfaces:
            for addr in iface.addresses:
                ip = ipaddress.ip_interface(addr).ip
                if ip.version == net.version and ip in net:
                    return iface.name, str(ip)
        return None

    def describe_addresses(self) -> str:
        """``eth0 198.18.0.11, data1 198.19.0.11`` (loopback left out)."""
        pairs = [
            f"{i.name} {a.split('/')[0]}"
            for i in self.interfaces
            for a in i.addresses
            if not a.startswith("127.")
        ]
        return ", ".join(pairs) or "no IPv4 address"


def parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A network such as ``198.19.0.0/16`` (host bits allowed: ``198.19.0.7/16``)."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise TopologyError(f"bad network {text!r}: not a CIDR such as 10.0.0.0/16") from None


def parse_discovery(text: str) -> Hardware:
    """Parse :data:`DISCOVERY_SCRIPT`'s lines (see the module docstring); unknown lines are
    skipped, malformed ones raise TopologyError."""
    gpus: list[tuple[str, str, int]] = []
    rdma: list[Rdma] = []
    numa_of: dict[str, int] = {}
    smi: dict[str, int] = {}
    addrs: dict[str, list[str]] = {}
    for raw in text.splitlines():
        kind, _, rest = raw.strip().partition(" ")
        if kind[:-1].isdigit() and kind[-1:] in (":", ","):  # ip -o / nvidia-smi, unprefixed
            kind, rest = ("addr" if kind[-1] == ":" else "smi"), raw.strip()
        fields = rest.split()
        try:
            if kind == "gpu" and VENDORS.get(fields[2].lower()) and fields[1].startswith("0x03"):
                gpus.append((_bus(fields[0]), VENDORS[fields[2].lower()], _numa(fields[3])))
            elif kind == "ib":
                ports = tuple(sorted(int(p) for p in fields[2:] if p.isdigit())) or (1,)
                rdma.append(Rdma(fields[0], _numa(fields[1]), ports))
            elif kind == "net":
                numa_of[fields[0]] = _numa(fields[1])
            elif kind == "smi":
                index, _, bus = rest.partition(",")
                smi[_bus(bus)] = int(index)
            elif kind == "addr" and "inet" in fields:
                name = fields[1].rstrip(":").split("@")[0]
                addrs.setdefault(name, []).append(fields[fields.index("inet") + 1])
        except (IndexError, ValueError) as exc:
            raise TopologyError(f"bad discovery line {raw.strip()!r}") from exc
    names = list(dict.fromkeys([*numa_of, *addrs]))
    return Hardware(
        gpus=_ordinals(gpus, smi),
        rdma=tuple(sorted(rdma, key=lambda r: _natural(r.name))),
        interfaces=tuple(
            Interface(n, numa_of.get(n, UNKNOWN_NUMA), tuple(addrs.get(n, ()))) for n in names
        ),
        cuda_ordinals=bool(smi) and all(b in smi for b, v, _ in gpus if v == "nvidia"),
    )


def _bus(text: str) -> str:
    """``00000000:18:00.0`` (nvidia-smi) and ``0000:18:00.0`` (sysfs) -> ``0000:18:00.0``."""
    bus = text.strip().lower()
    domain, sep, tail = bus.partition(":")
    if not sep or not tail:
        raise ValueError(bus)
    return f"{int(domain, 16):04x}:{tail}"


def _numa(text: str) -> int:
    return UNKNOWN_NUMA if text in ("-", "") else max(int(text), UNKNOWN_NUMA)


def _natural(name: str) -> tuple[str, int]:
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem) :] or -1)


def _ordinals(found: list[tuple[str, str, int]], smi: dict[str, int]) -> tuple[Gpu, ...]:
    """GPU ordinals: nvidia-smi's index for NVIDIA GPUs it lists, else the PCI order per vendor
    (CUDA with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ROCm's own order)."""
    result: list[Gpu] = []
    for vendor in ("nvidia", "amd"):
        mine = sorted((bus, numa) for bus, v, numa in found if v == vendor)
        for k, (bus, numa) in enumerate(mine):
            index = smi.get(bus, k) if vendor == "nvidia" and smi else k
            result.append(Gpu(index, vendor, bus, numa))
    return tuple(sorted(result, key=lambda g: (g.vendor != "nvidia", g.index)))


def with_hardware(topo: Topology, hw: Hardware) -> Topology:
    """``topo`` with the GPUs and RDMA NICs attached to their NUMA nodes.

    One vendor's GPUs become the devices (NVIDIA's when a host has both). Devices whose
    ``numa_node`` is -1 (firmware that does not say) are spread over the nodes in order and
    the topology says their placement is unknown (``devices_placed`` false)."""
    kind = "nvidia" if any(g.vendor == "nvidia" for g in hw.gpus) else "amd"
    gpus = [g for g in hw.gpus if g.vendor == kind]
    ids = [n.id for n in topo.numa_nodes]
    devices: dict[int, list[int]] = {i: [] for i in ids}
    unplaced = [g for g in gpus if g.numa not in devices]
    for g in gpus:
        if g.numa in devices:
            devices[g.numa].append(g.index)
    for k, g in enumerate(sorted(unplaced, key=lambda g: g.index)):
        devices[ids[k * len(ids) // len(unplaced)]].append(g.index)
    nics: dict[int, list[str]] = {i: [] for i in ids}
    for r in hw.rdma:  # a NIC of unknown node (numa_node -1) is every node's
        for node in [r.numa] if r.numa in nics else ids:
            nics[node].extend(f"{r.name}:{p}" for p in r.ports)
    nodes = tuple(
        replace(n, devices=tuple(sorted(devices[n.id])), nics=tuple(nics[n.id]))
        for n in topo.numa_nodes
    )
    return replace(
        topo,
        numa_nodes=nodes,
        device_kind=kind if gpus else None,
        devices_placed=not unplaced,
        cuda_ordinals=hw.cuda_ordinals,
    )


# $1: the sysfs root ("" = /sys; fixture trees in tests), $2: 1 to list IPv4 addresses.
# Builtins only (read, globs, case: a fork costs more than reading 300 PCI classes), but for
# nvidia-smi (only where an NVIDIA GPU is) and ip (only for --network).
DISCOVERY_SCRIPT = r"""
s=${1:-}/sys; nv=0
for d in "$s"/bus/pci/devices/*; do
  { read c < "$d/class"; } 2>/dev/null || continue
  case $c in 0x03*)
    read v < "$d/vendor"; n=-1; [ -r "$d/numa_node" ] && read n < "$d/numa_node"
    case $v in 0x10de|0x1002) echo "gpu ${d##*/} $c $v $n"; [ "$v" = 0x10de ] && nv=1;; esac;;
  esac
done
for d in "$s"/class/infiniband/*; do
  [ -d "$d" ] || continue; n=-1; [ -r "$d/device/numa_node" ] && read n < "$d/device/numa_node"
  p=; for q in "$d"/ports/*; do [ -e "$q" ] && p="$p ${q##*/}"; done; echo "ib ${d##*/} $n$p"
done
for d in "$s"/class/net/*; do
  [ -e "$d" ] || continue; n=-; [ -r "$d/device/numa_node" ] && read n < "$d/device/numa_node"
  echo "net ${d##*/} $n"
done
if [ "$nv" = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null
fi
if [ "${2:-0}" = 1 ] && command -v ip >/dev/null 2>&1; then ip -o -4 addr show; fi
"""
