"""What memory the kernel and the memory cgroup would still give this process.

A tmpfs page is RAM or swap, never reclaimable cache, so /dev/shm is backed by
no more than /proc/meminfo's MemAvailable and the memory cgroup's headroom,
whatever the tmpfs's size says. These are the figures that say so at once.
"""

from __future__ import annotations

import re
from pathlib import Path

from preflight.base.host import Host

UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def meminfo(host: Host) -> dict[str, int]:
    """/proc/meminfo's kB figures in bytes; empty where it cannot be read."""
    found: dict[str, int] = {}
    try:
        for line in host.read_text("/proc/meminfo").splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def _inactive_file(level: Path, v2: bool) -> int:
    """The cgroup's inactive file cache (memory.stat), which the kernel reclaims first; 0 if unread."""
    want = "inactive_file" if v2 else "total_inactive_file"
    try:
        for line in (level / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == want:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def slurm_job(cgroup: Path) -> str | None:
    """The Slurm job whose cgroup ``cgroup`` is, or is under ("job_1234": slurmd's cgroup plugins
    name each job's directory so, v1 and v2 alike), or None. ``cgroup``: its path in the hierarchy
    (``cgroup_limit``'s), so no directory above the hierarchy's mount is read as a job's."""
    return next((part.removeprefix("job_") for part in cgroup.parts if re.fullmatch(r"job_[0-9]+", part)), None)


def cgroup_limit(host: Host) -> tuple[int, Path] | None:
    """(bytes this process's memory cgroup may still charge, the path in the hierarchy of the
    cgroup whose limit binds tightest: "/" its root); None if unlimited or unknown.

    Pages written to /dev/shm are charged to the writer's memory cgroup, and
    every ancestor's limit applies too, so the tightest level along the path
    from the leaf to the root bounds /dev/shm, whatever the tmpfs size says.
    The usage counted is the working set, as the kubelet counts it: the
    cgroup's inactive file cache is reclaimed before the OOM killer is called,
    so a container whose page cache filled its limit still has that room.
    """
    for v2, levels in host.cgroup_levels("memory"):
        limit_name, usage_name = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        tightest: tuple[int, Path] | None = None
        for level in levels:
            try:
                limit = (level / limit_name).read_text().strip()
                usage = int((level / usage_name).read_text().strip())
            except (OSError, ValueError):
                continue
            usage = max(0, usage - _inactive_file(level, v2))
            if limit != "max" and int(limit) < UNLIMITED:
                room = int(limit) - usage
                if tightest is None or room < tightest[0]:
                    tightest = (room, Path("/") / level.relative_to(levels[-1]))  # levels[-1]: the hierarchy's mount
        if tightest is not None:
            return tightest
    return None
