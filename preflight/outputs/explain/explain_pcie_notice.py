"""`preflight explain` of kernel PCIe bandwidth notices ("... Gb/s available PCIe
bandwidth, limited by 16.0 GT/s PCIe x16 link at ... (capable of ...)").

The kernel prints the notice when it enumerates a device (or when a driver
such as mlx5_core asks), comparing the slowest link on the way to the root
port with what the device itself can do. A GPU or NIC trained at Gen4 in a
Gen5 slot, or at x8 of x16, moves half its bandwidth to and from the host for
as long as the node is up. The line does not say whether the device is a GPU
or a NIC; the enumeration line (`[10de:2330] type 00 class 0x030200`) does,
where the capture holds it, else the device is named by its address alone.
"""

from __future__ import annotations

from preflight.base.errors import UsageError
from preflight.outputs.explain.explained import Explained, Item
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.kernel import pcie_notice
from preflight.readers.kernel.pcie_notice import Notice, PcieNotices

KIND, TITLE = "pcie-notice", "kernel PCIe bandwidth notices"
NO_NOTICE = ("holds no kernel PCIe bandwidth notice (\"... Gb/s available PCIe bandwidth, limited by ...\"); "
             "save `sudo dmesg | grep -i 'PCIe bandwidth'` (or `journalctl -k -b`) to a file and pass that")
FIX = ("reseat the card (and its riser or cable) in {where}; check the BIOS PCIe link speed setting for that slot "
       "(Auto or the top generation, not a fixed lower one); compare `sudo lspci -vv -s {dev}` LnkSta with LnkCap"
       "{at}; if it stays slow, move the card to another slot to tell the card from the slot")


def _share(available: float, capable: float) -> str:
    ratio = available / capable if capable else 0.0
    for part, words in ((0.5, "half"), (0.25, "a quarter of"), (0.125, "an eighth of")):
        if abs(ratio - part) < 0.01:
            return f"{words} the bandwidth"
    return f"{ratio:.0%} of the bandwidth"


def _cut(n: Notice) -> list[str]:
    """What is below capable: "16.0 of 32.0 GT/s", "x8 of x16"."""
    said = []
    if n.link.gts is not None and n.capable.gts is not None and n.link.gts < n.capable.gts:
        gen = f" (Gen{n.link.generation} of Gen{n.capable.generation})" if n.link.generation and n.capable.generation else ""
        said.append(f"{n.link.speed} of {n.capable.speed}{gen}")
    elif n.link.gts is None:
        said.append("a speed the kernel could not read")
    if n.link.width < n.capable.width:
        said.append(f"x{n.link.width} of x{n.capable.width}")
    return said


def name(n: Notice, facts: PcieNotices) -> str:
    """The device's address, with what it is where the capture says (its enumeration line, or the driver that printed)."""
    dev = facts.devices.get(n.device)
    what = dev.label() if dev else None
    if what is None and n.driver and n.driver != "pci":
        what = n.driver
    return f"{n.device} ({what})" if what else n.device


def severity(n: Notice, facts: PcieNotices) -> tuple[str, str]:
    """How much a limited link matters, and why: a GPU's or NIC's cut link fails; a cut
    only to Gen1 speed warns, since GPU drivers manage link power and a GPU probed idle
    can sit at 2.5 GT/s (the kernel stopped printing those for that reason, Helgaas 2019);
    another kind of device (storage, USB, the BMC's VGA) is information. A device the
    capture does not identify fails only where it is an x16 device (in a server, a GPU,
    NIC or accelerator) cut above Gen1; else it warns."""
    dev = facts.devices.get(n.device)
    what = dev.label() if dev else None
    nic_driver = n.driver not in (None, "pci")
    gen1_only = n.link.generation == 1 and n.link.width >= n.capable.width
    if what in ("VGA controller", "PCIe bridge") or (dev is not None and what is None):
        return "info", f"{what or 'the device'} is no GPU or NIC a job uses"
    if gen1_only:
        return "warn", ("a link at Gen1 speed alone may be link power management when the device was probed idle; "
                        "read LnkSta while it works (`sudo lspci -vv -s DEV`) before acting")
    if what in ("NVIDIA GPU", "NIC") or nic_driver:
        return "fail", ""
    if n.capable.width >= 16:
        return "fail", "the capture does not say what the device is, but an x16 device in a server is a GPU, NIC or accelerator"
    return "warn", "the capture does not say what the device is (no enumeration line): a fault if it is a GPU or NIC"


def judge(facts: PcieNotices) -> list[Item]:
    """Pure: one item per device, from the last notice it printed."""
    out = []
    for n in facts.latest():
        who = name(n, facts)
        if not n.limited:
            out.append(Item(severity="info", gpu=n.device,
                            summary=f"PCIe link at {n.link}: all {n.available_gbps:g} Gb/s the device is capable of",
                            cause=f"the kernel reports {who} at full bandwidth (line {n.line})"))
            continue
        share = _share(n.available_gbps, n.capable_gbps)
        cut = _cut(n) or [f"{n.available_gbps:g} of {n.capable_gbps:g} Gb/s"]
        at = n.limited_at or "an unnamed device"
        where = ("its own link" if n.limited_at == n.device else f"the link at {at} (above it)" if n.limited_at
                 else "a link the kernel did not name")
        level, why = severity(n, facts)
        out.append(Item(
            severity=level, gpu=n.device,
            summary=f"PCIe link at {n.link}, capable of {n.capable}: {share}",
            cause=(f"when the kernel enumerated {who} (line {n.line}), the slowest link on its path to the CPU, {where}, ran at "
                   f"{' and '.join(cut)}: {n.available_gbps:g} of {n.capable_gbps:g} Gb/s, the link as trained against what the "
                   f"device can do; while it stays so, every host<->device copy (and GPUDirect RDMA through that link) gets {share}"
                   + (f". {why.replace('DEV', n.device)}" if why else "")),
            fix=FIX.format(where="its slot" if n.limited_at in (None, n.device) else f"its slot and the switch or riser at {at}",
                           dev=n.device, at=f" (and `sudo lspci -vv -s {at}`)" if n.limited_at and n.limited_at != n.device else ""),
        ))
    return out


def facts_of(facts: PcieNotices) -> dict:
    rows = []
    for n in facts.latest():
        dev = facts.devices.get(n.device)
        rows.append({
            "device": n.device, "what": dev.label() if dev else None, "driver": n.driver, "line": n.line,
            "limited": n.limited, "available_gbps": n.available_gbps, "capable_gbps": n.capable_gbps,
            "speed": n.link.speed, "width": n.link.width, "capable_speed": n.capable.speed, "capable_width": n.capable.width,
            "generation": n.link.generation, "capable_generation": n.capable.generation, "limited_at": n.limited_at,
            "times_printed": sum(1 for o in facts.notices if o.device == n.device),
        })
    return {"devices": rows, "lines": facts.lines}


def explain(text: str, source: str, profile: ResolvedProfile | None) -> Explained:
    """The notices of ``text``, one finding per device; no profile is needed, the line carries its own yardstick."""
    facts = pcie_notice.parse(text)
    if not facts.notices:
        raise UsageError(f"{source}: {NO_NOTICE}")
    return Explained(kind=KIND, title=TITLE, source=source, findings=judge(facts), facts=facts_of(facts))
