"""Which RDMA ports carry the job's traffic (the rdma check's compute ports):
those NCCL_IB_HCA names, as NCCL reads it (`hca_names`), where it is set;
else those of the profile's link layer, beside a GPU where sysfs tells, that
are no dual-port card's unused port (`spare`); `chosen_by` says which rule
chose them. The judges in checkkit/rdma_judges.py hold only these ports to
the SKU's state and rate.
"""

from __future__ import annotations

import re

from collections.abc import Callable

from preflight.pipeline.expectations import RdmaExpect
from preflight.readers.machine.ibports import Port, RdmaFacts


def _items(spec: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL_IB_HCA read into (exclude, exact, [(device, port or None)]), as ``hca_names`` says."""
    exclude = spec.startswith("^")
    text = spec[1:] if exclude else spec
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items = []
    for item in text.split(","):
        dev, colon, port = item.partition(":")
        if dev:
            items.append((dev, _atoi(port) if colon else None))
    return exclude, exact, items


def hca_names(spec: str) -> Callable[[str, int], bool]:
    """NCCL_IB_HCA as NCCL reads it: a comma list of dev[:port], each a prefix of the
    device name unless the list starts with "="; a leading "^" excludes those listed
    (NCCL env docs, NCCL_IB_HCA). As its parseStringList and matchIfList take them: nothing
    stripped (" mlx5_1" names no device), the port read as atoi reads it, an item with no
    name skipped, and a list of none matching every device."""
    exclude, exact, items = _items(spec)

    def listed(dev: str, port: int) -> bool:
        if not items:
            return True
        return any((dev == d if exact else dev.startswith(d)) and p in (None, port) for d, p in items)
    return lambda dev, port: listed(dev, port) != exclude


def hca_named(spec: str) -> Callable[[str, int], bool]:
    """Whether NCCL_IB_HCA names the port itself: its whole device name in a list that is no
    exclusion (a prefix such as "mlx5", or "^mlx5_4", names every port it happens to catch)."""
    exclude, _, items = _items(spec)
    return lambda dev, port: not exclude and any(dev == d and p in (None, port) for d, p in items)


def _atoi(text: str) -> int:
    """C's atoi: leading space, a sign, the digits up to the first other character; 0 where none."""
    m = re.match(r"\s*([+-]?[0-9]+)", text)
    return int(m.group(1)) if m else 0


UNCABLED = ("Polling", "Disabled")


def _card(p: Port) -> str:
    """The adapter a port is on: its PCI address without the function (a dual-port card
    shows as two functions, or as one device with two ports)."""
    return p.pci.rsplit(".", 1)[0] if p.pci else p.device


def spare(port: Port, facts: RdmaFacts) -> bool:
    """An uncabled or disabled port on a card whose other port runs, and that has not gone down
    since its counters were last cleared (link_downed 0, where read; a driver reload or
    `perfquery -x` clears them): the dual-port card's unused port, which no job uses unless
    NCCL_IB_HCA names it. One that went down since is a cable pulled from a card whose two ports
    both carried rails (rdma_judges says how to clear a port left unused on purpose)."""
    never_up = port.counters.get("link_downed", 0) == 0
    return never_up and port.phys_state in UNCABLED and any(o is not port and _card(o) == _card(port) and o.state_now == "ACTIVE" for o in facts.ports)


def compute(port: Port, expect: RdmaExpect, facts: RdmaFacts | None = None) -> bool:
    """Whether the port carries the job's traffic: where NCCL_IB_HCA is set, one it matches and
    either names itself or that is no card's spare port and, where sysfs tells, beside a GPU;
    else of the profile's link layer, not a card's spare port and, where sysfs tells, beside a
    GPU (a storage port sits elsewhere). A prefix ("mlx5") also catches a storage card's ports
    and a dual-port card's unused one: NCCL skips a port that is not ACTIVE before it reads the
    list (NVIDIA/nccl src/transport/net_ib/init.cc), and pairs each GPU with the NICs nearest
    it, so neither is held to the rails. Where the tree cannot tell (``held``), every port is."""
    if facts is not None and facts.ib_hca is not None:
        spec = facts.ib_hca[0]
        if not hca_names(spec)(port.device, port.port):
            return False
        if hca_named(spec)(port.device, port.port):
            return True
        # Only matched (a prefix, an exclusion): held as a rail where it could be one.
        return not spare(port, facts) and port.near_gpu is not False
    if expect.link_layer != "any" and port.link_layer != expect.link_layer:
        return False
    if facts is not None and spare(port, facts):
        return False
    return port.near_gpu is not False


def held(port: Port, facts: RdmaFacts) -> bool:
    """Whether a compute port's faults FAIL. Where the PCIe tree cannot tell a rail from a storage
    port (``facts.roles_unknown``), every port of the link layer is a compute port, so that a rail
    down is seen; but one NCCL_IB_HCA does not name by its whole name may be storage, and its
    faults WARN: a gate never fails a node on a port it cannot say the job uses."""
    if facts.roles_unknown is None:
        return True
    return facts.ib_hca is not None and hca_named(facts.ib_hca[0])(port.device, port.port)


def chosen_by(facts: RdmaFacts) -> str:
    if facts.ib_hca is not None:
        unsure = (f"; {facts.roles_unknown}, so the faults of a port it does not name by its whole name WARN"
                  if facts.roles_unknown else "")
        return f"NCCL_IB_HCA={facts.ib_hca[0]} ({facts.ib_hca[1]}){unsure}"
    if any(p.near_gpu is not None for p in facts.ports):
        return "the profile's link_layer and a PCIe switch shared with a GPU"
    if facts.roles_unknown:
        return (f"the profile's link_layer ({facts.roles_unknown}, so the PCIe tree cannot tell a rail from a storage port: "
                "their faults WARN; NCCL_IB_HCA naming the rails makes them FAIL)")
    return "the profile's link_layer (sysfs does not show which NICs sit beside the GPUs)"
