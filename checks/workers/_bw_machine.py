"""The bandwidth worker's look at the machine it runs on: pinning the rank to its
GPU's NUMA node (CPUs and preferred memory, as nvbandwidth and numactl do), the
last-level cache that sizes the buffer rotation, and the memory available on
the host. Apart from the bench because it reads and sets the host itself
(/proc, /sys, system calls), the binding before torch starts its threads; only
the GPU's cache size asks torch (passed in). Standard library only otherwise;
imported as ``_bw_machine`` from beside the workers.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform


def bind(spec: dict | None) -> dict | None:
    """Pin this process to the CPUs of its GPU's NUMA node and prefer that node's
    memory, as nvbandwidth and `numactl --cpunodebind=N --membind=N` do."""
    if not spec or not spec.get("cpus"):
        return None
    cpus = _cpulist(spec["cpus"])
    out = {"node": spec.get("node"), "cpus": spec["cpus"], "memory": None, "error": None}
    try:
        # Every thread of the process: in a launch shared by several stages torch's
        # threads already run, and a new thread inherits only its creator's mask.
        for tid in [int(t) for t in os.listdir("/proc/self/task")] or [0]:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass  # a thread that has just ended
    except OSError as e:
        out["error"] = f"sched_setaffinity({spec['cpus']}): {e.strerror}"
        return out
    if spec.get("node") is not None:
        out["memory"] = _prefer_node(int(spec["node"]))
    return out


# set_mempolicy(2) numbers; MPOL_PREFERRED spills to other nodes instead of failing when one is full.
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MPOL_PREFERRED = 1


def _prefer_node(node: int) -> str:
    nr = _SET_MEMPOLICY.get(platform.machine())
    if nr is None or node >= 64:
        return f"not set: no set_mempolicy number for {platform.machine()} here"
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << node)
    if libc.syscall(nr, _MPOL_PREFERRED, ctypes.byref(mask), ctypes.c_ulong(64)) != 0:
        return f"not set: set_mempolicy: {os.strerror(ctypes.get_errno())}"
    return f"preferred node {node}"


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def gpu_cache(torch, device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20)


def cpu_cache() -> int:
    """The largest cache of CPU 0 (the last level), from sysfs; 64 MiB where unknown."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 << 20)


def meminfo_value(key: str) -> int | None:
    try:
        for line in open("/proc/meminfo"):
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
