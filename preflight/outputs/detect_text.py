"""What `preflight detect` prints: the GPUs NVML sees, the node's shape, and the
profile `auto` picks and why; with --json one document, the same keys whether
it succeeded or not."""

from __future__ import annotations

import json

from preflight.pipeline.profile_detect import DetectionFailed
from preflight.pipeline.shape import NodeShape
from preflight.readers.nvidia import nvml_facts


def to_json(inventory: nvml_facts.Inventory, name: str | None, why: str, node: NodeShape, no_pick: DetectionFailed | None) -> str:
    error = {"error": why, "cause": no_pick.cause, "fix": no_pick.remedy} if no_pick else {"error": None, "cause": None, "fix": None}
    return json.dumps({**inventory.model_dump(mode="json"), "profile": name, "why": why, "shape": node.model_dump(mode="json"), **error}, indent=2) + "\n"


def unread_json(source: str, error: str, cause: str | None = None, fix: str | None = None) -> str:
    """Nothing detected: the same keys as on success, empty, and why they are empty."""
    return json.dumps({"driver_version": None, "cuda_driver_version": None, "gpus": [], "lost": [],
                       "source": source, "profile": None, "why": error,
                       "shape": None, "error": error, "cause": cause, "fix": fix}, indent=2) + "\n"


def describe(inventory: nvml_facts.Inventory, name: str | None, why: str, node: NodeShape) -> str:
    out = [f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version} (from {inventory.source})"]
    for g in inventory.gpus:
        memory = f"{g.memory_total_bytes / 2**30:.0f} GiB" if g.memory_total_bytes else "memory n/a"
        out.append(f"  GPU {g.index}  {g.name}  {nvml_facts.short_pci(g.pci_bus_id)}  device {g.pci_device_id or '?'}  {memory}")
    for lost in inventory.lost:
        out.append(f"  GPU {lost.index}  LOST  {lost.pci_bus_id or 'PCI address unknown'}  {lost.error}")
    out.append(f"node: {node.describe()}")
    out.append("\n".join(f"  {line}" for line in node.lines()))
    out.append(f"profile: {name or 'none'} ({why})")
    return "\n".join(out) + "\n"
