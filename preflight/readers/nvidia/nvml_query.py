"""The NVML query that runs in a child process (see preflight/readers/nvidia/nvml.py).

Standard library and pynvml only, so the child starts in a fraction of the
agent's import time; it prints one JSON line, facts or a cause and remedy,
and the parent validates it. Its queries: the inventory (nvml_inventory.py, with
nvml_topology.py), the PCIe reading alone, and the burn-in's samples (here).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from preflight.readers.nvidia.nvml_calls import as_text, optional
from preflight.readers.nvidia.nvml_inventory import CLOCKS_EVENTS, no_permission, read_inventory, read_pcie, read_reasons

NO_DRIVER = "install or load the NVIDIA driver (`nvidia-smi` must answer); on a machine with no GPU use --profile cpu for a dry run"
BROKEN = "look for Xid errors (`preflight xid`); reset the GPU (`nvidia-smi -r -i N`) or reboot, and drain the node until NVML answers"
NO_ACCESS = "run preflight as root, or give its user access to /dev/nvidia* (the video group on most distributions)"
MISMATCH = "reboot the node (or unload and reload the nvidia kernel modules) so the kernel module matches the installed driver"


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
        return {"facts": read_inventory(pynvml) if what == "inventory" else read_pcie(pynvml)}
    except pynvml.NVMLError as e:
        return _failed(f"NVML failed: {e}", BROKEN)
    except Exception as e:  # noqa: BLE001 - the parent must get its one JSON line, never a traceback
        return _failed(f"the NVML query failed unexpectedly: {type(e).__name__}: {e}", BROKEN)
    finally:
        pynvml.nvmlShutdown()


def _failed(cause: str, remedy: str) -> dict[str, Any]:
    return {"failed": {"cause": cause, "remedy": remedy}}


def _samples(pynvml: Any, period: float, most: float) -> dict[str, Any]:
    """Every GPU's SM clock, power, temperature and clocks-event reasons each ``period``
    seconds until stdin closes (the agent says the load is over) or ``most`` seconds pass;
    the volatile uncorrectable ECC count at the start and the end (checks/burnin.py)."""
    import select

    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as e:
            if no_permission(pynvml, e):
                continue  # not given to this run (a job's device cgroup), as the inventory reads it: not its burn
            raise
        gpus.append((h, {"index": i, "pci_bus_id": as_text(pynvml.nvmlDeviceGetPciInfo(h).busId), "samples": [], "unanswered": {},
                         "ecc_before": None, "ecc_after": None, "max_sm_clock_mhz": None}))
    for h, g in gpus:
        g["max_sm_clock_mhz"] = optional(pynvml, "nvmlDeviceGetMaxClockInfo", h, 1, unanswered=g["unanswered"])  # NVML_CLOCK_SM
        g["ecc_before"] = optional(pynvml, "nvmlDeviceGetTotalEccErrors", h, 1, 0, unanswered=g["unanswered"])  # UNCORRECTED, VOLATILE
    end = time.monotonic() + most
    while True:
        for h, g in gpus:
            u = g["unanswered"]
            power = optional(pynvml, "nvmlDeviceGetPowerUsage", h, unanswered=u)  # milliwatts
            g["samples"].append([round(time.time(), 3), optional(pynvml, "nvmlDeviceGetClockInfo", h, 1, unanswered=u),  # NVML_CLOCK_SM
                                 power / 1000 if power is not None else None, optional(pynvml, "nvmlDeviceGetTemperature", h, 0, unanswered=u),
                                 read_reasons(pynvml, h, u)])
        wait = min(period, end - time.monotonic())
        if wait <= 0 or select.select([sys.stdin], [], [], wait)[0]:  # readable: the agent closed it
            break
    for h, g in gpus:
        g["ecc_after"] = optional(pynvml, "nvmlDeviceGetTotalEccErrors", h, 1, 0, unanswered=g["unanswered"])
    return {"gpus": [g for _, g in gpus], "reasons": CLOCKS_EVENTS}


def _line(answer: dict[str, Any]) -> str:
    try:
        return json.dumps(answer)
    except (TypeError, ValueError) as e:  # a fact of a type JSON cannot hold: still one line the parent reads
        return json.dumps(_failed(f"NVML answered a fact preflight cannot write: {e}", BROKEN))


if __name__ == "__main__":
    # A wedged driver can hold this query for good: it must not outlive the agent that asked.
    from preflight.base.tether import EXIT_ORPHANED, die_with_parent

    # Its parent is the agent's spawner (tether.popen_tool), whose fork set the signal and checked
    # the agent before the exec; set again for a query started any other way.
    if not die_with_parent(os.getppid()):
        sys.exit(EXIT_ORPHANED)
    print(_line(_child(*(sys.argv[1:] or ["inventory"]))))
    sys.exit(0)
