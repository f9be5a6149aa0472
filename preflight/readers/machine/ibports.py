"""RDMA ports and what GPUDirect RDMA needs, read from sysfs and /proc.

Formats (Linux Documentation/ABI/stable/sysfs-class-infiniband): each port of
/sys/class/infiniband/<dev>/ports/<n>/ has `state` ("4: ACTIVE"; DOWN, INIT,
ARMED, ACTIVE, ACTIVE_DEFER), `phys_state` ("5: LinkUp"; Sleep, Polling,
Disabled...), `rate` ("400 Gb/sec (4X NDR)": active width x speed),
`link_layer` (InfiniBand or Ethernet) and `counters/`, the port's PMA
PortCounters (IBA spec) as decimal numbers.

The error counters are read twice, at least ``interval`` seconds apart: a
count since boot says little (a link that retrained once at power-on), one
that grows while we watch is a link failing now. The first read may be taken
as the run begins (``first_read``), so the interval runs beside other checks
and the second read waits only for what is left of it. Only the counters are
taken from that early read: a port's state and rate are judged from the second
read, and a port whose state or rate changed between the early read and the
check's turn (a boot gate runs while the subnet manager brings ports up), or
that was not listed then, gets a first read of the full interval then; the
other ports keep theirs, so a counter that grew on them since the run began
still counts (each port's ``interval_seconds`` says how long it was watched). ``wait``
is injected so a test can change the tree between the reads instead of sleeping.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from preflight.base.host import Host, read_stripped
from preflight.readers.nccl import nccl_env
from preflight.readers.nccl.nccl_net import MEMORY_PEERS, PEERMEM, dmabuf_possible
from preflight.readers.machine.pcie import bridges_above

# Counter -> its width in bits in the IBA PortCounters attribute: a counter
# stops at its ceiling (it does not wrap), and then cannot show growth.
ERROR_COUNTERS = {
    "symbol_error": 16,  # bit errors on the wire: a dirty or failing cable/transceiver
    "link_error_recovery": 8,  # the link retrained after errors
    "link_downed": 8,  # the link went down: a flap
    "port_rcv_errors": 16,  # malformed packets received
    "port_rcv_remote_physical_errors": 16,  # packets marked bad upstream
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "port_xmit_discards": 16,  # dropped on send: congestion or a stuck peer, not the cable
}


class Port(BaseModel):
    device: str
    port: int
    state: str | None = None  # "ACTIVE" (the name after "4: ")
    phys_state: str | None = None  # "LinkUp"
    rate: str | None = None  # as sysfs says it: "400 Gb/sec (4X NDR)"
    link_layer: str | None = None
    counters: dict[str, int] = {}  # the first read
    counters_later: dict[str, int] = {}  # the second read
    state_later: str | None = None
    rate_later: str | None = None
    # The state at the run's early read, where it differed at the check's turn and that read was dropped.
    state_early: str | None = None
    # Seconds between this port's two reads: more than RdmaFacts.interval_seconds where its early read
    # stood while another port's was taken again; None (recorded facts): the facts' interval.
    interval_seconds: float | None = None
    pci: str | None = None  # the device's PCI address
    near_gpu: bool | None = None  # shares a PCIe switch with a GPU; None: sysfs cannot tell

    @property
    def where(self) -> str:
        return f"{self.device} port {self.port}"

    @property
    def state_now(self) -> str | None:
        """The state the port is judged by: the second read's, where it gave one."""
        return self.state_later if self.state_later is not None else self.state

    @property
    def rate_now(self) -> str | None:
        return self.rate_later if self.rate_later is not None else self.rate

    @property
    def gbps(self) -> float | None:
        m = re.match(r"\s*([\d.]+)\s*Gb/sec", self.rate_now or "")
        return float(m[1]) if m else None


class RdmaFacts(BaseModel):
    ports: list[Port] = []
    unread: list[str] = []  # sysfs directories that could not be listed: their ports are not judged
    interval_seconds: float = 0.0  # how far apart the two reads were: the shortest of any port's
    first_read: str = "at the check's turn"  # when the first read was taken, and why an early one was dropped
    peermem: list[str] = []  # peer-memory modules loaded
    memory_peers: bool = False  # nv_mem registered with the RDMA core (MLNX_OFED's peer-memory API)
    kernel: str | None = None  # /proc/sys/kernel/osrelease
    driver: str | None = None  # /sys/module/nvidia/version
    nvidia_open: bool | None = None  # the open GPU kernel modules; None: no NVIDIA driver seen
    dmabuf_setting: tuple[str, str] | None = None  # NCCL_DMABUF_ENABLE's (value, where) as NCCL reads it
    ib_hca: tuple[str, str] | None = None  # NCCL_IB_HCA's (value, where): the devices NCCL is told to use
    roles_unknown: str | None = None  # why the PCIe tree cannot tell a rail from a storage port (near_gpus)

    def dmabuf_capable(self) -> bool | None:
        return dmabuf_possible(self.kernel, self.nvidia_open)


def _name(text: str | None) -> str | None:
    """ "4: ACTIVE" -> "ACTIVE"."""
    return text.split(":", 1)[-1].strip() if text else None


def _counters(port: Path) -> dict[str, int]:
    out = {}
    for name in ERROR_COUNTERS:
        text = read_stripped(port / "counters" / name)
        if text is not None and text.isdigit():
            out[name] = int(text)
    return out


def _entries(host: Host, rel: str, unread: list[str]) -> list[Path]:
    """The entries of a sysfs directory; one that exists but cannot be listed (a
    container's masked /sys, a permission) is said in ``unread``, not raised."""
    path = host.path(rel)
    try:
        return sorted(path.iterdir(), key=lambda p: p.name) if path.is_dir() else []
    except OSError as e:
        unread.append(f"{rel} could not be listed ({e.strerror or e})")
        return []


def scan(host: Host) -> tuple[list[Port], list[str]]:
    """Every RDMA port, and the directories that could not be listed."""
    out: list[Port] = []
    unread: list[str] = []
    for dev in _entries(host, "/sys/class/infiniband", unread):
        # A port is a numbered directory; anything else under ports/ is not one.
        numbered = [p for p in _entries(host, f"/sys/class/infiniband/{dev.name}/ports", unread) if p.name.isdigit()]
        for p in sorted(numbered, key=lambda p: int(p.name)):
            out.append(Port(device=dev.name, port=int(p.name), state=_name(read_stripped(p / "state")), phys_state=_name(read_stripped(p / "phys_state")),
                            rate=read_stripped(p / "rate"), link_layer=read_stripped(p / "link_layer"), counters=_counters(p)))
    return out, unread


def read_ports(host: Host) -> list[Port]:
    return scan(host)[0]


@dataclass
class FirstRead:
    """The ports and their counters as first read, and when: time.monotonic() once the last
    counter was read, so every counter's second read comes at least the interval after its first."""
    ports: list[Port]
    unread: list[str]
    at: float


def first_read(host: Host) -> FirstRead:
    ports, unread = scan(host)
    return FirstRead(ports, unread, time.monotonic())


def _links(host: Host) -> tuple[dict[tuple[str, int], tuple[str | None, str | None]], list[str]]:
    """Each port's state and rate now, and the directories that could not be listed: the
    driver's cached attributes, no counter query to the adapter."""
    unread: list[str] = []
    out = {}
    for dev in _entries(host, "/sys/class/infiniband", unread):
        for p in _entries(host, f"/sys/class/infiniband/{dev.name}/ports", unread):
            if p.name.isdigit():
                out[(dev.name, int(p.name))] = (_name(read_stripped(p / "state")), read_stripped(p / "rate"))
    return out, unread


def _changed(first: FirstRead, host: Host) -> bool:
    """Whether anything moved since the early read: the ports listed (a driver that loaded or a
    port that went away), or any port's state or rate. Read from the driver's cached attributes."""
    now, unread = _links(host)
    return (unread != first.unread or set(now) != {(p.device, p.port) for p in first.ports}
            or any(now[(p.device, p.port)] != (p.state, p.rate) for p in first.ports))


def _kept(first: FirstRead, host: Host) -> tuple[list[Port], dict[tuple[str, int], float], list[str], list[str]]:
    """The ports listed now, each with its first read: the early one where its state and rate are
    as they were (its counters' growth since the run began counts), else one taken now; when
    each was taken; the directories that could not be listed now; what moved, port by port."""
    now = first_read(host)
    early = {(p.device, p.port): p for p in first.ports}
    ports, at, moved = [], {}, []
    for p in now.ports:
        key = (p.device, p.port)
        was = early.get(key)
        if was is not None and (was.state, was.rate) == (p.state, p.rate):
            ports.append(was.model_copy(deep=True))
            at[key] = first.at
            continue
        fresh = p.model_copy(deep=True)
        at[key] = now.at
        if was is None:
            moved.append(f"{p.where} listed")
        elif was.state != p.state:
            fresh.state_early = was.state
            moved.append(f"{p.where} {was.state} -> {p.state}")
        else:
            moved.append(f"{p.where} {was.rate} -> {p.rate}")
        ports.append(fresh)
    moved += [f"{p.where} gone" for key, p in early.items() if key not in at]
    return ports, at, now.unread, moved


def near_gpus(host: Host, ports: list[Port], gpus: list[str]) -> str | None:
    """Set each port's PCI address and whether it shares a PCIe switch with a GPU: both
    paths pass one bridge below the root port. That is a NIC NCCL pairs with a GPU for
    GPUDirect RDMA; one alone under its root port is storage or management. Where the GPUs
    are placed but no NIC shares a switch with one (GPUs on root ports of their own, as a
    switchless server or a Grace board has them; or NICs that all hang off root ports), the
    tree cannot tell a rail from a storage port: every port is left unknown, and the reason is
    returned (RdmaFacts.roles_unknown); None where it could tell, or no GPU was placed (a VM)."""
    paths = [p for p in (bridges_above(host, g) for g in gpus) if p]
    switched = [p for p in paths if len(p) >= 2]
    told = []
    for port in ports:
        try:
            port.pci = host.path(f"/sys/class/infiniband/{port.device}/device").resolve(strict=True).name
        except OSError:
            continue
        mine = bridges_above(host, port.pci)
        if mine is None or not paths:
            continue  # a VM, or no GPU placed: proximity cannot be told
        port.near_gpu = bool(switched) and len(mine) >= 2 and any(mine[:2] == g[:2] for g in switched)
        told.append(port)
    if not told or any(p.near_gpu for p in told):
        return None
    for port in told:
        port.near_gpu = None
    return "no GPU sits behind a PCIe switch" if not switched else "no NIC shares a PCIe switch with a GPU"


def _modules(host: Host) -> set[str]:
    text = read_stripped(host.path("/proc/modules")) or ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def gather(host: Host, interval: float, wait: Callable[[float], None] = time.sleep, gpus: list[str] | None = None,
           first: FirstRead | None = None, latest: float = math.inf) -> RdmaFacts:
    """``gpus``: the GPUs' PCI addresses, to tell the compute NICs (beside a GPU) from the rest.
    ``first``: the first read, taken earlier; where there is none it is taken now, and where a
    port's state or rate changed since (or it was not listed then) that port's is taken now,
    the others keeping theirs (``first_read`` in the facts says which). The second read comes
    ``interval`` after the latest first read, or at ``latest`` (time.monotonic()) where that is sooner."""
    early_at = first.at if first is not None else None  # when the early read was taken
    if first is None:
        first = first_read(host)
        ports = [p.model_copy(deep=True) for p in first.ports]
        at = {(p.device, p.port): first.at for p in ports}
        unread, said = list(first.unread), "at the check's turn"
    elif not _changed(first, host):
        ports = [p.model_copy(deep=True) for p in first.ports]
        at = {(p.device, p.port): first.at for p in ports}
        unread, said = list(first.unread), "as the run began"
    else:
        ports, at, unread, moved = _kept(first, host)
        said = (f"as the run began, but at the check's turn for the ports that moved since ({'; '.join(moved)} since the run began)"
                if moved else "as the run began")
    roles_unknown = near_gpus(host, ports, gpus or [])
    waited: dict[tuple[str, int], float] = {}
    if ports:
        started = time.monotonic()
        # A first read taken at this turn waits the whole interval; an early read what is left of it.
        before = {key: started - t if t == early_at else 0.0 for key, t in at.items()}
        left = max(0.0, min(interval - min(before.values()), latest - started))
        wait(left)
        # The clock, or the wait where a test's stands in for the sleep.
        after = time.monotonic()
        waited = {key: max(before[key] + left, after - t) for key, t in at.items()}
        later = {(p.device, p.port): p for p in read_ports(host)}
        for p in ports:
            key = (p.device, p.port)
            again = later.get(key)
            p.counters_later = again.counters if again else {}
            p.state_later = again.state if again else None
            p.rate_later = again.rate if again else None
            p.interval_seconds = round(waited[key], 3)
    loaded = _modules(host)
    version = read_stripped(host.path("/proc/driver/nvidia/version"))
    nccl = nccl_env.effective(nccl_env.read(host))
    setting = nccl.get("NCCL_DMABUF_ENABLE")
    return RdmaFacts(
        ports=ports, unread=unread, interval_seconds=round(min(waited.values(), default=0.0), 3), first_read=said,
        peermem=[m for m in PEERMEM if host.path(f"/sys/module/{m}").is_dir() or m in loaded],
        memory_peers=any(host.path(p).exists() for p in MEMORY_PEERS),
        kernel=read_stripped(host.path("/proc/sys/kernel/osrelease")),
        driver=read_stripped(host.path("/sys/module/nvidia/version")),
        nvidia_open=None if version is None else "Open Kernel Module" in version,
        dmabuf_setting=setting, ib_hca=nccl.get("NCCL_IB_HCA"), roles_unknown=roles_unknown)
