"""Where a GPU sits and what joins it, as the NVML child (nvml_query.py) reads it: its NVLinks
and what is at their far ends, its NVSwitch fabric registration, and its CPU and NUMA
affinity. Standard library only.
"""

from __future__ import annotations

import ctypes
from typing import Any

from preflight.readers.nvidia.nvml_calls import as_text, field_number, optional

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
# nvml.h: NVML_FI_DEV_NVLINK_LINK_COUNT, "Number of NVLinks present on the device" (NCCL's
# nvmlwrap.h carries the same id). A board with fewer links than its die (an export part that
# keeps 8 of 18) has no links past that count to be down; DCGM and UCC ask only that many.
NVLINK_COUNT_FIELD = 91
# nvml.h's nvmlNvLinkDeviceType_t: what sits at the far end of an active link.
NVLINK_REMOTE = {0: "gpu", 1: "ibmnpu", 2: "switch"}  # NVML_NVLINK_DEVICE_TYPE_GPU, _IBMNPU, _SWITCH; 0xFF: unknown
AFFINITY_SCOPE_NODE = 0  # nvml.h NVML_AFFINITY_SCOPE_NODE: the NUMA node, as `nvidia-smi topo -m` prints it
# nvml.h's NVML_GPU_FABRIC_STATE_*: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def read_fabric(pynvml: Any, h: Any, unanswered: dict[str, str]) -> dict[str, str] | None:
    """The GPU's NVSwitch fabric registration; None where NVML has none (A100 and older answer "not supported")."""
    make = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if make is None:
        return None
    info = make()
    # nvidia-ml-py hands the argument to C unchanged: a bare Structure would go by value,
    # NVML would write through garbage and every GPU would read "not supported".
    if optional(pynvml, "nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info), unanswered=unanswered) is None:
        return None
    state = FABRIC_STATES.get(info.state)
    if state is None:  # a state newer than this code: unknown, and not healthy
        unanswered["nvmlDeviceGetGpuFabricInfo"] = f"unknown fabric state {info.state}"
        return None
    status = "success"
    if info.status:
        try:
            status = as_text(pynvml.nvmlErrorString(info.status))
        except Exception:  # noqa: BLE001 - the code still says it failed
            status = f"NVML error {info.status}"
    return {"state": state, "status": status}


def read_nvlinks(pynvml: Any, h: Any, unanswered: dict[str, str]) -> dict[str, Any]:
    unknown = {"nvlinks_active": None, "nvlinks_down": [], "nvlink_remote": None, "nvlink_peers": None}
    if not hasattr(pynvml, "nvmlDeviceGetNvLinkState"):
        return unknown
    # Unread, the count is every link NVML can name, as before it was asked; nothing to say.
    count = field_number(pynvml, h, NVLINK_COUNT_FIELD, "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_LINK_COUNT)", {})
    links = range(min(count, NVLINK_MAX_LINKS) if count else NVLINK_MAX_LINKS)
    states = {link: optional(pynvml, "nvmlDeviceGetNvLinkState", h, link, unanswered=unanswered) for link in links}
    present = {link: state for link, state in states.items() if state is not None}  # None: no such link
    if not present:  # not one link answered: unknown (a PCIe board, or a VM that hides NVLink), not "0 up"
        return unknown
    active = [k for k, s in present.items() if s]
    if not active:
        # Every link answers "inactive": a GPU with no NVLink partner (a PCIe
        # card without bridges, a lone SXM GPU in a VM; DCGM reports the same).
        # No partner is not a link down; whether one was expected is the judge's call.
        return {"nvlinks_active": 0, "nvlinks_down": [], "nvlink_remote": None, "nvlink_peers": None}
    kinds = _far_ends(pynvml, h, active, unanswered)
    return {
        "nvlinks_active": len(active),
        "nvlinks_down": [k for k, s in present.items() if not s],  # one link up: the rest should be too
        "nvlink_remote": _remote(kinds),
        "nvlink_peers": _peers(pynvml, h, kinds or dict.fromkeys(active, "unknown")),
    }


def _far_ends(pynvml: Any, h: Any, active: list[int], unanswered: dict[str, str]) -> dict[int, str] | None:
    """Each active link -> what is at its far end: NVSwitch, a GPU (bridge or direct), IBM NPU."""
    if not hasattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
        return None
    out: dict[int, str] = {}
    for link in active:
        kind = optional(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link, unanswered=unanswered)
        out[link] = NVLINK_REMOTE.get(kind, "unknown") if isinstance(kind, int) else "unknown"
    return out


def _remote(kinds: dict[int, str] | None) -> dict[str, int] | None:
    if kinds is None:
        return None
    out: dict[str, int] = {}
    for name in kinds.values():
        out[name] = out.get(name, 0) + 1
    return out


def _peers(pynvml: Any, h: Any, kinds: dict[int, str]) -> dict[str, int] | None:
    """Links whose far end may be a GPU, counted by that device's PCI bus id: which GPU
    pairs a bridge or a direct link joins, as `nvidia-smi topo -m` prints NV<n>. Links
    to an NVSwitch are not asked (every pair through the switches shares them).
    None where none is known; a placement fact, so its errors are no health finding."""
    asked = [link for link, kind in kinds.items() if kind in ("gpu", "unknown")]
    out: dict[str, int] = {}
    for link in asked:
        # nvidia-ml-py's nvmlDeviceGetNvLinkRemotePciInfo calls NVML's _v2 entry point.
        info = optional(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if info is None:
            if kinds[link] == "gpu":
                return None  # a GPU link whose far end is unknown: the pairs cannot be told
            continue
        bus = as_text(info.busId)
        out[bus] = out.get(bus, 0) + 1
    return out or None


def read_placement(pynvml: Any, h: Any) -> dict[str, Any]:
    """Where the GPU sits, as NVML says (what `nvidia-smi topo -m` prints in its affinity
    columns), for when that matrix cannot be read. A placement fact NVML does not give
    is None, never a health finding: the topology check takes it from sysfs instead."""
    words = 64  # 64-bit words of a CPU mask: 4096 CPUs
    cpus = optional(pynvml, "nvmlDeviceGetCpuAffinityWithinScope", h, words, AFFINITY_SCOPE_NODE)
    if cpus is None:
        cpus = optional(pynvml, "nvmlDeviceGetCpuAffinity", h, words)
    nodes = optional(pynvml, "nvmlDeviceGetMemoryAffinity", h, 4, AFFINITY_SCOPE_NODE)
    gpu_node = optional(pynvml, "nvmlDeviceGetNumaNodeId", h)
    cpu_list = _bits(cpus)
    node_list = _bits(nodes)
    return {
        "cpu_affinity": _ranges(cpu_list) if cpu_list else None,
        "numa_affinity": node_list or None,
        "gpu_numa_id": gpu_node if isinstance(gpu_node, int) and gpu_node >= 0 else None,
    }


def _bits(mask: Any) -> list[int]:
    """The set bits of NVML's mask (an array of 64-bit words, lowest first)."""
    if mask is None:
        return []
    try:
        return [w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1]
    except (TypeError, ValueError):
        return []


def _ranges(items: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the kernel's CPU-list form."""
    out: list[str] = []
    for x in sorted(items):
        if out and x == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ",".join(out)


# nvml.h nvmlGpuP2PStatus_t, in order; a code outside it reads as "unknown".
P2P_STATUS = ("ok", "chipset_not_supported", "gpu_not_supported", "topology_not_supported", "disabled_by_regkey", "not_supported", "unknown")
P2P_CAPS_INDEX_READ = 0  # nvml.h NVML_P2P_CAPS_INDEX_READ (nvidia-ml-py spells it a one-item tuple)


def read_p2p(pynvml: Any, gpus: list[dict[str, Any]], handles: list[Any]) -> None:
    """Each GPU's ``p2p_read``: whether it may read each other GPU's memory, as NVML says. Asked
    quietly: a driver that cannot say leaves it unknown, never a failed query."""
    if len(gpus) < 2 or not hasattr(pynvml, "nvmlDeviceGetP2PStatus"):
        return
    for g, h in zip(gpus, handles):
        said = {}
        for other, o in zip(gpus, handles):
            if other is g:
                continue
            try:
                code = optional(pynvml, "nvmlDeviceGetP2PStatus", h, o, P2P_CAPS_INDEX_READ)
            except pynvml.NVMLError:  # lost since its facts were read: the clock window names it lost
                code = None
            if isinstance(code, int):
                said[other["pci_bus_id"]] = P2P_STATUS[code] if 0 <= code < len(P2P_STATUS) else "unknown"
        g["p2p_read"] = said or None

