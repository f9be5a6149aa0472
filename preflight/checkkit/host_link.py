"""The PCIe link between host memory and the GPUs, and the h2d/d2h floors fitted to it.

A profile's h2d and d2h floors are measured over an x16 link of its SKU's own
generation (``GpuExpect.pcie_gen``: Gen5 for Hopper, Gen4 for A100). A card in
a host whose slots are of an older generation, or wired narrower, moves host
copies at that slot's rate by the host's design: an H100 PCIe in a Gen4 server
reads about 25 GB/s, healthy, under a 48 GB/s floor made on Gen5. NVML's
maximum link (nvmlDeviceGetMaxPcieLinkGeneration and ...Width: "the maximum
PCIe link generation possible with this device and system") says what the
host can give, and those floors are scaled by the ratio of the two links' line
rates. A link that trained below that maximum is a fault the cuda and topology
checks name, and its copies are held to the unscaled floor. A site's own floor
(config, calibrate) was measured on the site's hosts and is never scaled.

Only where the host's design is plain: every GPU's maximum link the same (one
floor judges them all: one GPU in a narrower slot must not lower the bar of
the seven beside it), at least Gen3 x8 (less is no training host's slot), and
not in a virtual machine (whose links are the hypervisor's to report).
"""

from __future__ import annotations

from preflight.checkkit.figures import scale_floors
from preflight.pipeline.expectations import GpuExpect
from preflight.pipeline.profiles import ResolvedFloor
from preflight.readers.nvidia.nvml_facts import Inventory

# GB/s a lane carries after line encoding: 8b/10b up to Gen2, 128b/130b for Gen3-5,
# FLIT mode (242/256) for Gen6 (PCI-SIG's base specifications).
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
HOST_COPIES = ("h2d_bandwidth", "d2h_bandwidth")


def rate(gen: int, width: int) -> float:
    """A link's line rate in GB/s, one direction."""
    return LANE_GBPS.get(gen, LANE_GBPS[max(LANE_GBPS)]) * width


LEAST = (3, 8)  # the oldest, narrowest host link scaled to; below it the floor stands


def host_link(inventory: Inventory | None) -> tuple[int, int] | None:
    """The (generation, width) NVML says every GPU and its slot can do; None where a GPU's is
    unknown, or where they differ."""
    if inventory is None or not inventory.gpus:
        return None
    links = {(g.pcie.gen_max, g.pcie.width_max) for g in inventory.gpus if g.pcie and g.pcie.gen_max and g.pcie.width_max}
    if len(links) != 1 or sum(1 for g in inventory.gpus if g.pcie and g.pcie.gen_max and g.pcie.width_max) < len(inventory.gpus):
        return None
    return links.pop()  # type: ignore[return-value]


def fit(floors: dict[str, ResolvedFloor], expect: GpuExpect | None, inventory: Inventory | None,
        virtual: bool = False) -> tuple[dict[str, ResolvedFloor], str | None]:
    """``floors`` with the profile's h2d and d2h floors scaled to this host's link, and a line
    saying so (None: nothing scaled: the host gives the SKU's whole link, its link is unknown,
    uneven or below LEAST, or ``virtual``, a virtual machine's)."""
    link = host_link(inventory)
    if expect is None or expect.pcie_gen is None or link is None or virtual or link[0] < LEAST[0] or link[1] < LEAST[1]:
        return floors, None
    factor = rate(*link) / rate(expect.pcie_gen, 16)
    gen, width = link
    named = [n.split("_")[0] for n in HOST_COPIES if n in floors and floors[n].from_profile]
    said = (f"this host's PCIe link is Gen{gen} x{width} (NVML's maximum for GPU and slot), the SKU's Gen{expect.pcie_gen} x16: "
            f"{' and '.join(named)} floors x{factor:.2f}")
    scaled = scale_floors(floors, HOST_COPIES, factor, said)
    return (floors, None) if scaled is None else (scaled, said)
