"""Whether this process runs in a container, and how that is known.

It decides whose a fault is (preflight/base/actions.py): a 64 MiB /dev/shm or a tight
memory limit inside a container is what the container was started with (Docker's
--shm-size, a pod's emptyDir), the job's to fix; the same on the host is the node's.
Only marks the runtimes themselves leave count: a guess from cgroup paths or
hostnames would call a systemd service a container.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from preflight.base.host import Host

# (path under the root, what it says): files the runtimes create in every container.
_MARKS = (
    ("/.dockerenv", "Docker (/.dockerenv)"),
    ("/run/.containerenv", "Podman (/run/.containerenv)"),
)


# PROC_IPC_INIT_INO (include/linux/proc_ns.h, fixed since Linux 3.8): the inode of the initial,
# the host's, IPC namespace, which every namespace created later differs from.
INIT_IPC_INO = 0xEFFFFFFF


def host_ipc(host: Host) -> bool | None:
    """Whether this process shares the host's IPC namespace (docker --ipc=host, a pod's hostIPC);
    None where that cannot be read (a recorded tree holds no /proc/self/ns). Such a container's
    /dev/shm is the host's own (Docker, Podman and containerd mount it in): the node's to fix."""
    try:
        return os.stat(host.path("/proc/self/ns/ipc")).st_ino == INIT_IPC_INO
    except OSError:
        return None


def detect(host: Host) -> str | None:
    """How this process is known to be in a container, or None where nothing says so."""
    for path, said in _MARKS:
        if host.path(path).exists():
            return said
    if host.environ.get("KUBERNETES_SERVICE_HOST"):
        return "a Kubernetes pod (KUBERNETES_SERVICE_HOST is set)"
    # systemd's container interface: nspawn, LXC, podman and others set it in PID 1's environment,
    # which their processes inherit unless a shell drops it.
    if kind := host.environ.get("container", "").strip():
        return f"a {kind} container (container={kind} in the environment)"
    return None
