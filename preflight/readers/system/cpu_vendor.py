"""The host CPU's vendor, as x86 names it in /proc/cpuinfo (``vendor_id``): NCCL's default P2P
level depends on it (checkkit/nccl_settings.py). None on a CPU that names none (ARM) or where
/proc/cpuinfo cannot be read."""

from __future__ import annotations

from preflight.base.host import Host


def cpu_vendor(host: Host) -> str | None:
    try:
        with open(host.path("/proc/cpuinfo"), "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                if key.strip() == b"vendor_id":
                    return value.strip().decode("ascii", "replace") or None
    except OSError:
        pass
    return None
