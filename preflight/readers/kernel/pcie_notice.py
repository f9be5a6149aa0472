"""The kernel's PCIe bandwidth notices: "limited by ... link at ..." lines from
a kernel log (dmesg, journalctl, syslog, /dev/kmsg, or grep'd out of one).

The kernel prints them from drivers/pci/pci.c (__pcie_print_link_status):
when it enumerates a device (pcie_report_downtraining) and when a driver such
as mlx5_core asks (pcie_print_link_status). It compares the bandwidth of the
slowest link on the way to the root port (pcie_bandwidth_available: the
current link status of the device and of every bridge above it) with what the
device itself is capable of (its Link Capabilities), and prints

  "%u.%03u Gb/s available PCIe bandwidth, limited by %s x%d link at %s (capable of %u.%03u Gb/s with %s x%d link)"

where the first %s is the speed ("16.0 GT/s PCIe"; "16 GT/s" before ~5.3;
"Unknown" or "Unknown speed" when the link status is garbage) and the "at %s"
names the device whose link is the slowest ("<unknown>" if none). A driver's
request for a device at full bandwidth prints the short form
"%u.%03u Gb/s available PCIe bandwidth (%s x%d link)".

Each line is found by that wording wherever it sits, so any prefix works; the
prefix is not read. `pci 0000:04:00.0: [10de:2330] type 00 class 0x030200`
lines, where the capture has them, say what the device is.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from preflight.base import tooltext


_BDF = r"[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"  # VMD domains have 5 hex digits
_SPEED = r"(?:\d+(?:\.\d+)? GT/s(?: PCIe)?|Unknown(?: speed)?)"
_NOTICE = re.compile(
    r"(?:(?P<driver>[\w.-]+) )?(?P<dev>" + _BDF + r"): (?P<avail>\d+\.\d{3}) Gb/s available PCIe bandwidth"
    r"(?:, limited by (?P<speed>" + _SPEED + r") x(?P<width>\d+) link at (?P<at>" + _BDF + r"|<unknown>)"
    r" \(capable of (?P<cap>\d+\.\d{3}) Gb/s with (?P<cspeed>" + _SPEED + r") x(?P<cwidth>\d+) link\)"
    r"| \((?P<fspeed>" + _SPEED + r") x(?P<fwidth>\d+) link\))"
)
# The enumeration line: vendor:device and the class code (0x0302xx a 3D controller, 0x0200xx Ethernet, 0x0207xx InfiniBand).
_ENUM = re.compile(r"pci (?P<dev>" + _BDF + r"): \[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\] type \d+ class 0x(?P<cls>[0-9a-f]{6})")
_GTS = re.compile(r"(\d+(?:\.\d+)?) GT/s")
_LOOKS = re.compile(_BDF + r": \d+\.\d{3} Gb/s available PCIe bandwidth(?:, limited by | \()")
NVIDIA = "10de"
GENERATION = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}  # PCIe base spec: GT/s per lane per generation


class Link(BaseModel):
    speed: str | None  # "16.0 GT/s" as printed, without the kernel's " PCIe"; None where it printed Unknown
    gts: float | None
    width: int

    def __str__(self) -> str:
        return f"{self.speed or 'unknown speed'} x{self.width}"

    @property
    def generation(self) -> int | None:
        return GENERATION.get(self.gts) if self.gts else None


class Notice(BaseModel):
    """One notice, as the kernel printed it; ``line`` counts from 1."""

    line: int
    device: str  # "0000:04:00.0", lowercase
    driver: str | None  # who printed it: "pci" at enumeration, else the driver ("mlx5_core")
    available_gbps: float
    limited: bool  # False: the short form, the device gets all it is capable of
    link: Link  # the limiting link (limited), else the device's own
    capable_gbps: float
    capable: Link
    limited_at: str | None  # the device whose link is the slowest on the path; None: "<unknown>" or not limited
    raw: str


class Device(BaseModel):
    """What the enumeration line says of a device."""

    vendor: str
    device_id: str
    class_code: str  # "030200"

    def label(self) -> str | None:
        """"NVIDIA GPU", "NIC": what a person calls it, where the class says; None otherwise."""
        base = self.class_code[:4]
        if base in ("0300", "0302"):
            # Another vendor's VGA controller on a server is the BMC's (ASPEED): not a GPU a job uses.
            return "NVIDIA GPU" if self.vendor == NVIDIA else "VGA controller"
        if base in ("0200", "0207"):
            return "NIC"
        if base == "0604":
            return "PCIe bridge"
        return None


class PcieNotices(BaseModel):
    notices: list[Notice]
    devices: dict[str, Device] = {}  # address -> what its enumeration line says, where the capture has one
    lines: int = 0

    def latest(self) -> list[Notice]:
        """One notice per device, the last it printed (a device reset or hot-plugged prints again), in first-seen order."""
        last: dict[str, Notice] = {}
        for n in self.notices:
            last[n.device] = n
        return list(last.values())


def _link(speed: str, width: str) -> Link:
    m = _GTS.match(speed)
    return Link(speed=f"{m.group(1)} GT/s" if m else None, gts=float(m.group(1)) if m else None, width=int(width))


def parse(text: str) -> PcieNotices:
    """Every PCIe bandwidth notice in ``text``; never raises."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    notices: list[Notice] = []
    devices: dict[str, Device] = {}
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if "available PCIe bandwidth" in line and (m := _NOTICE.search(line)):
            limited = m["speed"] is not None
            link = _link(m["speed"], m["width"]) if limited else _link(m["fspeed"], m["fwidth"])
            at = m["at"] if limited and m["at"] != "<unknown>" else None
            notices.append(Notice(
                line=number, device=m["dev"].lower(), driver=m["driver"], available_gbps=float(m["avail"]), limited=limited,
                link=link, capable_gbps=float(m["cap"]) if limited else float(m["avail"]),
                capable=_link(m["cspeed"], m["cwidth"]) if limited else link,
                limited_at=at.lower() if at else None, raw=line.rstrip("\r")))
        elif "] type " in line and (e := _ENUM.search(line)):
            devices[e["dev"].lower()] = Device(vendor=e["vendor"], device_id=e["device"], class_code=e["cls"])
    return PcieNotices(notices=notices, devices=devices, lines=len(lines))


def looks_like(text: str) -> bool:
    """Whether ``text`` holds a PCIe bandwidth notice in its first 200 lines."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    return any(_LOOKS.search(line) for line in text.split("\n", 200)[:200] if "PCIe bandwidth" in line)
