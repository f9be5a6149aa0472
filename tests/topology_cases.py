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
from preflight.readers import layout

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
