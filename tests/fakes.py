"""Every fake the tests use, in one place.

Small checks with known behaviour, for the runner's semantics, and a helper
that installs them as a real entry-point plugin (a dist-info directory on
sys.path), exactly as a third-party check would be installed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from preflight.pipeline.check import Check, Context, Result, Waiting
from preflight.base.findings import Status

HERE = Path(__file__).parent


class Passing(Check):
    name = "passing"
    description = "always passes"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, "fine")


class Warning_(Check):
    name = "warning"
    description = "always warns"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.WARN, "a little slow", cause="because", remedy="wait")


class Failing(Check):
    name = "failing"
    description = "always fails"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.FAIL, "broken", cause="the fake is broken", remedy="replace the fake")


class Raising(Check):
    name = "raising"
    description = "raises"

    def run(self, ctx: Context) -> Result:
        raise RuntimeError("boom inside the check")


class NotApplicable(Check):
    name = "notapplicable"
    description = "never applies"

    def applies(self, ctx: Context) -> str | None:
        return "no such hardware here"

    def run(self, ctx: Context) -> Result:
        raise AssertionError("run() must not be called when applies() gives a reason")


class NeedsFailing(Check):
    name = "needsfailing"
    description = "requires the failing check"
    requires = ("failing",)

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, "ran")


class Hanging(Check):
    """Hangs in a child process of its own session, as a wedged worker would."""

    name = "hanging"
    description = "hangs"
    timeout_seconds = 1.0

    def run(self, ctx: Context) -> Result:
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(os.environ.get("FAKE_PID_FILE", os.devnull)).write_text(str(proc.pid))
        proc.wait()
        return self.result(Status.PASS, "woke up")


class LeavesChild(Check):
    """Returns while a child it started is still running."""

    name = "leaveschild"
    description = "leaves a child behind"

    def run(self, ctx: Context) -> Result:
        proc = subprocess.Popen(["sleep", "300"])
        return self.result(Status.PASS, f"left pid {proc.pid}", details={"pid": proc.pid})


class WrongReturn(Check):
    name = "wrongreturn"
    description = "returns something that is not a Result"

    def run(self, ctx: Context) -> Result:
        return "PASS"  # type: ignore[return-value]


class Ranks:
    """Stands for the run's ranks while they import torch: ``up`` is set once they are, and
    ``log`` records what ran when, for the runner's tests of checks that wait for them."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.log: list[str] = []


class WaitsForRanks(Check):
    """Returns ``Waiting`` as cuda does while the ranks import torch; its rest ends in ``status``
    (or sleeps ``hang`` seconds first, or raises). Like firmware, it may itself run beside a held check."""

    description = "waits for the ranks"
    beside_ranks = True

    def __init__(self, ranks: Ranks, name: str = "waits", status: Status = Status.PASS, hang: float = 0.0, raises: bool = False,
                 signal_when_asked: int | None = None):
        self.name, self.ranks, self.status, self.hang, self.raises = name, ranks, status, hang, raises  # type: ignore[misc]
        self.signal_when_asked = signal_when_asked  # a signal that lands while the runner asks whether it is ready

    def run(self, ctx: Context) -> Waiting:
        self.ranks.log.append(f"{self.name}: first part")
        return Waiting(ready=self._ready, rest=self._rest)

    def _ready(self) -> bool:
        if self.signal_when_asked is not None:
            from preflight.base.errors import Interrupted

            raise Interrupted(self.signal_when_asked)
        return self.ranks.up.is_set()

    def _rest(self) -> Result:
        self.ranks.log.append(f"{self.name}: rest")
        time.sleep(self.hang)
        if self.raises:
            raise RuntimeError("boom in the rest")
        return self.result(self.status, "the rest ran")


class Rankless(Check):
    """Needs no ranks: logs that it ran, and may bring the ranks ``up`` as it ends."""

    description = "needs no ranks"
    beside_ranks = True

    def __init__(self, ranks: Ranks, name: str, status: Status = Status.PASS, brings_up: bool = False, requires: tuple[str, ...] = ()):
        self.name, self.ranks, self.status, self.brings_up, self.requires = name, ranks, status, brings_up, requires  # type: ignore[misc]

    def run(self, ctx: Context) -> Result:
        self.ranks.log.append(self.name)
        if self.brings_up:
            self.ranks.up.set()
        return self.result(self.status, "ran")


class WantsRanks(Rankless):
    """A stage in the run's launch of ranks (as nccl): the held checks go on before it."""

    beside_ranks = False

    def ranks_wanted(self, ctx: Context) -> int | None:
        return 1


class StartingLaunch:
    """Stands for the run's launch of ranks (``ctx.worlds``) while torchrun starts its ranks: each
    time the runner asks which processes to spare, a new rank starts just after it was answered."""

    def __init__(self) -> None:
        self.ranks: list[subprocess.Popen] = []

    def after_check(self) -> set[int]:
        spare = {p.pid for p in self.ranks}
        self.ranks.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return spare

    def close(self) -> None:
        for p in self.ranks:
            p.kill()
            p.wait()


class Slow(Check):
    """Sleeps in-process, for lock and signal tests."""

    name = "slow"
    description = "sleeps for FAKE_SLOW_SECONDS"
    timeout_seconds = 120.0

    def run(self, ctx: Context) -> Result:
        time.sleep(float(os.environ.get("FAKE_SLOW_SECONDS", "5")))
        return self.result(Status.PASS, "slept")


class Crashing(Check):
    """Kills the whole agent, as an OOM kill or a segfault in a driver would."""

    name = "crashing"
    description = "SIGKILLs its own process"

    def run(self, ctx: Context) -> Result:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
        return self.result(Status.PASS, "unreachable")


class Exits(Check):
    """Calls sys.exit, as a careless plugin might."""

    name = "exits"
    description = "raises SystemExit"

    def run(self, ctx: Context) -> Result:
        sys.exit(4)


class BadDetails(Check):
    """Puts something JSON cannot hold into its details."""

    name = "baddetails"
    description = "unserialisable details"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, "fine", details={"handle": object()})


class Misnamed(Check):
    name = "somethingelse"
    description = "registered under another name"

    def run(self, ctx: Context) -> Result:
        return self.result(Status.PASS, "fine")


class Daemonizes(Check):
    """Starts a grandchild that escapes into a session of its own and returns."""

    name = "daemonizes"
    description = "leaves a setsid grandchild"

    def run(self, ctx: Context) -> Result:
        pid_file = os.environ["FAKE_PID_FILE"]
        subprocess.run(["sh", "-c", f"setsid sleep 300 & echo $! > {pid_file}"], check=True)
        return self.result(Status.PASS, "daemonized")


FAKES = [
    Passing, Warning_, Failing, Raising, NotApplicable, NeedsFailing, Hanging, LeavesChild, WrongReturn, Slow,
    Crashing, Exits, BadDetails, Daemonizes,
]


# A stand-in for nvidia-ml-py at the NVML seam, driven by FAKE_NVML:
#   nodriver | noperm    nvmlInit fails as it does without a driver / without access
#   mismatch             nvmlInit fails with the driver/library version mismatch
#   hang                 nvmlInit never returns (a wedged driver)
#   crash                the process dies of SIGSEGV inside NVML
#   versioned:<fn>,...   these calls raise NVMLLibraryMismatchError, as nvidia-ml-py
#                        does where the driver lacks the versioned entry point it asks for
#   oops:<fn>,...        these calls raise ValueError (a binding bug, an odd answer)
# and by FAKE_NVML_FACTS, a FakeNvml JSON file. Its facts are served as NVML
# answers them: nvlinks_active 0 with no link down is a GPU whose 18 links all
# answer "inactive"; clocks_events_transient are set in the first reading only;
# nvmlDeviceGetNvLinkRemoteDeviceType exists only where some GPU has nvlink_remote
# (facts recorded before it read as an nvidia-ml-py without the call); a GPU
# without inforom_image or fabric answers those calls "not supported" (fabric
# status: NVML's error string, served through nvmlErrorString); the recovery action is a
# field value of nvmlDeviceGetFieldValues, "not supported" where the facts name none; so is
# the count of NVLinks present (NVML_FI_DEV_NVLINK_LINK_COUNT), a GPU's "nvlink_count" where named.
FAKE_PYNVML = """
# A stand-in for nvidia-ml-py, driven by FAKE_NVML (a failure mode) and
# FAKE_NVML_FACTS (the FakeNvml JSON whose facts it serves), so the real
# adapter in preflight/readers/nvidia/nvml.py runs against known answers.
import ctypes, json, os, signal, time

class NVMLError(Exception):
    pass

class NVMLLibraryMismatchError(Exception):  # not an NVMLError, as in nvidia-ml-py
    pass

for _name in ("LibraryNotFound", "DriverNotLoaded", "NoPermission", "GpuIsLost", "Unknown",
              "NotSupported", "LibRmVersionMismatch", "InvalidArgument", "CorruptedInforom"):
    globals()["NVMLError_" + _name] = type("NVMLError_" + _name, (NVMLError,), {})

MODE = os.environ.get("FAKE_NVML", "")
FACTS = json.load(open(os.environ["FAKE_NVML_FACTS"])) if os.environ.get("FAKE_NVML_FACTS") else {
    "driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": [], "lost": []}
DEVICES = {g["index"]: g for g in FACTS["gpus"]}
LOST = {g["index"]: g for g in FACTS.get("lost", [])}
# GPUs NVML counts but refuses this process (a job's device cgroup): their handle lookup
# answers NO_PERMISSION, as nvmlDeviceGetHandleByIndex_v2 does there.
REFUSED = {g["index"]: g for g in FACTS.get("refused", [])}
BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
KIND, _, CALLS = MODE.partition(":")
FAILING = {"versioned": NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match the NVML lib version."),
           "oops": ValueError("invalid literal for int() with base 10: 'N/A'")}.get(KIND)
READINGS = {}

def nvmlInit():
    if MODE == "hang":
        time.sleep(600)
    if MODE == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if MODE == "nodriver":
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    if MODE == "noperm":
        raise NVMLError_NoPermission("Insufficient Permissions")
    if MODE == "mismatch":
        raise NVMLError_LibRmVersionMismatch("RM has detected an NVML/RM version mismatch.")

def nvmlShutdown():
    pass

def nvmlSystemGetDriverVersion():
    return FACTS["driver_version"]

def nvmlSystemGetCudaDriverVersion_v2():
    major, minor = FACTS["cuda_driver_version"].split(".")
    return int(major) * 1000 + int(minor) * 10

def nvmlDeviceGetCount():
    return len(DEVICES) + len(LOST) + len(REFUSED)

def nvmlDeviceGetHandleByIndex(i):
    if i in REFUSED:
        raise NVMLError_NoPermission(REFUSED[i]["error"])
    if i in LOST and LOST[i]["pci_bus_id"] is None:
        raise NVMLError_GpuIsLost(LOST[i]["error"])
    return i

class _Pci:
    def __init__(self, bus, device):
        self.busId = bus.encode()  # older nvidia-ml-py returns bytes
        self.pciDeviceId = (int(device, 16) << 16 | 0x10DE) if device else 0

def nvmlDeviceGetPciInfo(h):
    if h in LOST:
        return _Pci(LOST[h]["pci_bus_id"], None)
    return _Pci(DEVICES[h]["pci_bus_id"], DEVICES[h]["pci_device_id"])

def _fact(h, *path):
    if h in LOST:
        raise NVMLError_GpuIsLost(LOST[h]["error"])
    v = DEVICES[h]
    for key in path:
        v = v[key]
    if v is None:
        raise NVMLError_NotSupported("Not Supported")
    return v

def _given(h, key):
    # A fact older files do not list reads as NVML's "not supported".
    if h in DEVICES and DEVICES[h].get(key) is None:
        raise NVMLError_NotSupported("Not Supported")
    return _fact(h, key)

NVML_SUCCESS = 0
FABRIC_CODES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
ERRORS = {}  # code -> NVML's error string, for the fabric status a file names

class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint)]

def _pointee(arg):
    # nvidia-ml-py hands the argument to the C function unchanged, and ctypes passes
    # a bare Structure by value: NVML then writes through garbage and the caller's
    # struct stays zero. Only a pointer (byref or pointer()) reaches the caller's memory.
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    if type(arg).__name__ == "CArgObject":  # what ctypes.byref returns
        return arg._obj
    raise TypeError(f"nvmlDeviceGetGpuFabricInfo needs a pointer to the struct (ctypes.byref), got {type(arg).__name__} by value")

def nvmlDeviceGetGpuFabricInfo(h, arg):
    # As nvidia-ml-py: fills the struct, returns NVML_SUCCESS; A100 and older raise "not supported".
    info = _pointee(arg)
    fabric = _given(h, "fabric")
    info.state = FABRIC_CODES[fabric["state"]]
    status = fabric.get("status", "success")
    if status != "success":
        info.status = _error_code(status)
    return NVML_SUCCESS

def _error_code(text):
    code = next((c for c, known in ERRORS.items() if known == text), 900 + len(ERRORS))
    ERRORS[code] = text
    return code

def nvmlErrorString(code):
    return ERRORS[code]

# The recovery action, as NVML gives it: a field value (nvml.h NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
# 230), each field with its own nvmlReturn while the call itself succeeds. No constant for the
# field here, as in an nvidia-ml-py older than it: the child must use the number.
RECOVERY_CODES = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3, "drain_and_reset": 4,
                  "recover_imex_domain": 5, "bus_reset": 6, "system_reboot": 7}
RECOVERY_ASK = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"

class c_nvmlValue_t(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong), ("ullVal", ctypes.c_ulonglong),
                ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int), ("usVal", ctypes.c_ushort)]

class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", c_nvmlValue_t)]

def nvmlDeviceGetFieldValues(h, fieldIds):
    # A GPU whose facts name no recovery_action answers NVML_ERROR_NOT_SUPPORTED (3), as a driver
    # older than the field does; one whose "unanswered" names RECOVERY_ASK, that error's words;
    # a "recovery_code" (a number) stands for a code newer than the child knows.
    _fact(h, "name")  # a lost GPU raises, as every call on it does
    g = DEVICES[h]
    values = (c_nvmlFieldValue_t * len(fieldIds))()
    for v, field in zip(values, fieldIds):
        v.fieldId = field
        failed = g.get("unanswered", {}).get(RECOVERY_ASK)
        code = g.get("recovery_code", RECOVERY_CODES.get(g.get("recovery_action")))
        if field == 230 and failed is not None:
            v.nvmlReturn = _error_code(failed)
        elif field == 230 and code is not None:
            v.valueType, v.value.uiVal = 1, code  # NVML_VALUE_TYPE_UNSIGNED_INT
        elif field == 91 and g.get("nvlink_count") is not None:  # NVML_FI_DEV_NVLINK_LINK_COUNT
            v.valueType, v.value.uiVal = 1, g["nvlink_count"]
        else:
            v.nvmlReturn = 3
    return values

class _Memory:
    def __init__(self, total):
        self.total, self.free, self.used = total, total, 0

nvmlDeviceGetName = lambda h: _fact(h, "name")
nvmlDeviceGetUUID = lambda h: _fact(h, "uuid")
nvmlDeviceGetSerial = lambda h: _fact(h, "serial")
nvmlDeviceGetVbiosVersion = lambda h: _fact(h, "vbios")
nvmlDeviceGetInforomImageVersion = lambda h: _given(h, "inforom_image")

def nvmlDeviceValidateInforom(h):
    # As nvidia-ml-py: None when the checksums hold; "inforom_valid" false: NVML_ERROR_CORRUPTED_INFOROM.
    if not _given(h, "inforom_valid"):
        raise NVMLError_CorruptedInforom("Corrupted infoROM")
nvmlDeviceGetPersistenceMode = lambda h: int(_fact(h, "persistence_mode"))
nvmlDeviceGetMigMode = lambda h: [int(_fact(h, "mig_mode")), int(_fact(h, "mig_mode"))]
nvmlDeviceGetComputeMode = lambda h: {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}[_given(h, "compute_mode")]
nvmlDeviceGetMemoryInfo = lambda h: _Memory(_fact(h, "memory_total_bytes"))
nvmlDeviceGetEccMode = lambda h: [int(_fact(h, "ecc_mode")), int(_fact(h, "ecc_mode"))]
nvmlDeviceGetDefaultEccMode = lambda h: [int(_given(h, "ecc_default"))]  # nvidia-ml-py: [state]


def nvmlDeviceGetP2PStatus(h1, h2, index):
    # The file's p2p_read of GPU h1 for h2's bus id (index READ only); not listed: NVML's "not supported".
    for h in (h1, h2):
        if h in LOST:
            raise NVMLError_GpuIsLost(LOST[h]["error"])
    said = (DEVICES[h1].get("p2p_read") or {}).get(DEVICES[h2]["pci_bus_id"])
    if index != 0 or said is None:
        raise NVMLError_NotSupported("Not Supported")
    return ["ok", "chipset_not_supported", "gpu_not_supported", "topology_not_supported", "disabled_by_regkey", "not_supported", "unknown"].index(said)

nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: _fact(
    h, "ecc_uncorrectable_volatile" if counter == 0 else "ecc_uncorrectable_aggregate")
nvmlDeviceGetRetiredPagesPendingStatus = lambda h: int(_fact(h, "retired_pages_pending"))
nvmlDeviceGetRemappedRows = lambda h: tuple(
    int(_fact(h, "remapped_rows")[k]) for k in ("correctable", "uncorrectable", "pending", "failure"))
def nvmlDeviceGetCurrentClocksEventReasons(h):
    READINGS[h] = READINGS.get(h, 0) + 1
    transient = (DEVICES[h].get("clocks_events_transient") or []) if READINGS[h] == 1 else []
    return sum(BITS[n] for n in set(_fact(h, "clocks_events")) | set(transient))
nvmlDeviceGetEnforcedPowerLimit = lambda h: int(_fact(h, "power_limit_w") * 1000)
nvmlDeviceGetPowerManagementDefaultLimit = lambda h: int(_fact(h, "power_default_limit_w") * 1000)
nvmlDeviceGetTemperature = lambda h, sensor: _fact(h, "temperature_c")
# The burn-in's sampler (nvml_query._samples): a fixed SM clock and power where the facts name none.
nvmlDeviceGetClockInfo = lambda h, clock: DEVICES[h].get("sm_clock_mhz", 1980) if _fact(h, "name") else None
nvmlDeviceGetMaxClockInfo = lambda h, clock: DEVICES[h].get("max_sm_clock_mhz", 1980) if _fact(h, "name") else None
nvmlDeviceGetPowerUsage = lambda h: int(DEVICES[h].get("power_w", 650.0) * 1000) if _fact(h, "name") else None
nvmlDeviceGetCurrPcieLinkGeneration = lambda h: _fact(h, "pcie", "gen")
nvmlDeviceGetCurrPcieLinkWidth = lambda h: _fact(h, "pcie", "width")
nvmlDeviceGetMaxPcieLinkGeneration = lambda h: _fact(h, "pcie", "gen_max")
nvmlDeviceGetMaxPcieLinkWidth = lambda h: _fact(h, "pcie", "width_max")

class _Proc:
    def __init__(self, p):
        self.pid, self.usedGpuMemory = p["pid"], p.get("used_memory_bytes")

def nvmlDeviceGetComputeRunningProcesses(h):
    if h in DEVICES and DEVICES[h].get("processes") is None:
        raise NVMLError_NotSupported("Not Supported")
    return [_Proc(p) for p in _fact(h, "processes")]

def nvmlDeviceGetComputeRunningProcesses_v2(h):  # the older struct an older driver answers
    if h in DEVICES and DEVICES[h].get("processes") is None:
        raise NVMLError_NotSupported("Not Supported")
    return [_Proc(p) for p in _fact(h, "processes")]

def _links(h):
    # Every link's state (1 active, 0 inactive) by index.
    active, down = _fact(h, "nvlinks_active"), DEVICES[h]["nvlinks_down"]
    if not active and not down:
        return [0] * 18  # no NVLink partner: every link answers "inactive"
    return [0 if link in down else 1 for link in range(active + len(down))]

def nvmlDeviceGetNvLinkState(h, link):
    links = _links(h)
    if link >= len(links):
        raise NVMLError_InvalidArgument("Invalid Argument")
    return links[link]

if any(g.get("nvlink_remote") for g in DEVICES.values()):
    CODES = {"gpu": 0, "ibmnpu": 1, "switch": 2, "unknown": 0xFF}

    def nvmlDeviceGetNvLinkRemoteDeviceType(h, link):
        # The active links in order take the kinds the facts count, in the order they list them.
        kinds = [CODES[k] for k, n in (DEVICES[h].get("nvlink_remote") or {}).items() for _ in range(n)]
        active = [i for i, s in enumerate(_links(h)) if s]
        if link not in active or active.index(link) >= len(kinds):
            raise NVMLError_NotSupported("Not Supported")
        return kinds[active.index(link)]

# Where each GPU sits (cpu_affinity a CPU list, numa_affinity node numbers), served as
# NVML's masks of 64-bit words; nvmlDeviceGetNvLinkRemotePciInfo exists only where some
# GPU has nvlink_peers: its active links ending at a GPU take those bus ids, in order.
def _mask(items, words):
    bits = [int(x) for x in items] if isinstance(items, list) else [
        n for part in items.split(",") for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
    return [sum(1 << (b - 64 * w) for b in bits if b // 64 == w) for w in range(words)]

nvmlDeviceGetCpuAffinityWithinScope = lambda h, words, scope: _mask(_given(h, "cpu_affinity"), words)
nvmlDeviceGetMemoryAffinity = lambda h, words, scope: _mask(_given(h, "numa_affinity"), words)
nvmlDeviceGetNumaNodeId = lambda h: _given(h, "gpu_numa_id")

if any(g.get("nvlink_peers") for g in DEVICES.values()):
    def nvmlDeviceGetNvLinkRemotePciInfo(h, link):
        far = [bus for bus, n in (DEVICES[h].get("nvlink_peers") or {}).items() for _ in range(n)]
        kinds = [k for k, n in (DEVICES[h].get("nvlink_remote") or {}).items() for _ in range(n)]
        active = [i for i, s in enumerate(_links(h)) if s]
        to_gpu = [i for k, i in zip(kinds, active) if k == "gpu"]
        if link not in to_gpu or to_gpu.index(link) >= len(far):
            raise NVMLError_NotSupported("Not Supported")
        return _Pci(far[to_gpu.index(link)], None)


def _answering(name, f):
    # A call the facts list under "unanswered" fails with NVML's "Unknown Error".
    def call(h, *args):
        failed = DEVICES.get(h, {}).get("unanswered", {})
        if name in failed:
            raise NVMLError_Unknown(failed[name])
        if FAILING is not None and name in CALLS.split(","):
            raise FAILING
        return f(h, *args)
    return call

for _n in [n for n in list(globals()) if n.startswith("nvmlDeviceGet") and n not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")]:
    globals()[_n] = _answering(_n, globals()[_n])
"""


def nvml_readings(monkeypatch, *readings) -> list[float]:
    """readers/nvml.inventory for real NVML answers ``readings`` (Inventory objects) in turn, the
    last one thereafter: a node whose state moves between reads, such as a fabric still
    registering its GPUs. Returns the timeouts the reads were given, one per read."""
    from preflight.readers.nvidia import nvml

    asked: list[float] = []
    real = nvml.inventory

    def inventory(fake=None, timeout: float = 20.0, started=None):
        if fake is not None:
            return real(fake, timeout)
        if started is not None:
            started.stop()  # this machine's own NVML, begun ahead of the plan: these readings stand for it
        asked.append(timeout)
        return readings[min(len(asked), len(readings)) - 1]
    monkeypatch.setattr(nvml, "inventory", inventory)
    return asked


def install_fake_pynvml(root: Path) -> Path:
    """Write the fake `pynvml` into ``root``; put ``root`` first on PYTHONPATH to use it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pynvml.py").write_text(FAKE_PYNVML)
    return root


def install_plugin(root: Path, broken: bool = True) -> Path:
    """Write a dist-info that registers the fakes under ``preflight.checks``.

    With ``broken``, also one entry point whose module does not import and one
    registered under the wrong name. Returns the directory to put on sys.path.
    """
    dist = root / "preflight_fakes-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: preflight-fakes\nVersion: 0.0\n")
    lines = [f"{cls.name} = fakes:{cls.__name__}" for cls in FAKES]
    if broken:
        lines += ["broken = fakes_missing_module:Nothing", "misnamed = fakes:Misnamed"]
    (dist / "entry_points.txt").write_text("[preflight.checks]\n" + "\n".join(lines) + "\n")
    return root


def write_profile(directory: Path, name: str, checks: list[str], extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\ndescription = "test profile"\n'
        f"checks = {checks!r}\n".replace("'", '"') + extra
    )
    return path


def plugin_env(root: Path) -> dict[str, str]:
    """Environment for a real `preflight` subprocess that sees the fakes (the test's
    PREFLIGHT_REPORT kept: a run writes there, not the real default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_") or k == "PREFLIGHT_REPORT"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(HERE), env.get("PYTHONPATH", "")])
    env["PREFLIGHT_PROFILES_DIR"] = str(root / "profiles")
    env["PREFLIGHT_LOCK_FILE"] = str(root / "preflight.lock")
    return env


PREFLIGHT = [sys.executable, "-m", "preflight"]


def nvidia_smi(directory: Path, capture: Path | None = None, exit_code: int = 0, message: str = "", hang: bool = False) -> Path:
    """An `nvidia-smi` on a PATH of its own: prints ``capture`` for `topo -m`,
    or fails with ``message``, or hangs, as a wedged driver makes it."""
    directory.mkdir(parents=True, exist_ok=True)
    body = ["#!/bin/sh", '[ "$1 $2" = "topo -m" ] || { echo "fake nvidia-smi: only topo -m" >&2; exit 64; }']
    if hang:
        body.append("sleep 600")
    if capture is not None:
        body.append(f"cat '{capture}'")
    if message:
        body.append(f"echo {shlex.quote(message)}")
    body.append(f"exit {exit_code}")
    exe = directory / "nvidia-smi"
    exe.write_text("\n".join(body) + "\n")
    exe.chmod(0o755)
    return directory


class _KubeHandler(BaseHTTPRequestHandler):
    server: _KubeServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.fake._answer(self, None)

    def do_PATCH(self) -> None:  # noqa: N802
        self.server.fake._answer(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _KubeServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeKubeApi


class FakeKubeApi:
    """A Kubernetes API server for one resource, on 127.0.0.1: GET and PATCH /api/v1/nodes/NAME,
    and GET /api/v1/nodes (the NodeList, every node in ``nodes``).

    ``nodes`` holds Node objects as the API serves them. A PATCH is recorded
    (content type, body) and applied as the real server applies a strategic
    merge patch to a Node: labels and annotations merge (null deletes), spec.taints is an
    atomic list and is replaced whole, a resourceVersion in the patch that is
    not the node's is refused with 409, and every write bumps it.
    ``fail = 403`` answers everything with that status (its Status message is
    the real one), ``conflicts = N`` refuses the next N PATCHes with 409 as if
    another writer got in first, ``stall = S`` answers after S seconds, ``list_fail = 403``
    refuses the node list alone (a ClusterRole without nodes: list).
    With ``tls=(cert, key)`` it serves HTTPS.
    """

    def __init__(self, nodes: dict[str, dict[str, Any]], tls: tuple[Path, Path] | None = None):
        self.nodes = nodes
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self.fail: int | None = None
        self.list_fail: int | None = None
        self.conflicts = 0
        self.stall = 0.0
        self._lock = threading.Lock()
        self.server = _KubeServer(("127.0.0.1", 0), _KubeHandler)
        self.server.fake = self
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeKubeApi:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, method: str, node: str | None = None) -> int:
        """Requests of ``method``; with ``node``, of that node's own path only (not the list)."""
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and (node is None or p.split("?")[0] == f"/api/v1/nodes/{node}"))

    def _answer(self, h: BaseHTTPRequestHandler, body: bytes | None) -> None:
        time.sleep(self.stall)
        path = h.path.split("?")[0]
        name = None if path == "/api/v1/nodes" else path.removeprefix("/api/v1/nodes/")
        with self._lock:
            self.requests.append((h.command, h.path, h.headers.get("Authorization")))
            code, answer = self._handle(h.command, name, h.headers.get("Content-Type"), body)
        data = json.dumps(answer).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, method: str, name: str | None, ctype: str | None, body: bytes | None) -> tuple[int, dict[str, Any]]:
        verb = method.lower() if name is not None else "list"
        fail = self.fail or (self.list_fail if name is None else None)
        if fail:
            what = f'nodes "{name}"' if name is not None else "nodes"
            return fail, _status(fail, f'{what} is forbidden: User "system:serviceaccount:preflight:preflight" cannot {verb} resource "nodes" in API group "" at the cluster scope')
        if name is None and body is None:
            return 200, {"kind": "NodeList", "apiVersion": "v1", "items": list(self.nodes.values())}
        if name not in self.nodes:
            return 404, _status(404, f'nodes "{name}" not found')
        node = self.nodes[name]
        if body is None:
            return 200, node
        patch = json.loads(body)
        self.patches.append((ctype or "", patch))
        if ctype != "application/strategic-merge-patch+json":
            return 415, _status(415, f"the body of the request was in an unknown format - accepted media types include: application/strategic-merge-patch+json (not {ctype})")
        meta = patch.get("metadata", {})
        if self.conflicts or meta.get("resourceVersion") not in (None, node["metadata"]["resourceVersion"]):
            self.conflicts = max(0, self.conflicts - 1)
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
            return 409, _status(409, f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; please apply your changes to the latest version and try again')
        for kind in ("labels", "annotations"):  # both merge as the API server merges them: null deletes
            held = node["metadata"].setdefault(kind, {})
            for key, value in meta.get(kind, {}).items():
                if value is None:
                    held.pop(key, None)
                else:
                    held[key] = value
        if "taints" in patch.get("spec", {}):
            node.setdefault("spec", {})["taints"] = patch["spec"]["taints"]
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
        return 200, node


def _status(code: int, message: str) -> dict[str, Any]:
    reason = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 415: "UnsupportedMediaType"}.get(code, "Unknown")
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}


def scontrol(directory: Path, show: str, log: Path, exit_code: int = 0, message: str = "", hang: bool = False, sinfo: str = "") -> Path:
    """A Slurm `scontrol` on a PATH of its own: records every call's arguments
    (one JSON list per line in ``log``), prints ``show`` for `show node NAME`,
    and exits ``exit_code`` with ``message`` on stderr, or hangs as it does
    when slurmctld does not answer. Beside it an `sinfo` that prints ``sinfo``
    (the cap's count) and records its calls in sinfo.log beside ``log``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sinfo").write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(log.parent / 'sinfo.log')!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write({sinfo!r})\n"
    )
    (directory / "sinfo").chmod(0o755)
    exe = directory / "scontrol"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import json, sys, time\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if {hang!r}:\n"
        "    time.sleep(600)\n"
        f"if {exit_code!r}:\n"
        f"    sys.stderr.write({message!r} + '\\n')\n"
        f"    sys.exit({exit_code!r})\n"
        "if sys.argv[1:3] == ['show', 'node']:\n"
        f"    sys.stdout.write({show!r})\n"
    )
    exe.chmod(0o755)
    return directory


def pairwise_node(directory: Path, behaviour: dict[str, dict[str, Any]], log: Path) -> Path:
    """`fake-node HOST ARGV...` on a PATH of its own, the exec template of
    `preflight pairwise` (`ssh HOST` and the remote `preflight run` in one):
    records every call's arguments (one JSON list per line in ``log``) and
    acts as ``behaviour[HOST]`` says:
      {"report": {...}, "exit": N}   prints the report as JSON on stdout, exits N (default 0);
                                     with "banner": a line on stdout before it, as a login script may
      {"say": "...", "exit": N}      prints ``say`` on stderr, exits N, no JSON
      {"hang": true}                 says it is waiting, then never answers, with a child
                                     that carries this script's path in its arguments
      {"stubborn": true}             hangs like "hang", and ignores SIGTERM
    """
    directory.mkdir(parents=True, exist_ok=True)
    plan = directory / "behaviour.json"
    plan.write_text(json.dumps(behaviour))
    exe = directory / "fake-node"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import json, signal, subprocess, sys, time\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"act = json.load(open({str(plan)!r}))[sys.argv[1]]\n"
        "if act.get('hang') or act.get('stubborn'):\n"
        "    if act.get('stubborn'):\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[0]])\n"
        "    print('waiting for the rendezvous', file=sys.stderr, flush=True)\n"
        "    time.sleep(600)\n"
        "if 'say' in act:\n"
        "    print(act['say'], file=sys.stderr)\n"
        "if 'banner' in act:\n"
        "    print(act['banner'])\n"
        "if 'report' in act:\n"
        "    print(json.dumps(act['report'], indent=2))\n"
        "sys.exit(act.get('exit', 0))\n"
    )
    exe.chmod(0o755)
    return directory


# `cat /proc/driver/nvidia/version` as the two module flavours print it (public captures).
NVIDIA_OPEN_VERSION = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release Build  (dvs-builder@U22-I3-H04-03-1)  Sat Sep 20 00:47:16 UTC 2025\n"
NVIDIA_PROPRIETARY_VERSION = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Thu Apr  3 01:14:19 UTC 2025\n"


def rdma_host(root: Path, ports: dict[str, dict[int, str]] | None = None, modules: tuple[str, ...] = (),
              memory_peers: bool = False, osrelease: str | None = None, nvidia_version: str | None = None) -> Path:
    """A host root for preflight.readers.nccl.nccl_net.gather: /sys/class/infiniband/<dev>/ports/<n>/state
    (``{"mlx5_0": {1: "4: ACTIVE"}}``, the kernel's own wording), /sys/module/<name> for each
    loaded module, nv_peer_mem's /sys/kernel/mm/memory_peers/nv_mem/version,
    /proc/sys/kernel/osrelease and /proc/driver/nvidia/version."""
    (root / "sys/class/infiniband").mkdir(parents=True, exist_ok=True)
    for dev, states in (ports or {}).items():
        for port, state in states.items():
            (root / f"sys/class/infiniband/{dev}/ports/{port}").mkdir(parents=True)
            (root / f"sys/class/infiniband/{dev}/ports/{port}/state").write_text(state + "\n")
    for name in modules:
        (root / f"sys/module/{name}").mkdir(parents=True)
    if memory_peers:
        (root / "sys/kernel/mm/memory_peers/nv_mem").mkdir(parents=True)
        (root / "sys/kernel/mm/memory_peers/nv_mem/version").write_text("")  # NCCL checks only that it exists
    if osrelease is not None:
        (root / "proc/sys/kernel").mkdir(parents=True)
        (root / "proc/sys/kernel/osrelease").write_text(osrelease + "\n")
    if nvidia_version is not None:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text(nvidia_version)
    return root


def systemctl(directory: Path, answer: str = "active", exit_code: int = 0, message: str = "", hang: bool = False) -> Path:
    """A `systemctl` on a PATH of its own, as `systemctl is-active UNIT` answers:
    prints ``answer`` and exits ``exit_code`` (systemd: 0 active, 3 inactive or
    failed); with ``message``, prints nothing and says it on stderr, exit 1, as
    in a container without systemd; or hangs, as a stuck D-Bus makes it."""
    directory.mkdir(parents=True, exist_ok=True)
    body = ["#!/bin/sh", '[ "$1" = "is-active" ] || { echo "fake systemctl: only is-active" >&2; exit 64; }']
    if hang:
        body.append("sleep 600")
    if message:
        body += [f"echo {shlex.quote(message)} >&2", "exit 1"]
    body += [f"echo {shlex.quote(answer)}", f"exit {exit_code}"]
    exe = directory / "systemctl"
    exe.write_text("\n".join(body) + "\n")
    exe.chmod(0o755)
    return directory


# What a tool's stand-in prints in the bad-input tests: nothing at all, words no reader knows,
# and an executable's bytes (NULs, invalid UTF-8, stray escapes) where text belongs.
BAD_OUTPUT = {
    "nothing": b"",
    "garbage": b"Segmentation fault? ]]] [4m [ 0x7f } lorem ipsum\n\tcolumn\tsoup\t\t\n",
    "binary": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) + b"\x1b[31m\xff\xfe\n",
}


def tool(directory: Path, name: str, prints: bytes | Path = b"", exit_code: int = 0, hang: bool = False) -> Path:
    """A stand-in ``name`` on a PATH of its own, whatever its arguments: prints ``prints``
    (bytes, or a file's bytes exactly) and exits ``exit_code``; or hangs past any deadline."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}.out"
    out.write_bytes(prints.read_bytes() if isinstance(prints, Path) else prints)
    body = ["#!/bin/sh", "sleep 600" if hang else "", f"cat '{out}'", f"exit {exit_code}"]
    exe = directory / name
    exe.write_text("\n".join(body) + "\n")
    exe.chmod(0o755)
    return directory


# ---- torch on N GPUs, for the bandwidth worker's copy steps -----------------------------------
# It stands where no multi-GPU machine can be had: this machine has no GPU and the GPU kit
# one, so no pair of GPUs. It answers only what checks/workers/bandwidth.py's Bench calls in
# its copy steps (p2p, h2d, d2h), as torch does, and records each call in `log` so a test can
# hold the step's plan to the code: which process opens a context on which GPU, when buffers
# are made, on which GPU's stream each copy and its events run, where the barriers fall. Time
# is simulated: a copy adds its bytes over `rate(src, dst)` to the clock of the GPU whose
# stream runs it, and an event reads that clock, so the figures come out of the rates given.


class FakeDevice:
    def __init__(self, kind: str, index: int | None = None):
        self.type, self.index = kind, index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeDevice) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


class FakeTensor:
    def __init__(self, torch: FakeTorch, n: int, device: FakeDevice, pinned: bool = False):
        self._torch, self._n, self.device, self.pinned = torch, n, device, pinned

    def numel(self) -> int:
        return self._n

    def uniform_(self, lo: float, hi: float) -> FakeTensor:
        return self

    def zero_(self) -> FakeTensor:
        return self

    def copy_(self, src: FakeTensor, non_blocking: bool = False) -> FakeTensor:
        assert src.numel() == self._n, "a copy between buffers of different sizes"
        self._torch._copy(src, self)
        return self


class FakeEvent:
    def __init__(self, torch: FakeTorch, enable_timing: bool = False):
        self._torch, self.device, self.at = torch, None, None

    def record(self) -> None:
        self.device = self._torch.cuda.current
        self._torch._touch(self.device)
        self.at = self._torch.clock[self.device]
        self._torch.log.append(("event", self.device))

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        assert end.device == self.device, "events of two GPUs: CUDA refuses elapsed_time between them"
        return (end.at - self.at) * 1e3


class _FakeCudaDevice:
    def __init__(self, cuda: _FakeCuda, index: int):
        self._cuda, self._index, self._before = cuda, index, None

    def __enter__(self) -> None:
        self._before, self._cuda.current = self._cuda.current, self._index
        self._cuda._torch._touch(self._index)

    def __exit__(self, *exc: object) -> None:
        self._cuda.current = self._before


class _FakeCuda:
    def __init__(self, torch: FakeTorch, gpus: int, current: int, free: int, no_access: set[tuple[int, int]]):
        self._torch, self._gpus, self.current, self._free, self._no_access = torch, gpus, current, free, no_access

    def device_count(self) -> int:
        return self._gpus

    def device(self, d: FakeDevice | int) -> _FakeCudaDevice:
        return _FakeCudaDevice(self, _index(d))

    def mem_get_info(self, d: FakeDevice | int) -> tuple[int, int]:
        self._torch._touch(_index(d))
        return self._free, 80 << 30

    def get_device_properties(self, d: FakeDevice | int) -> Any:
        from types import SimpleNamespace

        i = _index(d)
        return SimpleNamespace(name="Fake GPU", L2_cache_size=50 << 20, pci_domain_id=0, pci_bus_id=0x18 + i, pci_device_id=0)

    def can_device_access_peer(self, a: int, b: int) -> bool:
        return (a, b) not in self._no_access

    def synchronize(self, d: FakeDevice | int | None = None) -> None:
        self._torch._touch(self.current if d is None else _index(d))

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 - torch's name
        return FakeEvent(self._torch, enable_timing)

    def empty_cache(self) -> None:
        self._torch.log.append(("empty_cache",))


def _index(d: FakeDevice | int) -> int:
    return d if isinstance(d, int) else d.index  # type: ignore[return-value]


class FakeTorch:
    """torch (and torch.cuda) for one process on ``gpus`` GPUs, its current device ``current``."""

    float32, float64 = "float32", "float64"

    def __init__(self, gpus: int, current: int = 0, rate=lambda src, dst: 100e9, free: int = 79 << 30, no_access: set[tuple[int, int]] = frozenset()):
        from collections import defaultdict

        self.log: list[tuple] = []
        self.rate = rate  # bytes/s of a copy from src to dst ("host" for host memory)
        self.clock: dict[int, float] = defaultdict(float)  # seconds of work each GPU's stream has run
        self.contexts: set[int] = set()  # GPUs this process has opened a context on
        self.cuda = _FakeCuda(self, gpus, current, free, set(no_access))

    def device(self, kind: str, index: int | None = None) -> FakeDevice:
        return FakeDevice(kind, index)

    def empty(self, n: int, dtype: str | None = None, device: FakeDevice | None = None, pin_memory: bool = False) -> FakeTensor:
        device = device or FakeDevice("cpu")
        if device.type == "cuda":
            self._touch(device.index)
            self.log.append(("malloc", device.index, n * 4))
        elif pin_memory:
            self.log.append(("pin", n * 4))
        return FakeTensor(self, n, device, pin_memory)

    def ones(self, n: int, device: FakeDevice | None = None) -> FakeTensor:
        return self.empty(n, device=device)

    def _touch(self, gpu: int | None) -> None:
        """A CUDA call on a GPU opens this process's context there, the first time."""
        if gpu is not None and gpu not in self.contexts:
            self.contexts.add(gpu)
            self.log.append(("context", gpu))

    def _copy(self, src: FakeTensor, dst: FakeTensor) -> None:
        a, b = src.device.index, dst.device.index
        # torch runs a copy on the source GPU's current stream (a host copy: the GPU's).
        stream = a if src.device.type == "cuda" else b
        assert stream == self.cuda.current or stream is None, f"copy {a}->{b} issued with cuda:{self.cuda.current} current: its events would time another stream"
        self.log.append(("copy", a, b))
        self.clock[stream] += src.numel() * 4 / self.rate("host" if a is None else a, "host" if b is None else b)


class FakeDist:
    """torch.distributed for one rank: barriers counted, collectives answered at once."""

    class ReduceOp:
        MAX, MIN, SUM = "max", "min", "sum"

    def __init__(self, torch: FakeTorch):
        self._torch = torch

    def new_group(self, backend: str | None = None, timeout: Any = None) -> str:
        return "turns"

    def barrier(self, group: Any = None) -> None:
        self._torch.log.append(("barrier",))

    def all_reduce(self, t: Any, op: Any = None, async_op: bool = False) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(wait=lambda: None)

    all_gather_into_tensor = reduce_scatter_tensor = all_reduce
