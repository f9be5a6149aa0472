"""The NVML child's inventory (nvml_query.py): each GPU's facts (identity, memory, ECC, row
remapping, PCIe link, power, processes, the driver's recovery action), its clocks-event
reasons sampled over a short window across every GPU, and the PCIe reading alone.
Standard library only.
"""

from __future__ import annotations

import operator
import threading
import time
from functools import reduce
from typing import Any

from preflight.readers.nvidia.nvml_calls import as_text, field_number, optional
from preflight.readers.nvidia.nvml_topology import read_fabric, read_nvlinks, read_p2p, read_placement

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
# HW slowdown is documented as also reported during P-state and clock changes
# (nvml.h, nvmlClocksEventReasonHwSlowdown), so one reading proves nothing:
# the reasons are read this many times, this far apart, across every GPU at
# once. Adds about (SAMPLES - 1) x SAMPLE_GAP = 0.4 s to an inventory,
# whatever the GPU count.
CLOCK_SAMPLES, CLOCK_SAMPLE_GAP = 5, 0.1
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

def read_inventory(pynvml: Any) -> dict[str, Any]:
    cuda = optional(pynvml, "nvmlSystemGetCudaDriverVersion_v2") or optional(pynvml, "nvmlSystemGetCudaDriverVersion")
    facts: dict[str, Any] = {
        "driver_version": as_text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpus": [],
        "lost": [],
        "refused": [],
    }
    handles = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        bus = None
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as e:
            if no_permission(pynvml, e):
                # nvmlDeviceGetCount_v2 counts every GPU "even if nvmlDeviceGetHandleByIndex_v2 returns
                # NVML_ERROR_NO_PERMISSION" (nvml.h): one this process may not open (a job's device
                # cgroup) is not given to this run. Not lost: a lost GPU answers GPU_IS_LOST.
                facts["refused"].append({"index": i, "error": str(e)})
            else:
                facts["lost"].append({"index": i, "pci_bus_id": None, "error": str(e)})
            continue
        try:
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus = as_text(pci.busId)
            facts["gpus"].append(_gpu(pynvml, i, h, bus, pci.pciDeviceId))
            handles.append(h)
        except pynvml.NVMLError as e:
            # GPU_IS_LOST, Unknown Error, handle not found: name the slot when we got that far.
            facts["lost"].append({"index": i, "pci_bus_id": bus, "error": str(e)})
    checking = _check_inforoms(pynvml, facts["gpus"], handles)
    read_p2p(pynvml, facts["gpus"], handles)
    _sample_clocks(pynvml, facts, handles)
    for t in checking:
        t.join()
    return facts


def _check_inforoms(pynvml: Any, gpus: list[dict[str, Any]], handles: list[Any]) -> list[threading.Thread]:
    """Each GPU's ``inforom_valid``, in a thread of its own that runs beside the clock window: the
    check reads the InfoROM's flash (70 ms a GPU on an H200, driver 580), which eight GPUs one
    after another would add to every inventory. NVML is thread-safe."""
    def check(g: dict[str, Any], h: Any) -> None:
        try:
            g["inforom_valid"] = _inforom_valid(pynvml, h)
        except pynvml.NVMLError:
            pass  # lost meanwhile: the clock window names it
    threads = [threading.Thread(target=check, args=(g, h), name=f"inforom-{g['index']}", daemon=True) for g, h in zip(gpus, handles)]
    for t in threads:
        t.start()
    return threads


def no_permission(pynvml: Any, e: Exception) -> bool:
    """Whether ``e`` is NVML_ERROR_NO_PERMISSION: by nvidia-ml-py's class for it, or its code (4, nvml.h)."""
    cls = getattr(pynvml, "NVMLError_NoPermission", None)
    return (isinstance(cls, type) and isinstance(e, cls)) or getattr(e, "value", None) == getattr(pynvml, "NVML_ERROR_NO_PERMISSION", 4)


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
                reasons = read_reasons(pynvml, h, g["unanswered"])
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


def read_reasons(pynvml: Any, h: Any, unanswered: dict[str, str]) -> int | None:
    reasons = optional(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", h, unanswered=unanswered)
    if reasons is None:  # a driver before the rename answers the old name
        reasons = optional(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h, unanswered=unanswered)
    return reasons if isinstance(reasons, int) else None


# nvml.h NVML_COMPUTEMODE_*; a code outside it reads as not said.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def _gpu(pynvml: Any, i: int, h: Any, bus: str, device_id: int) -> dict[str, Any]:
    unanswered: dict[str, str] = {}
    opt = lambda fn, *a: optional(pynvml, fn, h, *a, unanswered=unanswered)  # noqa: E731
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
        "name": as_text(pynvml.nvmlDeviceGetName(h)),
        "uuid": as_text(pynvml.nvmlDeviceGetUUID(h)),
        "pci_bus_id": bus,
        # pciDeviceId packs device << 16 | vendor (0x233010DE for an H100 SXM).
        "pci_device_id": f"0x{device_id >> 16:04x}" if device_id else None,
        "serial": _maybe_text(opt("nvmlDeviceGetSerial")),
        "vbios": _maybe_text(opt("nvmlDeviceGetVbiosVersion")),
        "inforom_image": _maybe_text(opt("nvmlDeviceGetInforomImageVersion")),
        "inforom_valid": None,  # read beside the clock window: _check_inforoms
        "persistence_mode": _flag(opt("nvmlDeviceGetPersistenceMode")),
        "mig_mode": _flag(mig[0]) if mig else None,
        "compute_mode": COMPUTE_MODES.get(opt("nvmlDeviceGetComputeMode")),
        "memory_total_bytes": memory.total if memory else None,
        "ecc_mode": _flag(ecc[0]) if ecc else None,
        "ecc_default": _ecc_default(pynvml, h),
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
        **read_nvlinks(pynvml, h, unanswered),
        **read_placement(pynvml, h),
        "p2p_read": None,  # across the GPUs, once every handle is in: read_p2p
        "fabric": read_fabric(pynvml, h, unanswered),
        "recovery_action": _recovery_action(pynvml, h, unanswered),
        "processes": [{"pid": p.pid, "used_memory_bytes": _bytes(getattr(p, "usedGpuMemory", None))} for p in procs] if procs is not None else None,
        "unanswered": unanswered,
    }


def _recovery_action(pynvml: Any, h: Any, unanswered: dict[str, str]) -> str | None:
    """What the driver says this GPU needs to recover (a name of RECOVERY_ACTIONS), or None where
    it does not say."""
    field = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_FIELD)
    code = field_number(pynvml, h, field, RECOVERY_ASK, unanswered)
    if code is None:
        return None
    if code not in RECOVERY_ACTIONS:  # an action newer than this code: said, not guessed
        unanswered[RECOVERY_ASK] = f"recovery action {code}, which this preflight does not know"
        return None
    if code == 5 and _driver_major(pynvml) < RECOVERY_5_BEFORE:
        return RECOVERY_5_OLD
    return RECOVERY_ACTIONS[code]


CORRUPTED_INFOROM = 14  # nvml.h NVML_ERROR_CORRUPTED_INFOROM


def _inforom_valid(pynvml: Any, h: Any) -> bool | None:
    """Whether the InfoROM's checksums hold. The call answers nothing on success, so ``optional``
    cannot tell it from "not supported"; any answer but the corruption is unknown, quietly: a
    container or guest that may not read the flash must not read as a failed query."""
    f = getattr(pynvml, "nvmlDeviceValidateInforom", None)
    if f is None:
        return None
    try:
        f(h)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as e:
        cls = getattr(pynvml, "NVMLError_CorruptedInforom", None)
        corrupt = (isinstance(cls, type) and isinstance(e, cls)) or getattr(e, "value", None) == CORRUPTED_INFOROM
        return False if corrupt else None
    except Exception:  # noqa: BLE001 - a binding's surprise: unknown, as optional reads it
        return None
    return True


def _driver_major(pynvml: Any) -> int:
    """The driver's major version (580 of 580.159.04); 0 where it cannot be read."""
    try:
        return int(as_text(pynvml.nvmlSystemGetDriverVersion()).split(".")[0])
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
    return None if v is None else as_text(v)


def _ecc_default(pynvml: Any, h: Any) -> bool | None:
    """The ECC mode the board ships with. Asked quietly: a driver that cannot say leaves it unknown,
    never a failed query. nvidia-ml-py answers a one-item list ([state]), as it does the current mode's pair."""
    v = optional(pynvml, "nvmlDeviceGetDefaultEccMode", h)
    return _flag(v[0] if isinstance(v, (list, tuple)) and v else v if isinstance(v, int) else None)


def _flag(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _link(pynvml: Any, h: Any, unanswered: dict[str, str] | None = None) -> dict[str, Any]:
    opt = lambda fn: optional(pynvml, fn, h, unanswered=unanswered)  # noqa: E731
    return {
        "gen": opt("nvmlDeviceGetCurrPcieLinkGeneration"),
        "width": opt("nvmlDeviceGetCurrPcieLinkWidth"),
        "gen_max": opt("nvmlDeviceGetMaxPcieLinkGeneration"),
        "width_max": opt("nvmlDeviceGetMaxPcieLinkWidth"),
    }


def read_pcie(pynvml: Any) -> dict[str, Any]:
    links = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            links[as_text(pynvml.nvmlDeviceGetPciInfo(h).busId)] = _link(pynvml, h)
        except pynvml.NVMLError:
            continue  # the inventory already named a lost GPU
    return links
