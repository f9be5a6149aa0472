"""`auto`: which profile fits the GPUs NVML reports (``detect``, ``choose``, and ``pick``,
the pure rule), and why none does (``DetectionFailed``; ``NvmlUnreadable`` where NVML could
not be asked at all).
"""

from __future__ import annotations

from pathlib import Path

from preflight.pipeline.profiles import Profile, available, load
from preflight.readers.nvidia.nvml import BROKEN, Shared
from preflight.readers.nvidia.nvml_facts import Inventory


class DetectionFailed(Exception):
    """`auto` could not pick a profile; the run FAILs with this cause and remedy."""

    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


# What `auto` runs where no profile names the node's GPU model: every judgement that needs no
# SKU (the GPUs' health, the node's own layout, NCCL, each GPU against its peers), no floor of
# the model. A healthy node of a model no profile knows passes; a site that wants such a node
# to fail names its profile (`--profile`), which then holds the node's GPUs to its PCI ids.
GENERIC = "generic"
GENERIC_WHY = (f"so profile {GENERIC}: what needs no SKU is judged, no floor of the model is; add a profile for the model "
               "(`preflight calibrate` on a healthy node measures its floors)")


def generic_why(refused: str | None = None) -> str:
    """Why `generic` judges: no profile names the model, or (``refused``) one does, but not its PCI device id."""
    return f"{refused or 'no profile names this model'}, {GENERIC_WHY}"


class NvmlUnreadable(DetectionFailed):
    """`auto` could not ask NVML at all (no driver, or it did not answer): there was no GPU to pick by."""


def pick(gpus: list[tuple[str, str | None]], profiles: dict[str, Profile]) -> tuple[str, str]:
    """The profile that fits every GPU, and why (pure, for tests).

    ``gpus`` holds (NVML product name, PCI device id or None). A profile fits
    when one of its ``match`` patterns is in the name and, where both sides
    know it, the device id is one it lists: the name selects, the id confirms
    (an "NVIDIA H200 NVL" must not run under the H200 SXM's floors). The
    longest matching pattern wins, so "H100 NVL" beats "H100".
    """
    if not gpus:
        raise DetectionFailed(
            "the NVIDIA driver is loaded but NVML reports no GPU",
            "check `nvidia-smi`, the PCI devices (`lspci -d 10de:`) and `preflight xid` for errors; "
            "drain the node until the GPUs are back",
        )
    if len(set(gpus)) > 1:
        kinds = sorted(f"{name} ({device or 'device id unknown'})" for name, device in set(gpus))
        raise DetectionFailed(
            f"mixed GPU models on one node: {', '.join(kinds)}",
            "pass --profile explicitly if this mix is intended; otherwise drain the node",
        )
    gpu, device = gpus[0]
    best: tuple[int, str, str] | None = None
    refused = []  # profiles whose pattern names the GPU but whose PCI ids are not its
    for name, profile in profiles.items():
        ids = profile.gpu.pci_device_ids if profile.gpu else []
        # Without an id to confirm it, a pattern must end the name: "NVIDIA H200" is in "NVIDIA H200 NVL".
        unconfirmed = not device and ids
        named = [pattern for pattern in profile.match if pattern.lower() in gpu.lower() and not (unconfirmed and not gpu.lower().endswith(pattern.lower()))]
        if device and ids and device not in ids:
            if named:
                refused.append(f"profile {name} names {gpu!r} ({named[0]!r}) but not PCI device id {device} ({', '.join(ids)})")
            continue
        for pattern in named:
            if best is None or len(pattern) > best[0]:
                best = (len(pattern), name, pattern)
    if best is None and device:
        # A driver older than the GPU names it "NVIDIA Graphics Device": its id still says which it is,
        # and that profile's driver floor then names the fault, where generic would pass it.
        listed = sorted(name for name, p in profiles.items() if p.gpu and device in p.gpu.pci_device_ids)
        if len(listed) == 1:
            return listed[0], (f"auto: {len(gpus)} x {gpu} matched profile {listed[0]} by PCI device id {device} "
                               "(no pattern names it: a driver older than this GPU names it so)")
    if best is None and GENERIC in profiles:
        return GENERIC, f"auto: {len(gpus)} x {gpu} (PCI device id {device or 'unknown'}): {generic_why('; '.join(refused) or None)}"
    if best is None:
        raise DetectionFailed(
            f"no profile matches GPU model {gpu!r} (PCI device id {device or 'unknown'})",
            "pass --profile NAME (see 'preflight show-profile'), or add a profile for this SKU "
            "to /etc/preflight/profiles/",
        )
    _, chosen, pattern = best
    confirmed = f" and PCI device id {device}" if device and profiles[chosen].gpu and profiles[chosen].gpu.pci_device_ids else ""
    return chosen, f"auto: {len(gpus)} x {gpu} matched profile {chosen} by name {pattern!r}{confirmed}"


def detect(site_dir: Path | None, fake: Path | None = None, reading: Shared | None = None) -> tuple[str, str]:
    """Pick a profile from what NVML (or the ``--nvml-fake`` file) reports: (name, why).
    ``reading``: the run's NVML inventory, which the checks then judge."""
    from preflight.readers.nvidia import nvml

    try:
        inventory = (reading or nvml.Shared(fake)).get()
    except nvml.NvmlUnavailable as e:
        raise NvmlUnreadable(e.cause, e.remedy) from None
    return choose(inventory, site_dir)


def choose(inventory: Inventory, site_dir: Path | None) -> tuple[str, str]:
    if not inventory.gpus and inventory.lost:
        lost = inventory.lost[0]
        raise DetectionFailed(
            f"NVML counts {len(inventory.lost)} GPU(s) but cannot reach any: GPU {lost.index} "
            f"({lost.pci_bus_id or 'PCI address unknown'}): {lost.error}",
            BROKEN,
        )
    profiles = {name: load(path) for name, path in available(site_dir).items()}
    return pick([(g.name, g.pci_device_id) for g in inventory.gpus], profiles)
