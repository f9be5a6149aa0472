"""The GPUs CUDA_VISIBLE_DEVICES leaves a run, read as CUDA reads it: the part of the
node's shape (pipeline/shape.py) a scheduler's variable decides.

A Slurm step given GPUs 4-7 of a node without a device cgroup may open all 8,
but CUDA, and so the run's ranks, see 4. ``cuda_visible_shape`` holds the shape's
count and slots to what the variable names (read by readers/nvidia/visible_devices.py
against the GPUs CUDA would enumerate without it). A pure function of the facts.
"""

from __future__ import annotations

from preflight.readers.nvidia.nvml_facts import Inventory, short_pci
from preflight.readers.nvidia.visible_devices import cuda_visible


def cuda_visible_shape(value: str, count: int, slots: list[str], usable: list[str] | None, gpus_from: str, host_gpus: int | None,
                       inventory: Inventory | None, seen: int | None, notes: list[str]) -> tuple[int, list[str], str, int | None]:
    """(count, slots, gpus_from, host_gpus) of the GPUs CUDA_VISIBLE_DEVICES=``value`` leaves this
    run of the ``count`` it may open: the ranks and CUDA's count are held to those."""
    if inventory is not None and seen is not None and seen < count:
        # NVML misses some of the GPUs this process may open: the count judge fails on that, and
        # indices past the missing GPU would name others than the scheduler meant.
        notes.append(f"CUDA_VISIBLE_DEVICES={value} not applied: NVML sees {seen} of the {count} GPUs this process may open")
        return count, slots, gpus_from, host_gpus
    # What CUDA enumerates without the variable, in PCI bus order (the launch's CUDA_DEVICE_ORDER=PCI_BUS_ID),
    # a GPU NVML lost in its place: left out, every index past it would name the next GPU.
    whole = bool(usable) and count == len(usable or []) and all(not s.startswith("?") for s in usable or [])
    uuid_of = {short_pci(g.pci_bus_id): g.uuid for g in inventory.gpus} if inventory is not None else {}
    order: list[tuple[str | None, str | None]]
    if whole:
        order = [(s, uuid_of.get(s)) for s in usable or []]
    elif inventory is not None and inventory.gpus and all(lost.pci_bus_id for lost in inventory.lost):
        order = sorted([*uuid_of.items(), *((short_pci(lost.pci_bus_id), None) for lost in inventory.lost if lost.pci_bus_id)],
                       key=lambda bus_uuid: bus_uuid[0])
    else:
        order = [(None, None)] * count
    if value.startswith(("GPU-", "MIG-")) and any(u for _, u in order):
        # Named by UUID, a place in the order is no index: a lost GPU, whose UUID NVML no longer gives, names nothing.
        order = [o for o in order if o[1] is not None]
    vis = cuda_visible(value, [u for _, u in order])
    if vis.count == count and vis.stop is None:
        return count, slots, gpus_from, host_gpus
    named = [order[i][0] for i in vis.picked]
    mine = [s for s in named if s] if not vis.unplaced and all(named) else []
    stop = f"; {vis.stop}" if vis.stop else ""
    notes.append(f"CUDA_VISIBLE_DEVICES={value} gives this run {vis.count} of the {count} GPUs this process may open"
                 + (f": {', '.join(mine)}" if mine else "") + stop)
    return vis.count, mine, f"CUDA_VISIBLE_DEVICES={value} ({vis.count} of the {count} GPUs from {gpus_from})", host_gpus if host_gpus is not None else count
