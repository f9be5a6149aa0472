"""The node's shape, read from the node: how many GPUs this process may use,
how they are joined, which RDMA NICs it has.

A profile says what is true of a GPU model; the node says how many of them
it holds and how they are wired. A 1-GPU H100 VM, a 4-GPU partition of an
HGX board and a Kubernetes pod given 2 of 8 GPUs all run the H100 profile,
so nothing here comes from the profile. Every part records how it was
learnt, for the report and `preflight detect`.

Sources, most trusted first:
- the PCI bus (sysfs): NVIDIA display/3D controllers, and NVSwitch bridges;
- the GPU device nodes this process may open (/dev/nvidiaN): a container
  given 2 of the host's 8 GPUs sees all 8 in sysfs but only its own nodes,
  matched to PCI slots by the driver's "Device Minor" (/proc/driver/nvidia);
  a Slurm job under ConstrainDevices sees all 8 nodes but its device cgroup
  lets it open only its own (``may_open``);
- NVML: the GPUs it lists (not those it refuses this process: NO_PERMISSION),
  and where each active NVLink ends;
- CUDA_VISIBLE_DEVICES, read as CUDA reads it (pipeline/visible_gpus.py): a Slurm step
  given GPUs 4-7 of a node without a device cgroup may open all 8, but CUDA,
  and so the run's ranks, see 4.
Where sysfs lists no PCI device at all (gVisor-style sandboxes) the count
comes from the device nodes and NVML, and the shape says so.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from preflight.base.host import Host, read_stripped
from preflight.readers.nvidia.nvml_facts import Inventory, short_pci, slot
from preflight.base.units import format_cpulist
from preflight.pipeline.visible_gpus import cuda_visible_shape

Fabric = Literal["single", "nvswitch", "nvlink", "pcie", "unknown"]
FABRIC_WORDS = {
    "single": "one GPU",
    "nvswitch": "joined by NVSwitch",
    "nvlink": "joined by NVLink bridges or direct links",
    "pcie": "joined by PCIe only",
    "unknown": "links unknown",
}
# PCI class codes (sysfs `class`, first 6 hex digits): a GPU is a VGA (0x0300)
# or 3D (0x0302) controller; an NVSwitch is an NVIDIA "other bridge" (0x0680).
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"


class PciNvidia(BaseModel):
    """NVIDIA devices on the PCI bus; ``gpus`` None where sysfs lists no PCI device at all."""

    gpus: list[str] | None = None  # "0000:1b:00.0"
    nvswitches: int = 0


class NodeShape(BaseModel):
    gpus: int  # the GPUs this process may use: what the run expects NVML and CUDA to show
    gpus_from: str  # how that number was learnt
    slots: list[str] = []  # their PCI addresses, where the bus and the device nodes name them
    pci_gpus: list[str] | None = None  # every NVIDIA GPU on the PCI bus, the host's others too
    device_nodes: list[int] | None = None  # minors of /dev/nvidiaN here; None: not listed
    nvml_gpus: int | None = None  # None: NVML did not answer
    fabric: Fabric = "unknown"
    fabric_from: str = ""
    nvswitches: int = 0  # NVSwitch bridges on the PCI bus
    nics: list[str] = []  # RDMA devices (InfiniBand, RoCE) in /sys/class/infiniband
    nics_from: str = "sysfs /sys/class/infiniband"
    pinned: int | None = None  # the site's `[node] gpus`
    notes: list[str] = []
    # The node's GPUs where this process was given fewer: the driver names a device minor for
    # every GPU on the bus but /dev here holds only some (a job's container: pyxis, a pod given
    # 4 of 8). What Slurm's Gres is held to (outputs/schedulers/slurm.py). None: ``gpus`` is the node's. A GPU
    # the driver does not hold (bound to vfio-pci: no entry; NVreg_ExcludedGpus: its entry says so) is never counted.
    host_gpus: int | None = None

    def not_given(self) -> set[str]:
        """The slots, as kernel Xid lines print them ("0000:1b:00"), of the GPUs on this node's bus
        that are not given to this run: a pod's or a job's share of the node, CUDA_VISIBLE_DEVICES.
        Empty where the run has every GPU, or where the slots of its own are not all known: a GPU
        is never called another's unless this run's are each named."""
        if not self.pci_gpus or len(self.slots) != self.gpus or self.gpus >= len(self.pci_gpus):
            return set()
        return {slot(bus) for bus in self.pci_gpus} - {slot(bus) for bus in self.slots}

    def describe(self) -> str:
        """'8 GPUs joined by NVSwitch, 12 RDMA NICs': one line for people."""
        gpus = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        nics = f"{len(self.nics)} RDMA NIC{'s' if len(self.nics) != 1 else ''}" if self.nics else "no RDMA NIC"
        return f"{gpus} {FABRIC_WORDS[self.fabric]}, {nics}" if self.fabric != "single" else f"{gpus}, {nics}"

    def lines(self) -> list[str]:
        """Each part and how it was learnt, for `preflight detect` and the report's reader."""
        out = [f"GPUs: {self.gpus} ({self.gpus_from})", f"links: {FABRIC_WORDS[self.fabric]} ({self.fabric_from})",
               f"NICs: {', '.join(self.nics) or 'none'} ({self.nics_from})"]
        if self.pinned is not None:
            out.append(f"pinned by the site: {self.pinned} GPUs")
        return out + [f"note: {n}" for n in self.notes]


# ---- gathering -----------------------------------------------------------------


def pci_nvidia(host: Host) -> PciNvidia:
    devices = host.path("/sys/bus/pci/devices")
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        entries = []
    if not entries:  # no PCI device at all: a sandbox that hides the bus, not a node without GPUs
        return PciNvidia()
    gpus, switches = [], 0
    for entry in entries:
        vendor, klass = read_stripped(entry / "vendor"), read_stripped(entry / "class") or ""
        if vendor != "0x10de":
            continue
        if klass[:6] in GPU_CLASSES:
            gpus.append(entry.name.lower())
        elif klass[:6] == NVSWITCH_CLASS:
            switches += 1
    return PciNvidia(gpus=gpus, nvswitches=switches)


def device_nodes(host: Host) -> list[int] | None:
    """Minors of the /dev/nvidiaN nodes here; None where the driver's nodes are not
    there at all (no /dev/nvidiactl either): nothing can be said from /dev."""
    dev = host.path("/dev")
    try:
        names = [p.name for p in dev.iterdir()]
    except OSError:
        return None
    minors = sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"nvidia([0-9]+)", n)))
    if not minors and "nvidiactl" not in names:
        return None
    return minors


def may_open(path: Path) -> bool:
    """Whether this process may open the GPU device node at ``path`` for reading and writing, as
    NVML and CUDA do. access(2) runs the kernel's device-cgroup check (inode_permission calls
    devcgroup_inode_permission for a character device, for root too: a cgroup v1 devices.list or
    a v2 device program, as Slurm's ConstrainDevices and container runtimes set) without the
    driver's open, which would bring up a GPU whose persistence mode is off and can block on a
    wedged driver in this process, which must never hang. A path that is no character device
    (a recorded tree's stand-in) has no device to refuse."""
    try:
        if not stat.S_ISCHR(os.stat(path).st_mode):
            return True
    except OSError:
        return True  # gone since /dev was listed: the listing stands, and NVML will say
    return os.access(path, os.R_OK | os.W_OK)


def refused_nodes(host: Host, nodes: list[int] | None) -> list[int]:
    """Minors of the /dev/nvidiaN listed here that this process may not open (``may_open``)."""
    dev = host.path("/dev")
    return [m for m in nodes or [] if not may_open(dev / f"nvidia{m}")]


def driver_minors(host: Host) -> tuple[dict[str, int], dict[str, int]]:
    """PCI address -> device minor, from the driver's own /proc/driver/nvidia/gpus/*/information:
    of the GPUs it holds, and of those NVreg_ExcludedGpus keeps from it, which keep their entry
    and minor ("GPU Excluded: Yes", open-gpu-kernel-modules nv-procfs.c)."""
    root = host.path("/proc/driver/nvidia/gpus")
    held: dict[str, int] = {}
    excluded: dict[str, int] = {}
    try:
        entries = list(root.iterdir())
    except OSError:
        return held, excluded
    for entry in entries:
        text = read_stripped(entry / "information") or ""
        if m := re.search(r"^Device Minor:\s*([0-9]+)", text, re.M):
            (excluded if re.search(r"^GPU Excluded:\s*Yes", text, re.M) else held)[entry.name.lower()] = int(m.group(1))
    return held, excluded


def rdma_nics(host: Host) -> list[str]:
    root = host.path("/sys/class/infiniband")
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:
        return []


def gather(host: Host, inventory: Inventory | None, pinned: int | None = None, why_no_nvml: str | None = None) -> NodeShape:
    """Read the shape; ``inventory`` None when NVML did not answer (``why_no_nvml``)."""
    held, excluded = driver_minors(host)
    nodes = device_nodes(host)
    return judge_shape(pci_nvidia(host), nodes, held, rdma_nics(host), inventory, pinned, why_no_nvml, excluded=excluded,
                       refused=refused_nodes(host, nodes), cuda_visible=host.environ.get("CUDA_VISIBLE_DEVICES"))


# ---- reading the facts (pure) --------------------------------------------------


def judge_shape(
    pci: PciNvidia,
    nodes: list[int] | None,
    minors: dict[str, int],
    nics: list[str],
    inventory: Inventory | None,
    pinned: int | None = None,
    why_no_nvml: str | None = None,
    excluded: dict[str, int] | None = None,
    refused: list[int] | None = None,
    cuda_visible: str | None = None,
) -> NodeShape:
    """``refused``: minors of device nodes listed here that this process may not open (``may_open``);
    ``cuda_visible``: CUDA_VISIBLE_DEVICES as this process has it, None where unset."""
    notes: list[str] = []
    if excluded:
        # Kept from the driver on purpose (NVreg_ExcludedGpus): not this node's GPUs, even with a device node made by hand.
        notes.append(f"{len(excluded)} GPU(s) excluded from the driver (NVreg_ExcludedGpus), not counted: {', '.join(sorted(excluded))}")
        if pci.gpus:
            pci = pci.model_copy(update={"gpus": [bus for bus in pci.gpus if bus not in excluded]})
        if nodes is not None:
            nodes = [n for n in nodes if n not in excluded.values()]
    refused = [n for n in refused or [] if nodes is not None and n in nodes]
    if refused:
        # A device cgroup (Slurm's ConstrainDevices, a runtime's device rules) refuses open() but hides
        # no node: what this process may not open is not given to it, and no GPU of it is missing.
        notes.append(f"{len(refused)} GPU device node(s) here this process may not open (/dev/nvidia{_minor_list(refused)}: "
                     "a device cgroup, as a Slurm job's ConstrainDevices): not given to this run")
        nodes = [n for n in nodes or [] if n not in refused]
    usable, gpus_from = _usable(pci, nodes, minors, notes, refused)
    given_fewer = bool(pci.gpus) and usable is not None and all(bus in minors for bus in pci.gpus) and len(usable) < len(pci.gpus)
    seen = len(inventory.gpus) + len(inventory.lost) if inventory else None
    host_gpus = len(pci.gpus) if given_fewer else None  # the node's, where this process is given fewer (Slurm's Gres is the node's)
    if inventory is None:
        notes.append(f"NVML did not answer{': ' + why_no_nvml if why_no_nvml else ''}")
    if usable is None:
        count = seen or 0
        gpus_from = f"NVML alone: {gpus_from}" if inventory else f"nothing: {gpus_from}, and NVML is silent"
    elif seen is not None and seen > len(usable):
        # NVML reaches GPUs the bus does not list here (a VM or sandbox that hides them): NVML's word stands.
        notes.append(f"NVML lists {seen} GPUs, more than the {len(usable)} {gpus_from} shows")
        count, gpus_from = seen, f"NVML ({gpus_from} shows {len(usable)})"
    elif inventory is not None and inventory.refused and seen is not None and seen < len(usable) <= seen + len(inventory.refused) - len(refused):
        # NVML counts every GPU but refuses this process those it may not open (NO_PERMISSION, nvml.h):
        # the ones it refuses are not given to this run, never lost, whatever /dev let this process see.
        # Those whose device nodes the cgroup refuses are already out of ``usable``: their refusal by
        # NVML explains no GPU missing from it (one of the run's own that fell off the bus).
        known = {short_pci(g.pci_bus_id) for g in [*inventory.gpus, *inventory.lost] if g.pci_bus_id}
        notes.append(f"NVML refuses this process {len(inventory.refused)} GPU(s) (NVML index "
                     f"{', '.join(str(g.index) for g in inventory.refused)}: {inventory.refused[0].error}): not given to this run")
        count, gpus_from = seen, f"NVML ({gpus_from} shows {len(usable)}, of which NVML refuses {len(inventory.refused)})"
        host_gpus = host_gpus or len(usable)
        usable = [s for s in usable if s in known]
    else:
        count = len(usable)
    host_gpus = host_gpus if host_gpus is not None and count < host_gpus else None
    slots = [s for s in usable or [] if not s.startswith("?")]
    if cuda_visible is not None:
        count, slots, gpus_from, host_gpus = cuda_visible_shape(cuda_visible, count, slots, usable, gpus_from, host_gpus, inventory, seen, notes)
    if inventory is not None and inventory.source != "NVML":
        gpus_from += f"; NVML facts from {inventory.source}"
    fabric, fabric_from = fabric_of(inventory, pci.nvswitches, count)
    return NodeShape(
        gpus=count, gpus_from=gpus_from, slots=slots,
        pci_gpus=pci.gpus, device_nodes=nodes, nvml_gpus=seen, fabric=fabric, fabric_from=fabric_from,
        nvswitches=pci.nvswitches, nics=nics, pinned=pinned, notes=notes, host_gpus=host_gpus,
    )


def _usable(pci: PciNvidia, nodes: list[int] | None, minors: dict[str, int], notes: list[str],
            refused: list[int] | None = None) -> tuple[list[str] | None, str]:
    """The GPUs this process may use (PCI addresses; "?N" where only a device node
    names one), and how that was learnt; None where neither source says."""
    if pci.gpus is None:
        if nodes:
            return [f"?{m}" for m in nodes], f"/dev/nvidia{_minor_list(nodes)} (sysfs lists no PCI device)"
        return None, "sysfs lists no PCI device and /dev has no nvidia device node"
    if not pci.gpus and not nodes:
        if nodes is not None:
            return [], "the PCI bus (no NVIDIA GPU) and /dev (no nvidia device node)"
        return None, "the PCI bus lists no NVIDIA GPU and /dev has no nvidia device node"
    if nodes is None:
        return list(pci.gpus), "the PCI bus (sysfs)"
    mapped = {bus: minors[bus] for bus in pci.gpus if bus in minors}
    if len(mapped) == len(pci.gpus):
        mine = [bus for bus in pci.gpus if mapped[bus] in nodes]
        absent = [bus for bus in pci.gpus if mapped[bus] not in nodes and mapped[bus] not in (refused or [])]  # refused: said apart
        if absent:
            notes.append(f"{len(absent)} of the host's {len(pci.gpus)} GPUs have no device node here (not given to this container)")
        return mine, f"the PCI bus and /dev/nvidia{_minor_list(nodes)}"
    if mapped and sorted(mapped.values()) == sorted(nodes):
        # The NVIDIA container hook mounts the driver's entries of the given GPUs alone
        # (/proc/driver/nvidia/gpus), each with its device node: those slots are this container's.
        notes.append(f"{len(pci.gpus) - len(mapped)} of the host's {len(pci.gpus)} GPUs are not given to this container")
        return [bus for bus in pci.gpus if bus in mapped], f"the PCI bus, the driver's entries of the given GPUs and /dev/nvidia{_minor_list(nodes)}"
    if len(nodes) >= len(pci.gpus):
        return list(pci.gpus), "the PCI bus (sysfs), each with a device node"
    notes.append(f"the PCI bus lists {len(pci.gpus)} GPUs, /dev has {len(nodes)} device nodes; the driver does not say which is which")
    return [f"?{m}" for m in nodes], f"/dev/nvidia{_minor_list(nodes)} (the PCI bus lists {len(pci.gpus)})"


def _minor_list(nodes: list[int]) -> str:
    return format_cpulist(nodes) if len(nodes) == 1 else "{" + format_cpulist(nodes) + "}"


def fabric_of(inventory: Inventory | None, nvswitches: int, count: int) -> tuple[Fabric, str]:
    """How the GPUs are joined, and how that was learnt."""
    if count <= 1:
        return "single", "one GPU: nothing to join" if count else "no GPU: nothing to join"
    remote = {}
    for g in inventory.gpus if inventory else []:
        for kind, n in (g.nvlink_remote or {}).items():
            remote[kind] = remote.get(kind, 0) + n
    if remote.get("switch"):
        return "nvswitch", "NVML: active NVLinks end at an NVSwitch"
    if nvswitches:
        return "nvswitch", f"sysfs: {nvswitches} NVSwitch bridge(s) on the PCI bus"
    states = [g.nvlinks_active for g in inventory.gpus] if inventory else []
    if any(states):
        if remote.get("gpu"):
            return "nvlink", "NVML: active NVLinks end at another GPU"
        return "nvlink", "NVML: NVLinks active (where they end is not reported)"
    if states and all(s is not None for s in states):
        return "pcie", "NVML: no NVLink active on any GPU, and no NVSwitch on the PCI bus"
    return "unknown", "NVML does not report NVLink state" if inventory else "NVML did not answer"


# ---- which whole-node floors fit this node -------------------------------------


def floor_fits(floor_gpus: int | None, floor_fabric: str | None, shape: NodeShape | None, ranks: int) -> str | None:
    """Why a floor measured on (``floor_gpus``, ``floor_fabric``) does not judge this
    node, or None where it does. Floors are never scaled to another GPU count:
    busbw on an NVSwitch board is not flat in the GPU count (NVLS needs the whole
    board's switches, and a 2-GPU ring moves half the data per step), and no
    measurement we cite says by how much."""
    if floor_gpus is None and floor_fabric is None:
        return None
    if shape is None:
        return "no GPU shape was read"
    fabric = FABRIC_WORDS.get(shape.fabric, shape.fabric)
    if floor_gpus is not None and ranks != floor_gpus:
        where = f"a {ranks}-GPU node" if ranks == shape.gpus else f"a run on {ranks} of this node's {shape.gpus} GPUs"
        return f"the floor was measured on {floor_gpus} GPUs; no cited floor for {where} ({fabric}); `preflight calibrate` makes one"
    if floor_fabric is not None and shape.fabric != floor_fabric:
        return f"the floor was measured on GPUs {FABRIC_WORDS.get(floor_fabric, floor_fabric)}; this node's are {fabric}; `preflight calibrate` makes one"
    return None


def fitting_floors(floors: dict, whole_node: tuple[str, ...], shape: NodeShape | None, ranks: int, gloo_ranks: int | None) -> tuple[dict, dict[str, str]]:
    """The floors that judge this run, and why each other one does not. A floor
    tagged with the shape it was measured on judges only that shape; an untagged
    whole-node floor (a site's number for its own nodes, the cpu profile's) judges
    only a run over the whole node, not --nproc-per-node's subset of it."""
    kept, why = {}, {}
    whole = shape.gpus if shape else gloo_ranks
    for name, floor in floors.items():
        reason = floor_fits(floor.gpus, floor.fabric, shape, ranks)
        if reason is None and floor.gpus is None and name in whole_node and whole and ranks != whole:
            reason = f"a whole-node floor for {whole} {'GPUs' if shape else 'ranks'}, and this run had {ranks}"
        if reason is None:
            kept[name] = floor
        else:
            why[name] = reason
    return kept, why


def unjudged_lines(why: dict[str, str]) -> list[str]:
    """One line per reason: 'allreduce_bus_bandwidth, allreduce_latency: not judged: REASON'."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in why.items():
        by_reason.setdefault(reason, []).append(name)
    return [f"{', '.join(names)}: not judged: {reason}" for reason, names in by_reason.items()]
