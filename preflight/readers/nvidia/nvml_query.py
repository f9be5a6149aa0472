"""The NVML query that runs in a child process (see preflight/readers/nvidia/nvml.py).

Standard library and pynvml only, so the child starts in a fraction of the
agent's import time; it prints one JSON line, facts or a cause and remedy,
and the parent validates it.
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
import sys
import time
from functools import reduce
from typing import Any

NO_DRIVER = "install or load the NVIDIA driver (`nvidia-smi` must answer); on a machine with no GPU use --profile cpu for a dry run"
BROKEN = "look for Xid errors (`preflight xid`); reset the GPU (`nvidia-smi -r -i N`) or reboot, and drain the node until NVML answers"
NO_ACCESS = "run preflight as root, or give its user access to /dev/nvidia* (the video group on most distributions)"
MISMATCH = "reboot the node (or unload and reload the nvidia kernel modules) so the kernel module matches the installed driver"

# nvml.h's clocks-event (formerly throttle) reason bits, by the name a report shows.
CLOCKS_EVENTS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
# nvml.h's nvmlNvLinkDeviceType_t: what sits at the far end of an active link.
NVLINK_REMOTE = {0: "gpu", 1: "ibmnpu", 2: "switch"}  # NVML_NVLINK_DEVICE_TYPE_GPU, _IBMNPU, _SWITCH; 0xFF: unknown
AFFINITY_SCOPE_NODE = 0  # nvml.h NVML_AFFINITY_SCOPE_NODE: the NUMA node, as `nvidia-smi topo -m` prints it
# nvml.h's NVML_GPU_FABRIC_STATE_*: NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# HW slowdown is documented as also reported during P-state and clock changes
# (nvml.h, nvmlClocksEventReasonHwSlowdown), so one reading proves nothing:
# the reasons are read this many times, this far apart, across every GPU at
# once. Adds about (SAMPLES - 1) x SAMPLE_GAP = 0.4 s to an inventory,
# whatever the GPU count.
CLOCK_SAMPLES, CLOCK_SAMPLE_GAP = 5, 0.1
# What `unanswered` says where nvidia-ml-py asked for a versioned NVML entry
# point the installed driver does not export (NVMLLibraryMismatchError).
LACKS_VERSIONED = "this driver lacks the versioned call nvidia-ml-py makes; an nvidia-ml-py of the driver's generation answers it"
# The driver's recovery action for a GPU, read as a field value: nvmlDeviceGetGpuRecoveryAction
# is not in every nvidia-ml-py, nvmlDeviceGetFieldValues is. Field id and codes from nvml.h
# (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230; nvmlDeviceGpuRecoveryAction_t, NVML_GPU_RECOVERY_ACTION_*),
# as nvidia-ml-py 13.615.71's pynvml.py spells them; an nvidia-ml-py older than the field lacks
# the name, hence the number.
RECOVERY_FIELD = 230
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
                    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
RECOVERY_ASK = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"  # its key in `unanswered`
# Code 5 changed meaning: NVML's change log adds NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN "between
# v590 and v595" and BUS_RESET (6) "between v610 and v615", while nvidia-ml-py of the generations
# before 595 names 5 NVML_GPU_RECOVERY_ACTION_GPU_RESET_BUS (its 2025 pynvml.py, NVLink max 18).
# So a driver before 595 saying 5 asks for a bus reset. ref. docs.nvidia.com/deploy/nvml-api/change-log.html
RECOVERY_5_BEFORE, RECOVERY_5_OLD = 595, "bus_reset"
# A field's own nvmlReturn that means the driver does not know the field (NVML_ERROR_INVALID_ARGUMENT,
# NVML_ERROR_NOT_SUPPORTED): a driver older than it. Unknown, as _optional reads "not supported".
FIELD_ABSENT = (2, 3)
# nvml.h nvmlValueType_t -> the member of nvmlValue_t that holds the number.
FIELD_VALUE = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _child(what: str, *args: str) -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return _failed("nvidia-ml-py is not installed", "pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return _failed("no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found", NO_DRIVER)
    except pynvml.NVMLError_DriverNotLoaded:
        return _failed("no NVIDIA driver: the nvidia kernel module is not loaded", NO_DRIVER)
    except pynvml.NVMLError_NoPermission:
        return _failed("NVML refused access: no permission on /dev/nvidia*", NO_ACCESS)
    except getattr(pynvml, "NVMLError_LibRmVersionMismatch", ()) as e:
        return _failed(f"NVIDIA driver/library version mismatch ({e}): the driver was upgraded without a reboot", MISMATCH)
    except pynvml.NVMLError as e:  # GPU lost, Unknown Error at init: the driver is there, a GPU is not well
        return _failed(f"NVML failed to start: {e}", BROKEN)
    try:
        if what == "sample":
            return {"facts": _samples(pynvml, float(args[0]), float(args[1]))}
        return {"facts": _inventory(pynvml) if what == "inventory" else _pcie(pynvml)}
    except pynvml.NVMLError as e:
        return _failed(f"NVML failed: {e}", BROKEN)
    except Exception as e:  # noqa: BLE001 - the parent must get its one JSON line, never a traceback
        return _failed(f"the NVML query failed unexpectedly: {type(e).__name__}: {e}", BROKEN)
    finally:
        pynvml.nvmlShutdown()


def _failed(cause: str, remedy: str) -> dict[str, Any]:
    return {"failed": {"cause": cause, "remedy": remedy}}


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _optional(pynvml: Any, fn: str, *args: Any, unanswered: dict[str, str] | None = None) -> Any:
    """A fact this GPU or driver may not have: None instead of an error.

    A GPU that is lost raises on, so the caller records it as lost; whether a
    GPU is lost is decided by the calls every GPU answers (handle, PCI, name,
    UUID). Any error but "not supported" is noted in ``unanswered``: a health
    query that fails must not read as healthy. Nothing else escapes: one
    query's surprise must not cost every GPU's facts.
    """
    f = getattr(pynvml, fn, None)
    if f is None:  # an older nvidia-ml-py without the call
        return None
    try:
        return f(*args)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as e:
        absent = tuple(getattr(pynvml, f"NVMLError_{n}", ()) for n in ("NotSupported", "InvalidArgument", "FunctionNotFound"))
        if unanswered is not None and not isinstance(e, absent):
            unanswered[fn] = str(e)
        return None
    except getattr(pynvml, "NVMLLibraryMismatchError", ()):  # not an NVMLError: raised by nvidia-ml-py itself
        if unanswered is not None:
            unanswered[fn] = LACKS_VERSIONED
        return None
    except Exception as e:  # noqa: BLE001 - a binding bug or an odd answer: unknown, not a dead child
        if unanswered is not None:
            unanswered[fn] = f"{type(e).__name__}: {e}"
        return None


def _inventory(pynvml: Any) -> dict[str, Any]:
    cuda = _optional(pynvml, "nvmlSystemGetCudaDriverVersion_v2") or _optional(pynvml, "nvmlSystemGetCudaDriverVersion")
    facts: dict[str, Any] = {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpus": [],
        "lost": [],
    }
    handles = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        bus = None
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus = _text(pci.busId)
            facts["gpus"].append(_gpu(pynvml, i, h, bus, pci.pciDeviceId))
            handles.append(h)
        except pynvml.NVMLError as e:
            # GPU_IS_LOST, Unknown Error, handle not found: name the slot when we got that far.
            facts["lost"].append({"index": i, "pci_bus_id": bus, "error": str(e)})
    _sample_clocks(pynvml, facts, handles)
    return facts


def _sample_clocks(pynvml: Any, facts: dict[str, Any], handles: list[Any]) -> None:
    """Every GPU's clocks-event reasons, read CLOCK_SAMPLES times: ``clocks_events``
    holds those in every reading (persistent), ``clocks_events_transient`` those
    in some only. All GPUs share one window, so it costs the same for one or eight."""
    gpus = list(zip(facts["gpus"], handles))
    if not gpus:
        return
    readings: list[list[int]] = [[] for _ in gpus]
    for sample in range(CLOCK_SAMPLES):
        if sample:
            time.sleep(CLOCK_SAMPLE_GAP)
        for k, (g, h) in enumerate(gpus):
            if g is None:
                continue
            try:
                reasons = _reasons(pynvml, h, g["unanswered"])
            except pynvml.NVMLError as e:  # lost within the window: a lost GPU, as above
                facts["gpus"].remove(g)
                facts["lost"].append({"index": g["index"], "pci_bus_id": g["pci_bus_id"], "error": str(e)})
                gpus[k] = (None, h)
                continue
            if reasons is not None:
                readings[k].append(reasons)
    for (g, _), seen in zip(gpus, readings):
        if g is None or not seen:
            continue  # None, None: NVML did not say
        every, some = reduce(operator.and_, seen), reduce(operator.or_, seen)
        g["clocks_events"] = [n for n, bit in CLOCKS_EVENTS.items() if every & bit]
        g["clocks_events_transient"] = [n for n, bit in CLOCKS_EVENTS.items() if some & bit and not every & bit]
    facts["lost"].sort(key=lambda x: x["index"])


def _reasons(pynvml: Any, h: Any, unanswered: dict[str, str]) -> int | None:
    reasons = _optional(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", h, unanswered=unanswered)
    if reasons is None:  # a driver before the rename answers the old name
        reasons = _optional(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h, unanswered=unanswered)
    return reasons if isinstance(reasons, int) else None


# nvml.h NVML_COMPUTEMODE_*; a code outside it reads as not said.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _gpu(pynvml: Any, i: int, h: Any, bus: str, device_id: int) -> dict[str, Any]:
    unanswered: dict[str, str] = {}
    opt = lambda fn, *a: _optional(pynvml, fn, h, *a, unanswered=unanswered)  # noqa: E731
    mig = opt("nvmlDeviceGetMigMode")
    memory = opt("nvmlDeviceGetMemoryInfo")
    ecc = opt("nvmlDeviceGetEccMode")
    rows = opt("nvmlDeviceGetRemappedRows")  # (correctable, uncorrectable, pending, failure)
    power = opt("nvmlDeviceGetEnforcedPowerLimit")
    default_power = opt("nvmlDeviceGetPowerManagementDefaultLimit")
    procs = opt("nvmlDeviceGetComputeRunningProcesses")  # the recheck must not run beside a job
    if procs is None and "versioned call" in unanswered.get("nvmlDeviceGetComputeRunningProcesses", ""):
        # An older driver lacks the _v3 entry point nvidia-ml-py asks for; the _v2 one it has
        # answers, and without it every GPU would read as busy and the recheck would never run.
        procs = opt("nvmlDeviceGetComputeRunningProcesses_v2")
        if procs is not None:
            unanswered.pop("nvmlDeviceGetComputeRunningProcesses")
    return {
        "index": i,
        "name": _text(pynvml.nvmlDeviceGetName(h)),
        "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
        "pci_bus_id": bus,
        # pciDeviceId packs device << 16 | vendor (0x233010DE for an H100 SXM).
        "pci_device_id": f"0x{device_id >> 16:04x}" if device_id else None,
        "serial": _maybe_text(opt("nvmlDeviceGetSerial")),
        "vbios": _maybe_text(opt("nvmlDeviceGetVbiosVersion")),
        "inforom_image": _maybe_text(opt("nvmlDeviceGetInforomImageVersion")),
        "persistence_mode": _flag(opt("nvmlDeviceGetPersistenceMode")),
        "mig_mode": _flag(mig[0]) if mig else None,
        "compute_mode": COMPUTE_MODES.get(opt("nvmlDeviceGetComputeMode")),
        "memory_total_bytes": memory.total if memory else None,
        "ecc_mode": _flag(ecc[0]) if ecc else None,
        "ecc_uncorrectable_volatile": opt("nvmlDeviceGetTotalEccErrors", 1, 0),  # UNCORRECTED, VOLATILE
        "ecc_uncorrectable_aggregate": opt("nvmlDeviceGetTotalEccErrors", 1, 1),  # UNCORRECTED, AGGREGATE
        "retired_pages_pending": _flag(opt("nvmlDeviceGetRetiredPagesPendingStatus")),
        "remapped_rows": _rows(rows),
        "pcie": _link(pynvml, h, unanswered),
        "clocks_events": None,  # read over a window across every GPU: _sample_clocks
        "clocks_events_transient": None,
        "temperature_c": opt("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        "power_limit_w": power / 1000 if power is not None else None,
        "power_default_limit_w": default_power / 1000 if default_power is not None else None,
        **_nvlinks(pynvml, h, unanswered),
        **_placement(pynvml, h),
        "fabric": _fabric(pynvml, h, unanswered),
        "recovery_action": _recovery_action(pynvml, h, unanswered),
        "processes": [{"pid": p.pid, "used_memory_bytes": _bytes(getattr(p, "usedGpuMemory", None))} for p in procs] if procs is not None else None,
        "unanswered": unanswered,
    }


def _fabric(pynvml: Any, h: Any, unanswered: dict[str, str]) -> dict[str, str] | None:
    """The GPU's NVSwitch fabric registration; None where NVML has none (A100 and older answer "not supported")."""
    make = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if make is None:
        return None
    info = make()
    # nvidia-ml-py hands the argument to C unchanged: a bare Structure would go by value,
    # NVML would write through garbage and every GPU would read "not supported".
    if _optional(pynvml, "nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info), unanswered=unanswered) is None:
        return None
    state = FABRIC_STATES.get(info.state)
    if state is None:  # a state newer than this code: unknown, and not healthy
        unanswered["nvmlDeviceGetGpuFabricInfo"] = f"unknown fabric state {info.state}"
        return None
    status = "success"
    if info.status:
        try:
            status = _text(pynvml.nvmlErrorString(info.status))
        except Exception:  # noqa: BLE001 - the code still says it failed
            status = f"NVML error {info.status}"
    return {"state": state, "status": status}


def _recovery_action(pynvml: Any, h: Any, unanswered: dict[str, str]) -> str | None:
    """What the driver says this GPU needs to recover (a name of RECOVERY_ACTIONS), or None where
    it does not say. The call succeeds whatever the field; each field carries its own nvmlReturn."""
    asked: dict[str, str] = {}
    field = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_FIELD)
    values = _optional(pynvml, "nvmlDeviceGetFieldValues", h, [field], unanswered=asked)
    if asked:  # keyed by the field, not the call: other fields may be read through it one day
        unanswered[RECOVERY_ASK] = next(iter(asked.values()))
    if not values:
        return None
    v = values[0]
    if v.nvmlReturn in FIELD_ABSENT:
        return None
    if v.nvmlReturn:
        try:
            unanswered[RECOVERY_ASK] = _text(pynvml.nvmlErrorString(v.nvmlReturn))
        except Exception:  # noqa: BLE001 - the code still says it failed
            unanswered[RECOVERY_ASK] = f"NVML error {v.nvmlReturn}"
        return None
    code = int(getattr(v.value, FIELD_VALUE.get(v.valueType, "uiVal")))
    if code not in RECOVERY_ACTIONS:  # an action newer than this code: said, not guessed
        unanswered[RECOVERY_ASK] = f"recovery action {code}, which this preflight does not know"
        return None
    if code == 5 and _driver_major(pynvml) < RECOVERY_5_BEFORE:
        return RECOVERY_5_OLD
    return RECOVERY_ACTIONS[code]


def _driver_major(pynvml: Any) -> int:
    """The driver's major version (580 of 580.159.04); 0 where it cannot be read."""
    try:
        return int(_text(pynvml.nvmlSystemGetDriverVersion()).split(".")[0])
    except Exception:  # noqa: BLE001 - unread: taken as before any change of meaning
        return 0


def _bytes(v: Any) -> int | None:
    # NVML reports "not available" (in a container, under MIG) as a huge sentinel.
    return v if isinstance(v, int) and 0 <= v < 2**63 else None


def _rows(rows: Any) -> dict[str, Any] | None:
    if rows is None:  # pre-Ampere: no row remapping, retired pages instead
        return None
    correctable, uncorrectable, pending, failure = rows
    return {"correctable": correctable, "uncorrectable": uncorrectable, "pending": bool(pending), "failure": bool(failure)}


def _maybe_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _flag(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _link(pynvml: Any, h: Any, unanswered: dict[str, str] | None = None) -> dict[str, Any]:
    opt = lambda fn: _optional(pynvml, fn, h, unanswered=unanswered)  # noqa: E731
    return {
        "gen": opt("nvmlDeviceGetCurrPcieLinkGeneration"),
        "width": opt("nvmlDeviceGetCurrPcieLinkWidth"),
        "gen_max": opt("nvmlDeviceGetMaxPcieLinkGeneration"),
        "width_max": opt("nvmlDeviceGetMaxPcieLinkWidth"),
    }


def _nvlinks(pynvml: Any, h: Any, unanswered: dict[str, str]) -> dict[str, Any]:
    unknown = {"nvlinks_active": None, "nvlinks_down": [], "nvlink_remote": None, "nvlink_peers": None}
    if not hasattr(pynvml, "nvmlDeviceGetNvLinkState"):
        return unknown
    states = {link: _optional(pynvml, "nvmlDeviceGetNvLinkState", h, link, unanswered=unanswered) for link in range(NVLINK_MAX_LINKS)}
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
        kind = _optional(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link, unanswered=unanswered)
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
        info = _optional(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if info is None:
            if kinds[link] == "gpu":
                return None  # a GPU link whose far end is unknown: the pairs cannot be told
            continue
        bus = _text(info.busId)
        out[bus] = out.get(bus, 0) + 1
    return out or None


def _placement(pynvml: Any, h: Any) -> dict[str, Any]:
    """Where the GPU sits, as NVML says (what `nvidia-smi topo -m` prints in its affinity
    columns), for when that matrix cannot be read. A placement fact NVML does not give
    is None, never a health finding: the topology check takes it from sysfs instead."""
    words = 64  # 64-bit words of a CPU mask: 4096 CPUs
    cpus = _optional(pynvml, "nvmlDeviceGetCpuAffinityWithinScope", h, words, AFFINITY_SCOPE_NODE)
    if cpus is None:
        cpus = _optional(pynvml, "nvmlDeviceGetCpuAffinity", h, words)
    nodes = _optional(pynvml, "nvmlDeviceGetMemoryAffinity", h, 4, AFFINITY_SCOPE_NODE)
    gpu_node = _optional(pynvml, "nvmlDeviceGetNumaNodeId", h)
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


def _pcie(pynvml: Any) -> dict[str, Any]:
    links = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            links[_text(pynvml.nvmlDeviceGetPciInfo(h).busId)] = _link(pynvml, h)
        except pynvml.NVMLError:
            continue  # the inventory already named a lost GPU
    return links


def _samples(pynvml: Any, period: float, most: float) -> dict[str, Any]:
    """Every GPU's SM clock, power, temperature and clocks-event reasons each ``period``
    seconds until stdin closes (the agent says the load is over) or ``most`` seconds pass;
    the volatile uncorrectable ECC count at the start and the end (checks/burnin.py)."""
    import select

    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        gpus.append((h, {"index": i, "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId), "samples": [], "unanswered": {},
                         "ecc_before": None, "ecc_after": None, "max_sm_clock_mhz": None}))
    for h, g in gpus:
        g["max_sm_clock_mhz"] = _optional(pynvml, "nvmlDeviceGetMaxClockInfo", h, 1, unanswered=g["unanswered"])  # NVML_CLOCK_SM
        g["ecc_before"] = _optional(pynvml, "nvmlDeviceGetTotalEccErrors", h, 1, 0, unanswered=g["unanswered"])  # UNCORRECTED, VOLATILE
    end = time.monotonic() + most
    while True:
        for h, g in gpus:
            u = g["unanswered"]
            power = _optional(pynvml, "nvmlDeviceGetPowerUsage", h, unanswered=u)  # milliwatts
            g["samples"].append([round(time.time(), 3), _optional(pynvml, "nvmlDeviceGetClockInfo", h, 1, unanswered=u),  # NVML_CLOCK_SM
                                 power / 1000 if power is not None else None, _optional(pynvml, "nvmlDeviceGetTemperature", h, 0, unanswered=u),
                                 _reasons(pynvml, h, u)])
        wait = min(period, end - time.monotonic())
        if wait <= 0 or select.select([sys.stdin], [], [], wait)[0]:  # readable: the agent closed it
            break
    for h, g in gpus:
        g["ecc_after"] = _optional(pynvml, "nvmlDeviceGetTotalEccErrors", h, 1, 0, unanswered=g["unanswered"])
    return {"gpus": [g for _, g in gpus], "reasons": CLOCKS_EVENTS}


def _line(answer: dict[str, Any]) -> str:
    try:
        return json.dumps(answer)
    except (TypeError, ValueError) as e:  # a fact of a type JSON cannot hold: still one line the parent reads
        return json.dumps(_failed(f"NVML answered a fact preflight cannot write: {e}", BROKEN))


if __name__ == "__main__":
    # A wedged driver can hold this query for good: it must not outlive the agent that asked.
    from preflight.base.tether import die_with_parent

    die_with_parent(os.getppid())
    print(_line(_child(*(sys.argv[1:] or ["inventory"]))))
    sys.exit(0)
