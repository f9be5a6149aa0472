"""The NVML seam: the only module that talks to nvidia-ml-py (`import pynvml`).

It exposes only the facts checks use (an ``Inventory``), turns NVML's errors
into a cause and a remedy a person can act on, and offers ``FakeNvml``: the
same facts read from a JSON file, for tests and demos on machines without a
GPU. NVML runs in a child process with a deadline: on a wedged driver
nvmlInit can block forever, and the agent must not. The child imports only
the standard library and pynvml, so it starts fast; the parent validates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from preflight.errors import UsageError

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


class NvmlUnavailable(Exception):
    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause = cause
        self.remedy = remedy


class _Facts(BaseModel):
    # A fake file with a typo ("ecc_uncorectable_volatile") must be an error,
    # not a silently healthy GPU.
    model_config = ConfigDict(extra="forbid", frozen=True)


class PcieLink(_Facts):
    gen: int | None = Field(default=None, ge=1)
    width: int | None = Field(default=None, ge=1)
    gen_max: int | None = Field(default=None, ge=1)  # the most this GPU *and* its slot can do
    width_max: int | None = Field(default=None, ge=1)


class RemappedRows(_Facts):
    correctable: int = Field(ge=0)
    uncorrectable: int = Field(ge=0)
    pending: bool
    failure: bool


class Gpu(_Facts):
    """One GPU as NVML sees it; None where the GPU or driver does not say."""

    index: int = Field(ge=0)
    name: str
    uuid: str
    pci_bus_id: str  # "00000000:18:00.0", as NVML prints it
    pci_device_id: str | None = Field(default=None, pattern=r"^0x[0-9a-f]{4}$")
    serial: str | None = None
    vbios: str | None = None
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    memory_total_bytes: int | None = Field(default=None, ge=0)
    ecc_mode: bool | None = None
    ecc_uncorrectable_volatile: int | None = Field(default=None, ge=0)
    ecc_uncorrectable_aggregate: int | None = Field(default=None, ge=0)
    retired_pages_pending: bool | None = None  # pre-Ampere; Ampere and later remap rows
    remapped_rows: RemappedRows | None = None
    pcie: PcieLink = PcieLink()
    clocks_events: list[str] | None = None  # names from CLOCKS_EVENTS that are active
    temperature_c: int | None = None
    power_limit_w: float | None = Field(default=None, ge=0)
    power_default_limit_w: float | None = Field(default=None, ge=0)
    nvlinks_active: int | None = Field(default=None, ge=0)
    nvlinks_down: list[int] = Field(default_factory=list)  # link indices present but not active


class LostGpu(_Facts):
    """A GPU the driver counts but cannot talk to (fell off the bus, Unknown Error)."""

    index: int = Field(ge=0)
    pci_bus_id: str | None = None
    error: str


class Inventory(_Facts):
    driver_version: str
    cuda_driver_version: str | None = None  # "12.4": the newest CUDA the driver supports
    gpus: list[Gpu]
    lost: list[LostGpu] = Field(default_factory=list)
    source: str = "NVML"


def short_pci(bus_id: str) -> str:
    """``00000000:18:00.0`` -> ``0000:18:00.0``: the form sysfs and lspci use."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def FakeNvml(path: Path) -> Inventory:  # noqa: N802 - reads like the class it stands in for
    """The facts of a recorded or invented node, from a JSON file (``--nvml-fake``)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"--nvml-fake {path}: cannot read it ({e.strerror}); pass an existing JSON file") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--nvml-fake {path}: not valid JSON: {e}") from None
    if isinstance(data, dict):
        data.setdefault("source", f"fake {path}")
    try:
        return Inventory.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the top level"
        raise UsageError(f"--nvml-fake {path}: field {where}: {err['msg']}") from None


def inventory(fake: Path | None = None, timeout: float = 20.0) -> Inventory:
    """Every GPU's facts, from NVML in a child process (or from the fake file)."""
    if fake is not None:
        return FakeNvml(fake)
    answer = _ask("inventory", timeout)
    try:
        return Inventory.model_validate(answer)
    except ValidationError as e:  # our own child disagreeing with our model: a bug, say so plainly
        raise NvmlUnavailable(f"NVML answered facts preflight cannot read: {e.errors()[0]['msg']}", BROKEN) from None


def pcie_links(timeout: float = 10.0) -> dict[str, PcieLink]:
    """PCIe link state now, by PCI bus id: read while a worker loads the links."""
    return {bus: PcieLink.model_validate(link) for bus, link in _ask("pcie", timeout).items()}


def _ask(what: str, timeout: float) -> Any:
    from preflight.host import Host

    # cwd "/": `python -m` puts the working directory first on sys.path, and a
    # pynvml.py lying there must not run as root.
    done = Host().run([sys.executable, "-m", "preflight.nvml", what], timeout, cwd="/")
    if done.timed_out:
        raise NvmlUnavailable(f"NVML did not answer within {timeout:g} s: the driver is wedged", BROKEN)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NvmlUnavailable(f"the NVML query died (exit {done.returncode}): {tail}", BROKEN) from None
    if "failed" in answer:
        raise NvmlUnavailable(answer["failed"]["cause"], answer["failed"]["remedy"])
    return answer["facts"]


# Everything below runs in the child, where only the standard library and pynvml exist.


def _child(what: str) -> dict[str, Any]:
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
        return {"facts": _inventory(pynvml) if what == "inventory" else _pcie(pynvml)}
    except pynvml.NVMLError as e:
        return _failed(f"NVML failed: {e}", BROKEN)
    finally:
        pynvml.nvmlShutdown()


def _failed(cause: str, remedy: str) -> dict[str, Any]:
    return {"failed": {"cause": cause, "remedy": remedy}}


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _optional(pynvml: Any, fn: str, *args: Any) -> Any:
    """A fact this GPU or driver may not have: None instead of an error. A GPU
    that is lost raises on, so the caller records it as lost."""
    f = getattr(pynvml, fn, None)
    if f is None:  # an older nvidia-ml-py without the call
        return None
    try:
        return f(*args)
    except (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown):
        raise
    except pynvml.NVMLError:
        return None


def _inventory(pynvml: Any) -> dict[str, Any]:
    cuda = _optional(pynvml, "nvmlSystemGetCudaDriverVersion_v2") or _optional(pynvml, "nvmlSystemGetCudaDriverVersion")
    facts: dict[str, Any] = {
        "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpus": [],
        "lost": [],
    }
    for i in range(pynvml.nvmlDeviceGetCount()):
        bus = None
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            bus = _text(pci.busId)
            facts["gpus"].append(_gpu(pynvml, i, h, bus, pci.pciDeviceId))
        except pynvml.NVMLError as e:
            # GPU_IS_LOST, Unknown Error, handle not found: name the slot when we got that far.
            facts["lost"].append({"index": i, "pci_bus_id": bus, "error": str(e)})
    return facts


def _gpu(pynvml: Any, i: int, h: Any, bus: str, device_id: int) -> dict[str, Any]:
    opt = lambda fn, *a: _optional(pynvml, fn, h, *a)  # noqa: E731
    mig = opt("nvmlDeviceGetMigMode")
    memory = opt("nvmlDeviceGetMemoryInfo")
    ecc = opt("nvmlDeviceGetEccMode")
    rows = opt("nvmlDeviceGetRemappedRows")  # (correctable, uncorrectable, pending, failure)
    reasons = opt("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = opt("nvmlDeviceGetCurrentClocksThrottleReasons")
    power = opt("nvmlDeviceGetEnforcedPowerLimit")
    default_power = opt("nvmlDeviceGetPowerManagementDefaultLimit")
    return {
        "index": i,
        "name": _text(pynvml.nvmlDeviceGetName(h)),
        "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
        "pci_bus_id": bus,
        # pciDeviceId packs device << 16 | vendor (0x233010DE for an H100 SXM).
        "pci_device_id": f"0x{device_id >> 16:04x}" if device_id else None,
        "serial": _maybe_text(opt("nvmlDeviceGetSerial")),
        "vbios": _maybe_text(opt("nvmlDeviceGetVbiosVersion")),
        "persistence_mode": _flag(opt("nvmlDeviceGetPersistenceMode")),
        "mig_mode": _flag(mig[0]) if mig else None,
        "memory_total_bytes": memory.total if memory else None,
        "ecc_mode": _flag(ecc[0]) if ecc else None,
        "ecc_uncorrectable_volatile": opt("nvmlDeviceGetTotalEccErrors", 1, 0),  # UNCORRECTED, VOLATILE
        "ecc_uncorrectable_aggregate": opt("nvmlDeviceGetTotalEccErrors", 1, 1),  # UNCORRECTED, AGGREGATE
        "retired_pages_pending": _flag(opt("nvmlDeviceGetRetiredPagesPendingStatus")),
        "remapped_rows": _rows(rows),
        "pcie": _link(pynvml, h),
        "clocks_events": [n for n, bit in CLOCKS_EVENTS.items() if reasons & bit] if reasons is not None else None,
        "temperature_c": opt("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        "power_limit_w": power / 1000 if power is not None else None,
        "power_default_limit_w": default_power / 1000 if default_power is not None else None,
        **_nvlinks(pynvml, h),
    }


def _rows(rows: Any) -> dict[str, Any] | None:
    if rows is None:  # pre-Ampere: no row remapping, retired pages instead
        return None
    correctable, uncorrectable, pending, failure = rows
    return {"correctable": correctable, "uncorrectable": uncorrectable, "pending": bool(pending), "failure": bool(failure)}


def _maybe_text(v: Any) -> str | None:
    return None if v is None else _text(v)


def _flag(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _link(pynvml: Any, h: Any) -> dict[str, Any]:
    opt = lambda fn: _optional(pynvml, fn, h)  # noqa: E731
    return {
        "gen": opt("nvmlDeviceGetCurrPcieLinkGeneration"),
        "width": opt("nvmlDeviceGetCurrPcieLinkWidth"),
        "gen_max": opt("nvmlDeviceGetMaxPcieLinkGeneration"),
        "width_max": opt("nvmlDeviceGetMaxPcieLinkWidth"),
    }


def _nvlinks(pynvml: Any, h: Any) -> dict[str, Any]:
    if not hasattr(pynvml, "nvmlDeviceGetNvLinkState"):
        return {"nvlinks_active": None, "nvlinks_down": []}
    active, down = 0, []
    for link in range(NVLINK_MAX_LINKS):
        state = _optional(pynvml, "nvmlDeviceGetNvLinkState", h, link)
        if state is None:  # no such link on this board
            continue
        if state:
            active += 1
        else:
            down.append(link)
    return {"nvlinks_active": active, "nvlinks_down": down}


def _pcie(pynvml: Any) -> dict[str, Any]:
    links = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            links[_text(pynvml.nvmlDeviceGetPciInfo(h).busId)] = _link(pynvml, h)
        except pynvml.NVMLError:
            continue  # the inventory already named a lost GPU
    return links


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1] if len(sys.argv) > 1 else "inventory")))
    sys.exit(0)
