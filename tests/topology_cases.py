"""Recorded layouts shared by the topology tests (readers/test_layout,
checkkit/test_placement, checks/test_topology): the HGX H100 sysfs tree, real
`nvidia-smi topo -m` captures, and the helpers that edit and read them."""

import shutil
import sys
import time
from pathlib import Path

import fakes
import pytest
from recorded_node import header_as_580 as driver_580  # noqa: F401 (the topology tests' name for it)

from preflight.base.host import Host
from preflight.readers.machine import layout

FIXTURES = Path(__file__).parent / "fixtures"
TREE = FIXTURES / "sysfs" / "hgx-h100"
TOPO = FIXTURES / "topo"
SPLIT = TOPO / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"  # DGX H100 layout: 4+4 over two sockets
ONE_NODE = TOPO / "02_h100-sxm-8x_nv18_12nic_single-numa-0-191_gpu-numa-id.txt"
HEALTHY = FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"


@pytest.fixture
def root(tmp_path) -> Path:
    """A copy of the recorded tree that a test may edit."""
    dest = tmp_path / "root"
    shutil.copytree(TREE, dest, symlinks=True)
    return dest


def host(root: Path, capture: Path | str = SPLIT, tmp: Path | None = None, **env: str) -> Host:
    if isinstance(capture, str):  # an edited matrix
        path = (tmp or root.parent) / "edited-topo.txt"
        path.write_text(capture)
        capture = path
    bin_dir = fakes.nvidia_smi((tmp or root.parent) / "bin", capture)
    return Host(root, environ={"PATH": str(bin_dir), **env})


def gathered(h: Host) -> layout.TopologyFacts:
    """The layout of ``h``, NVML's word from the healthy 8-GPU facts, torchrun this interpreter's."""
    return layout.gather(h, HEALTHY, sys.executable, time.monotonic() + 30)


def edit(root: Path, rel: str, text: str) -> None:
    (root / rel).write_text(text + "\n")


def matrix(n: int, links: dict[str, str], numa: list, cpus: list[str] | None = None) -> str:
    """A small `nvidia-smi topo -m` matrix in the driver's current layout;
    ``numa`` holds each GPU's NUMA Affinity (a node, "0-1", or None for N/A)."""
    rows = ["\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in range(n):
        cells = [" X " if a == b else links.get(f"{min(a, b)}-{max(a, b)}", "SYS") for b in range(n)]
        node = numa[a] if numa[a] is not None else "N/A"
        cpu = cpus[a] if cpus else f"{int(str(node)[0]) * 16 if node != 'N/A' else 0}-{int(str(node)[0]) * 16 + 15 if node != 'N/A' else 15}"
        rows.append(f"GPU{a}\t" + "\t".join(cells) + f"\t{cpu}\t{node}\t\tN/A")
    return "\n".join(rows) + "\n\nLegend:\n\n  X    = Self\n"


H200_TOPO = FIXTURES / "node" / "h200-1x-vm" / "nvidia-smi-topo-m.txt"  # driver 580, as a pipe received it
# Every capture of a matrix: each must read, with its header as driver 580 prints it, exactly as it reads without.
ALL_TOPO = sorted([*TOPO.glob("*.txt"), *(TOPO / "handmade").glob("*.txt"), *(TOPO / "malformed").glob("*.txt")])


# The DGX H100 PCI tree behind tests/fixtures/topo/03, one root bus per tuple: a GPU
# and its NIC share a PCIe switch (PIX), the second pair one switch further down
# (PXB to the first), the storage NICs' two functions sit alone. Bridge addresses are
# made up (the recorded tree is flat); the distances are the capture's.
PCI_GROUPS = [
    ("1b:00.0", "18:00.0", "43:00.0", "40:00.0"), ("52:00.0", "4f:00.0", "61:00.0", "5e:00.0"), ("29:00.0", "29:00.1"),
    ("9d:00.0", "9a:00.0", "c3:00.0", "c0:00.0"), ("d1:00.0", "ce:00.0", "df:00.0", "dc:00.0"), ("aa:00.0", "aa:00.1"),
]


def pci_tree(root: Path, groups: list[tuple[str, ...]] = PCI_GROUPS) -> Path:
    """``root``'s flat /sys/bus/pci/devices moved under /sys/devices/pciDDDD:BB/<bridges>/,
    each name left as a link there, as the kernel shows a real machine."""
    devices = root / "sys/bus/pci/devices"
    for k, group in enumerate(groups):
        bus = 0xe0 + k * 3  # no device of the recorded node sits on these buses
        port, up = f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"
        down = [f"0000:{bus + 2:02x}:{d:02x}.0" for d in range(5)]
        chains = ([[port, up, down[0]], [port, up, down[1]], [port, up, down[2], f"0000:{bus + 2:02x}:1f.0", down[3]],
                   [port, up, down[2], f"0000:{bus + 2:02x}:1f.0", down[4]]] if len(group) == 4 else [[port]] * len(group))
        for dev, chain in zip(group, chains):
            name = f"0000:{dev}"
            where = root / "sys/devices" / f"pci0000:{bus:02x}" / Path(*chain) / name
            where.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(devices / name), str(where))
            (devices / name).symlink_to(Path("../../..") / where.relative_to(root / "sys"))
    return root


def unreadable_smi(directory: Path, text: str = "GPU0\tGPU1\n\x00\x01garbage\n") -> Path:
    """An nvidia-smi whose `topo -m` prints what no reader can read."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "unreadable-topo.txt"
    path.write_text(text)
    return fakes.nvidia_smi(directory / "bin", path)


def h200_vm(tmp: Path) -> Path:
    """The real H200 node's sysfs (tests/fixtures/node/h200-1x-vm): one GPU at 0000:00:06.0
    whose numa_node the VM leaves at -1 (the report's `numa_node: null`), local_cpulist
    0-15, one NUMA node of 16 CPUs (numactl -H), no RDMA device, no bridge in sight."""
    root = tmp / "h200"
    dev = root / "sys/bus/pci/devices/0000:00:06.0"
    dev.mkdir(parents=True)
    for name, value in [("vendor", "0x10de"), ("class", "0x030200"), ("numa_node", "-1"), ("local_cpulist", "0-15"),
                        ("current_link_speed", "32.0 GT/s PCIe"), ("current_link_width", "16"),
                        ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "16")]:
        (dev / name).write_text(value + "\n")
    for rel, text in [("sys/devices/system/node/node0/cpulist", "0-15"), ("sys/devices/system/cpu/online", "0-15"),
                      ("proc/self/status", "Name:\tpreflight\nCpus_allowed_list:\t0-15"), ("proc/self/cgroup", "0::/"),
                      ("proc/driver/nvidia/gpus/0000:00:06.0/information", "Model: \t\t NVIDIA H200\nBus Location: \t 0000:00:06.0\nDevice Minor: \t 0"),
                      ("dev/nvidia0", ""), ("dev/nvidiactl", "")]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n" if text else "")
    return root
