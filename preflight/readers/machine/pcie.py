"""The PCIe paths of a node's GPUs and NICs, read from sysfs: the bridges on
each path, their ACS control register, their link state, and the IOMMU mode.

The resolved /sys/bus/pci/devices/<bdf> link names every bridge between the
device and its root bus (/sys/devices/pci0000:15/0000:15:01.0/.../0000:1b:00.0).
ACS lives in the PCIe extended configuration space (offset 0x100 up), which
the kernel shows only to root: without it the sysfs `config` file is 64 or
256 bytes long, and ACS is reported unread with that reason, never guessed.
As root, 256 bytes means the device has no extended space (a conventional
PCI bridge), so no ACS. `lspci -vvv` is the fallback where the config file
cannot be read at all; where lspci cannot run either, ACS stays unread.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
from pathlib import Path

from pydantic import BaseModel

from preflight.base import tooltext
from preflight.base.host import Host, read_stripped
from preflight.readers.machine.layout import BDF, PciLink, pci_link

ACS_ID = 0x000D  # PCIe extended capability ID of Access Control Services
PCIE_ID = 0x10  # capability ID of the PCI Express capability (in the first 256 bytes)
# Device/Port Type, bits 7:4 of the PCI Express Capabilities register (PCIe base spec 7.5.3.2).
PORT_TYPES = {0x4: "root", 0x5: "upstream", 0x6: "downstream", 0x7: "pcie-to-pci", 0x8: "pci-to-pcie"}
# ACS control bits (PCIe base spec, ACS Control Register), in lspci's words.
ACS_BITS = {"SrcValid": 0, "TransBlk": 1, "ReqRedir": 2, "CmpltRedir": 3, "UpstreamFwd": 4, "EgressCtrl": 5, "DirectTrans": 6}
LSPCI_TIMEOUT = 15.0


class Acs(BaseModel):
    cap: int  # ACS Capability register: what the port can do
    ctl: int  # ACS Control register: what is switched on
    source: str  # "config space" or "lspci"

    def on(self) -> list[str]:
        return [name for name, bit in ACS_BITS.items() if self.ctl >> bit & 1]


class Bridge(BaseModel):
    bdf: str
    link: PciLink | None = None
    acs: Acs | None = None  # None: no ACS capability, or unread (acs_unread says why)
    acs_unread: str | None = None
    no_acs: str | None = None  # why the port has no ACS capability at all, where sysfs shows it
    port_type: str | None = None  # PORT_TYPES' word; None where its config space was not readable


class Endpoint(BaseModel):
    kind: str  # "GPU" or "NIC"
    name: str  # the PCI address, or the NIC's RDMA/net device name
    bdf: str
    bridges: list[str] | None = None  # root port first; None: sysfs does not show where it sits
    iommu_group: str | None = None
    iommu_type: str | None = None  # sysfs iommu_groups/N/type: identity, DMA, DMA-FQ, ...
    rdma: bool = False  # an RDMA device (/sys/class/infiniband): GPUDirect RDMA can reach the GPUs through it

    def label(self) -> str:
        return f"{self.kind} {self.bdf}" if self.name == self.bdf else f"{self.kind} {self.name} ({self.bdf})"


class PcieFacts(BaseModel):
    gpus: list[Endpoint] = []
    nics: list[Endpoint] = []
    bridges: dict[str, Bridge] = {}
    cmdline: str | None = None
    iommu_units: list[str] = []  # /sys/class/iommu: the IOMMUs the kernel drives
    iommu_groups: int = 0
    lspci: str | None = None  # where `lspci -vvv` was asked for ACS (config space unreadable): why its output could not be used, or None


# ---- config space -----------------------------------------------------------------------


def ext_caps(config: bytes) -> dict[int, int]:
    """Extended capability ID -> offset, walking the list from 0x100."""
    found: dict[int, int] = {}
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 4 and offset not in seen:
        seen.add(offset)
        header = struct.unpack_from("<I", config, offset)[0]
        if header in (0, 0xFFFFFFFF):
            break
        found.setdefault(header & 0xFFFF, offset)
        offset = (header >> 20) & 0xFFC
    return found


def port_type(config: bytes) -> str | None:
    """The bridge's Device/Port Type from its PCI Express capability, walking the
    capability list from the pointer at 0x34; None where the list or capability is absent."""
    if len(config) < 0x40 or not struct.unpack_from("<H", config, 0x06)[0] & 0x10:  # Status: capability list present
        return None
    offset, seen = config[0x34] & 0xFC, set()
    while 0x40 <= offset <= len(config) - 4 and offset not in seen:
        seen.add(offset)
        if config[offset] == PCIE_ID:
            kind = (struct.unpack_from("<H", config, offset + 2)[0] >> 4) & 0xF
            return PORT_TYPES.get(kind, f"type {kind:#x}")
        offset = config[offset + 1] & 0xFC
    return None


def acs_from_config(config: bytes) -> Acs | None:
    at = ext_caps(config).get(ACS_ID)
    if at is None or at + 8 > len(config):
        return None
    cap, ctl = struct.unpack_from("<HH", config, at + 4)
    return Acs(cap=cap, ctl=ctl, source="config space")


# ---- lspci -vvv ----------------------------------------------------------------------------

_DEVICE = re.compile(r"^((?:[0-9a-f]{4,}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", re.I)


def _flags(text: str) -> int:
    value = 0
    for word in text.split():
        name, sign = word[:-1], word[-1:]
        if name in ACS_BITS and sign == "+":
            value |= 1 << ACS_BITS[name]
    return value


def parse_lspci(text: str) -> tuple[dict[str, Acs | None], set[str]]:
    """`lspci -vvv` -> (PCI address -> its ACS, None where it lists no ACS capability;
    the addresses whose capabilities lspci could not read, "<access denied>")."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    acs: dict[str, Acs | None] = {}
    denied: set[str] = set()
    current, cap = None, None
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m:
            current = m.group(1).lower()
            current = current if current.count(":") == 2 else f"0000:{current}"
            acs[current], cap = None, None
            continue
        if current is None:
            continue
        words = line.strip()
        if words.startswith("Capabilities: <access denied>"):
            denied.add(current)
        elif words.startswith("ACSCap:"):
            cap = _flags(words.split(":", 1)[1])
        elif words.startswith("ACSCtl:"):
            acs[current] = Acs(cap=cap or 0, ctl=_flags(words.split(":", 1)[1]), source="lspci")
    return acs, denied


# ---- sysfs -------------------------------------------------------------------------------


def bridges_above(host: Host, bdf: str) -> list[str] | None:
    """The bridges between a device and its root bus, root port first; None where the
    device's sysfs entry is not a link into /sys/devices (nothing to say where it sits)."""
    try:
        real = host.path(f"/sys/bus/pci/devices/{bdf}").resolve(strict=True)
        rel = real.relative_to(host.path("/sys/devices").resolve())
    except (OSError, ValueError):
        return None
    chain: list[str] = []
    for part in rel.parts[:-1]:
        # A component that is no PCI address is a root bus (pci0000:15, or a VMD domain
        # below an endpoint): the path the device's traffic takes starts again there.
        chain = chain + [part] if BDF.match(part) else []
    return chain


def _iommu(host: Host, bdf: str) -> tuple[str | None, str | None]:
    group = host.path(f"/sys/bus/pci/devices/{bdf}/iommu_group")
    try:
        name = group.resolve(strict=True).name
    except OSError:
        return None, None
    return name, read_stripped(host.path(f"/sys/kernel/iommu_groups/{name}/type"))


def _endpoint(host: Host, kind: str, name: str, bdf: str, rdma: bool = False) -> Endpoint:
    group, kind_of = _iommu(host, bdf)
    return Endpoint(kind=kind, name=name, bdf=bdf, bridges=bridges_above(host, bdf), iommu_group=group, iommu_type=kind_of, rdma=rdma)


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def nic_addresses(host: Host) -> dict[str, tuple[str, bool]]:
    """PCI address -> (name, whether it is an RDMA device) of every RDMA device and every
    network device with a PCI parent; an RDMA device keeps its RDMA name."""
    out: dict[str, tuple[str, bool]] = {}
    for cls in ("infiniband", "net"):
        for entry in _listdir(host.path(f"/sys/class/{cls}")):
            try:
                bdf = (entry / "device").resolve(strict=True).name
            except OSError:
                continue  # virtual: no device behind it
            if BDF.match(bdf):
                out.setdefault(bdf, (entry.name, cls == "infiniband"))
    return out


def read_config(host: Host, bdf: str) -> bytes | None:
    try:
        return host.path(f"/sys/bus/pci/devices/{bdf}/config").read_bytes()
    except OSError:
        return None


def _lspci(host: Host, deadline_s: float) -> tuple[dict[str, Acs | None], set[str]] | str:
    """What `lspci -vvv` says of ACS, or why it could not say."""
    exe = shutil.which("lspci", path=host.environ.get("PATH"))
    if exe is None:
        return "lspci unavailable (not on PATH)"
    timeout = max(1.0, min(LSPCI_TIMEOUT, deadline_s))
    try:
        done = host.run([exe, "-vvv", "-D"], timeout=timeout)
    except OSError as e:  # on PATH but not runnable: a broken install, a missing interpreter
        return f"lspci unavailable ({e.strerror or e})"
    if done.timed_out:
        return f"lspci did not answer within {timeout:.3g} s"
    if done.returncode != 0:
        return f"lspci exited {done.returncode}" + (f": {err[-1]}" if (err := done.stderr.strip().splitlines()) else "")
    listed = parse_lspci(done.stdout)
    if not listed[0]:
        # Every machine has PCI devices; a text naming none is not lspci's answer (garbage, a binary, nothing).
        return "lspci printed nothing" if not done.stdout.strip() else "lspci printed no PCI device (garbage, or not `lspci -vvv` output)"
    return listed


def read_bridge(host: Host, bdf: str, root: bool) -> Bridge:
    bridge = Bridge(bdf=bdf, link=pci_link(host.path(f"/sys/bus/pci/devices/{bdf}")))
    config = read_config(host, bdf)
    bridge.port_type = port_type(config) if config else None
    if config is None:
        bridge.acs_unread = "its sysfs config file could not be read"
    elif len(config) == 0x100 and root:
        # Root is shown all the config space there is: 256 bytes is a conventional PCI
        # bridge, which has no extended capabilities, so no ACS to switch on.
        bridge.no_acs = "256 bytes of config space read as root: no extended configuration space, so no ACS capability"
    elif len(config) <= 0x100:
        bridge.acs_unread = (f"only {len(config)} bytes of its config space are readable: the extended capabilities "
                             "(ACS among them) are shown to root only" if not root else
                             f"only {len(config)} bytes of its config space could be read, even as root")
    else:
        bridge.acs = acs_from_config(config)
    return bridge


def gather(host: Host, gpus: list[str], deadline_s: float = LSPCI_TIMEOUT, root: bool | None = None) -> PcieFacts:
    """The paths of ``gpus`` (PCI addresses) and of every NIC, with the bridges on them.
    ``root``: whether this run sees all of config space (default: running as root)."""
    root = os.geteuid() == 0 if root is None else root
    facts = PcieFacts(cmdline=read_stripped(host.path("/proc/cmdline")),
                      iommu_units=[p.name for p in _listdir(host.path("/sys/class/iommu"))],
                      iommu_groups=len(_listdir(host.path("/sys/kernel/iommu_groups"))))
    facts.gpus = [_endpoint(host, "GPU", bdf, bdf) for bdf in gpus]
    facts.nics = [_endpoint(host, "NIC", name, bdf, rdma) for bdf, (name, rdma) in sorted(nic_addresses(host).items()) if bdf not in gpus]
    for e in facts.gpus + facts.nics:
        for bdf in e.bridges or []:
            if bdf not in facts.bridges:
                facts.bridges[bdf] = read_bridge(host, bdf, root)
    unreadable = [b for b in facts.bridges.values() if b.acs_unread and "could not be read" in b.acs_unread]
    if unreadable:
        # No config file at all (a sandbox's /sys): lspci may still reach the bus another way.
        listed = _lspci(host, deadline_s)
        if isinstance(listed, str):
            facts.lspci = listed
        for b in unreadable:
            if isinstance(listed, str):
                b.acs_unread = f"{b.acs_unread}, and {listed}"
            elif b.bdf in listed[1]:
                b.acs_unread = f"{b.acs_unread}, and lspci could not read its capabilities (access denied)"
            elif b.bdf in listed[0]:
                b.acs, b.acs_unread = listed[0][b.bdf], None
            else:
                b.acs_unread = f"{b.acs_unread}, and lspci does not list it"
    return facts
