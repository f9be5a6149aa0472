"""The host CPU's vendor, as x86 names it in /proc/cpuinfo (``vendor_id``, spaces stripped: Zhaoxin's
is "  Shanghai  "), else "ARM" or "POWER" as their /proc/cpuinfo shows them: NCCL's default P2P level
depends on it (checkkit/nccl_settings.py). None where /proc/cpuinfo cannot be read or says neither."""

from __future__ import annotations

from preflight.base.host import Host


def cpu_vendor(host: Host) -> str | None:
    try:
        with open(host.path("/proc/cpuinfo"), "rb") as f:
            for line in f:
                key, _, value = line.partition(b":")
                key = key.strip()
                if key == b"vendor_id":
                    return value.strip().decode("ascii", "replace") or None
                if key == b"CPU implementer":
                    return "ARM"
                if key == b"cpu" and value.strip().startswith(b"POWER"):
                    return "POWER"
    except OSError:
        pass
    return None
