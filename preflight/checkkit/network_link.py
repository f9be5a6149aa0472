"""The network between nodes, and the inter-node bus-bandwidth floors fitted to it.

A profile's inter-node all_reduce, all_gather and reduce_scatter floors are made
from its reference design's NICs (0.9 x 8 NICs x 46 GB/s, 400 Gb/s NDR ports):
busbw across nodes is what the NICs carry. The rdma check calls a fabric cabled
slower (NDR200, HDR100) the site's design, not a fault, so these floors are
scaled by the rate the compute ports run at, where the rdma check found every
one of them below the reference design's. A site's own floor (config,
calibrate) was measured on the site's fabric and is never scaled; a port slower
than its peers is the rdma check's FAIL.
"""

from __future__ import annotations

from preflight.checkkit.bandwidth_figures import INTERNODE, WORDS
from preflight.checkkit.figures import scale_floors
from preflight.pipeline.check import Result
from preflight.pipeline.profiles import ResolvedFloor

BUS_FLOORS = tuple(INTERNODE.values())  # the inter-node bus-bandwidth floors: what the NICs carry


def fit(floors: dict[str, ResolvedFloor], rdma: Result | None, reference_gbps: float | None) -> tuple[dict[str, ResolvedFloor], str | None]:
    """``floors`` with the profile's inter-node bus-bandwidth floors scaled to the rate this node's
    compute ports run at, where the rdma check found them all below the reference design's
    (``details.rate.below_reference``), and a line saying so; else as they are, and None. Unscaled,
    a healthy HGX H100 on 8 NDR200 ports (about 8 x 24 GB/s = 192 GB/s, as DGX A100's 8 HDR
    200 Gb/s ports measure: NVIDIA/nccl#812) FAILs the 331.2 GB/s floor."""
    basis = (rdma.details.get("rate") or {}) if rdma is not None else {}
    if not reference_gbps or not isinstance(basis, dict) or not basis.get("below_reference"):
        return floors, None
    # The compute ports' rates (the rdma check gives a floor to those it holds: its measurements).
    rates = [m.value for m in rdma.measurements if m.name == "rdma_port_rate" and m.floor is not None and m.value > 0]  # type: ignore[union-attr]
    factor = max(rates) / reference_gbps if rates else 1.0
    named = [WORDS[n] for n in BUS_FLOORS if n in floors and floors[n].from_profile]
    said = (f"this node's compute ports run at {max(rates, default=0):g} Gb/s, the reference design's at {reference_gbps:g} (the rdma check: "
            f"the site's fabric): {', '.join(named)} floor{'s' if len(named) > 1 else ''} x{factor:.2f}")
    scaled = scale_floors(floors, BUS_FLOORS, factor, said)
    return (floors, None) if scaled is None else (scaled, said)
