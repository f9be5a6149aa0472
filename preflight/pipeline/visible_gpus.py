"""The GPUs CUDA_VISIBLE_DEVICES leaves a run, read as CUDA reads it: the part of the
node's shape (pipeline/shape.py) a scheduler's variable decides.

A Slurm step given GPUs 4-7 of a node without a device cgroup may open all 8,
but CUDA, and so the run's ranks, see 4. ``cuda_visible`` reads the variable
against the GPUs CUDA would enumerate without it; ``cuda_visible_shape`` holds
the shape's count and slots to what it names. Pure functions of the facts.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from preflight.readers.nvidia.nvml_facts import Inventory, short_pci


class Visible(NamedTuple):
    """What CUDA_VISIBLE_DEVICES leaves CUDA (``cuda_visible``)."""

    picked: list[int]  # positions in CUDA's enumeration without it, in the variable's order
    unplaced: int  # entries CUDA takes whose GPU cannot be told here: a UUID with no NVML to match, a MIG instance
    stop: str | None  # the entry CUDA stops at, and why; None where it reads every entry

    @property
    def count(self) -> int:
        return len(self.picked) + self.unplaced


def cuda_visible(value: str, uuids: list[str | None]) -> Visible:
    """The devices CUDA shows under CUDA_VISIBLE_DEVICES=``value``, of the GPUs it enumerates
    without it (``uuids``: each one's NVML UUID, "GPU-...", in CUDA's order; None where not known).
    As the CUDA Programming Guide's "CUDA Environment Variables" says CUDA reads it: a comma-separated
    list of indices or UUIDs ("GPU-" followed by enough of the UUID to name one GPU; "MIG-" a MIG
    instance), enumerated in the list's order; where an entry is invalid, only the devices before
    it are visible. So an empty value (or Slurm's "NoDevFiles") shows none. A GPU named twice is
    taken as invalid there too: CUDA cannot show one GPU as two devices."""
    picked: list[int] = []
    unplaced = 0
    known = bool(uuids) and all(u is not None for u in uuids)
    for raw in value.split(","):
        item = raw.strip()
        prefix = item[:4].lower()
        if re.fullmatch(r"[0-9]{1,9}", item):
            i = int(item)
            if i >= len(uuids):
                return Visible(picked, unplaced, f"{item!r}: there is no GPU {i} among the {len(uuids)} it would show")
        elif prefix == "gpu-" and known:
            match = [k for k, u in enumerate(uuids) if u is not None and u.lower().startswith(item.lower())]
            if len(match) != 1:
                return Visible(picked, unplaced, f"{item!r}: {'no GPU here has' if not match else f'{len(match)} GPUs here have'} that UUID")
            i = match[0]
        elif prefix in ("gpu-", "mig-") and len(item) > 4:
            unplaced += 1  # valid or not, nothing here can tell: CUDA's own count will say
            continue
        else:
            return Visible(picked, unplaced, f"{item!r}: not a GPU index or UUID" if item else "an empty entry")
        if i in picked:
            return Visible(picked, unplaced, f"{item!r}: GPU {i} named twice")
        picked.append(i)
    return Visible(picked, unplaced, None)


def cuda_visible_shape(value: str, count: int, slots: list[str], usable: list[str] | None, gpus_from: str, host_gpus: int | None,
                       inventory: Inventory | None, seen: int | None, notes: list[str]) -> tuple[int, list[str], str, int | None]:
    """(count, slots, gpus_from, host_gpus) of the GPUs CUDA_VISIBLE_DEVICES=``value`` leaves this
    run of the ``count`` it may open: the ranks and CUDA's count are held to those."""
    if inventory is not None and seen is not None and seen < count:
        # NVML misses some of the GPUs this process may open: the count judge fails on that, and
        # indices past the missing GPU would name others than the scheduler meant.
        notes.append(f"CUDA_VISIBLE_DEVICES={value} not applied: NVML sees {seen} of the {count} GPUs this process may open")
        return count, slots, gpus_from, host_gpus
    # What CUDA enumerates without the variable, in PCI bus order (the launch's CUDA_DEVICE_ORDER=PCI_BUS_ID).
    whole = bool(usable) and count == len(usable or []) and all(not s.startswith("?") for s in usable or [])
    if inventory is not None and inventory.gpus:
        gpus = sorted(inventory.gpus, key=lambda g: short_pci(g.pci_bus_id))
        if whole:
            gpus = [g for g in gpus if short_pci(g.pci_bus_id) in set(usable or [])]
        order: list[tuple[str | None, str | None]] = [(short_pci(g.pci_bus_id), g.uuid) for g in gpus]
    elif whole:
        order = [(s, None) for s in usable or []]
    else:
        order = [(None, None)] * count
    vis = cuda_visible(value, [u for _, u in order])
    if vis.count == count and vis.stop is None:
        return count, slots, gpus_from, host_gpus
    named = [order[i][0] for i in vis.picked]
    mine = [s for s in named if s] if not vis.unplaced and all(named) else []
    stop = f"; CUDA stops at {vis.stop}, so no entry after it counts" if vis.stop else ""
    notes.append(f"CUDA_VISIBLE_DEVICES={value} gives this run {vis.count} of the {count} GPUs this process may open"
                 + (f": {', '.join(mine)}" if mine else "") + stop)
    return vis.count, mine, f"CUDA_VISIBLE_DEVICES={value} ({vis.count} of the {count} GPUs from {gpus_from})", host_gpus if host_gpus is not None else count
