"""Discovery's lines as hosts print them: GPUs of several vendors, nvidia-smi's ordinals, RDMA
ports, interface names and addresses, and what is skipped or refused.

Written against the mutants that survived scripts/mutation.sh (issue 26, item 2): each test pins
a line a real host prints -- interface 12 of ``ip -o``, a veth's ``eth0@if12``, a VMD PCI domain
``10000``, a BMC's VGA adapter, ``mlx5_10`` after ``mlx5_2`` -- that the other tests did not.
"""

import pytest

from poprun_py.core.hardware import Gpu, Hardware, Interface, parse_discovery
from poprun_py.core.topology import TopologyError


def gpus(text: str) -> list[tuple[int, str, str, int]]:
    return [(g.index, g.vendor, g.bus, g.numa) for g in parse_discovery(text).gpus]


def test_addresses_are_described_without_loopback() -> None:
    hw = Hardware(
        interfaces=(
            Interface("lo", addresses=("127.0.0.1/8",)),
            Interface("eth0", addresses=("10.0.0.1/24",)),
            Interface("eth1", addresses=("10.1.0.1/24", "10.2.0.1/24")),
        )
    )
    assert hw.describe_addresses() == "eth0 10.0.0.1, eth1 10.1.0.1, eth1 10.2.0.1"
    assert Hardware().describe_addresses() == "no IPv4 address"


def test_a_host_with_both_vendors_lists_nvidia_first_each_in_pci_order() -> None:
    text = (
        "gpu 0000:c1:00.0 0x038000 0x1002 1\n"
        "gpu 0000:81:00.0 0x030200 0x10de 1\n"
        "gpu 0000:41:00.0 0x038000 0x1002 0\n"
        "gpu 0000:01:00.0 0x030200 0x10de 0\n"
    )
    assert gpus(text) == [
        (0, "nvidia", "0000:01:00.0", 0),
        (1, "nvidia", "0000:81:00.0", 1),
        (0, "amd", "0000:41:00.0", 0),
        (1, "amd", "0000:c1:00.0", 1),
    ]


def test_a_display_adapter_of_another_vendor_is_not_a_gpu() -> None:
    text = "gpu 0000:02:00.0 0x030000 0x1a03 0\ngpu 0000:18:00.0 0x030200 0x10de 0\n"
    assert gpus(text) == [(0, "nvidia", "0000:18:00.0", 0)]


def test_nvidia_smi_ordinals_are_used_and_unlisted_gpus_keep_their_pci_position() -> None:
    text = (
        "gpu 0000:18:00.0 0x030200 0x10de 0\n"
        "gpu 0000:9a:00.0 0x030200 0x10de 1\n"
        "smi 1, 00000000:18:00.0\n"
    )
    hw = parse_discovery(text)
    assert [(g.index, g.bus) for g in hw.gpus] == [(1, "0000:18:00.0"), (1, "0000:9a:00.0")]
    assert hw.cuda_ordinals is False
    both = parse_discovery(text + "smi 0, 00000000:9A:00.0\n")
    assert [(g.index, g.bus) for g in both.gpus] == [(0, "0000:9a:00.0"), (1, "0000:18:00.0")]
    assert both.cuda_ordinals is True


def test_unprefixed_nvidia_smi_lines_match_gpus_in_a_vmd_pci_domain() -> None:
    text = (
        "gpu 10000:01:00.0 0x030200 0x10de 0\n"
        "gpu 10000:02:00.0 0x030200 0x10de 0\n"
        "11, 00010000:01:00.0\n"
        "10, 00010000:02:00.0\n"
    )
    assert gpus(text) == [(10, "nvidia", "10000:02:00.0", 0), (11, "nvidia", "10000:01:00.0", 0)]


def test_rdma_ports_are_listed_in_order_and_default_to_port_1() -> None:
    hw = parse_discovery("ib mlx5_1 0 2 1\nib mlx5_0 1\nib mlx5_2 -1 2\n")
    assert [(r.name, r.numa, r.ports) for r in hw.rdma] == [
        ("mlx5_0", 1, (1,)),
        ("mlx5_1", 0, (1, 2)),
        ("mlx5_2", -1, (2,)),
    ]


def test_rdma_devices_sort_by_their_number_not_as_text() -> None:
    hw = parse_discovery("ib mlx5_10 0\nib mlx5_2 0\nib roce2 0\nib roce 0\nib roce0 0\n")
    assert [r.name for r in hw.rdma] == ["mlx5_2", "mlx5_10", "roce", "roce0", "roce2"]


def test_ip_addresses_of_interface_ten_and_up_and_of_veths_are_read() -> None:
    text = (
        "net eth0 1\n"
        "2: eth0    inet 198.18.0.11/24 brd 198.18.0.255 scope global eth0\n"
        "12: data1    inet 198.19.0.11/24 scope global data1\n"
        "addr 5: eth9@if12    inet 198.20.0.11/24 scope global eth9\n"
    )
    hw = parse_discovery(text)
    assert hw.interfaces == (
        Interface("eth0", 1, ("198.18.0.11/24",)),
        Interface("data1", -1, ("198.19.0.11/24",)),
        Interface("eth9", -1, ("198.20.0.11/24",)),
    )
    assert hw.interface_in("198.19.0.0/16") == ("data1", "198.19.0.11")


@pytest.mark.parametrize(
    "line",
    ["42 something", "1x: lo inet 10.9.9.9/8", "route 1 inet 10.9.9.9/8", "fan 3 2200rpm"],
)
def test_lines_of_no_known_kind_are_skipped(line: str) -> None:
    assert parse_discovery(line + "\nnet eth0 0\n") == Hardware(interfaces=(Interface("eth0", 0),))


@pytest.mark.parametrize("line", ["gpu 0000:18:00.0", "smi 0, 0000:", "ib", "net eth0 x"])
def test_a_malformed_line_is_refused_word_for_word(line: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_discovery(f"  {line}  \n")
    assert str(caught.value) == f"bad discovery line {line!r}"


def test_gpu_fields_are_kept_as_found() -> None:
    assert parse_discovery("gpu 0000:3B:00.0 0x030200 0x10DE -1\n").gpus == (
        Gpu(0, "nvidia", "0000:3b:00.0", -1),
    )
