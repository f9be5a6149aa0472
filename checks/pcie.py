"""The PCIe fabric under the GPUs and NICs: ACS, the IOMMU mode, switch links.

Three platform settings cut the fast paths without any error:
- ACS (Access Control Services) Request/Completion Redirect on a switch port
  sends GPU<->GPU and GPU<->NIC (GPUDirect RDMA) traffic up to the root
  complex instead of across the switch: slow, or a hang. NCCL's
  troubleshooting page ("PCI Access Control Services") says to disable it;
  Linux enables it on every ACS-capable port when the IOMMU is on.
- An IOMMU in translated mode puts every DMA of the GPUs and NICs through
  its page tables; passthrough (iommu=pt) keeps the IOMMU for VFIO and
  lets the host's own devices DMA untranslated.
- A switch's upstream link trained narrower or slower than both ends allow
  halves what every GPU and NIC below it can move.
The facts come from sysfs (preflight.readers.machine.pcie); the judges are pure.
"""

from __future__ import annotations

import re
import time
from itertools import combinations

from preflight.base.findings import Finding, Status, worst
from preflight.checkkit.sources import Sources
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.shape import pci_nvidia
from preflight.readers.machine import pcie
from preflight.readers.machine.pcie import Endpoint, PcieFacts

FAIL, WARN, SKIP = Status.FAIL, Status.WARN, Status.SKIP
# The ACS Control bits that route peer traffic away from the switch where two paths part (PCIe base
# spec, ACS Control Register): P2P Request Redirect and Completion Redirect send it up to the root
# complex, Egress Control redirects or blocks what its vector names. The others leave P2P across the
# switch alone: Source Validation checks a request's Requester ID against the port's bus range,
# Upstream Forwarding only forwards TLPs that something below already redirected back to the port's
# own link, Translation Blocking and Direct Translated P2P concern ATS-translated requests. The
# kernel's documented fix for P2P under an IOMMU, pci=disable_acs_redir=<ports>, clears exactly
# RR, CR and EC (drivers/pci/pci.c pci_disable_acs_redir) and leaves SrcValid and UpstreamFwd on.
REDIRECT = ("ReqRedir", "CmpltRedir", "EgressCtrl")
NOT_VISIBLE = "bridges on the path are not visible (virtual machine or passthrough): ACS and switch links are the host's to check"
NCCL_ACS = "NCCL troubleshooting, \"PCI Access Control Services (ACS)\""
FIX_ACS = ("disable ACS on those ports: in the BIOS (PCIe ACS / ACS Control: disabled), or at each boot before jobs start "
           "`setpci -s <port> ECAP_ACS+0x6.w=0000` for each port named (check with `sudo lspci -vvv | grep ACSCtl`)")
FIX_IOMMU = ("add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub and reboot): "
             "the IOMMU stays on for VFIO, the host's own devices DMA untranslated")


def names(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def not_applicable(facts: PcieFacts) -> str | None:
    """Why there is nothing to judge here, or None."""
    if not facts.gpus:
        return "no NVIDIA GPU on the PCI bus"
    if not any(g.bridges for g in facts.gpus):
        return NOT_VISIBLE
    return None


# ---- ACS -------------------------------------------------------------------------------------


def shared_switch_ports(a: Endpoint, b: Endpoint) -> list[str]:
    """The two downstream ports of the shared switch where the paths of two devices part:
    peer traffic between them turns around there, so only their ACS redirect decides.
    Ports further down lead to one device each and carry no peer traffic between the two;
    devices under different root ports meet in the root complex anyway."""
    pa, pb = a.bridges or [], b.bridges or []
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    return pa[k:k + 1] + pb[k:k + 1] if k else []


def peer_ports(facts: PcieFacts) -> dict[str, list[str]]:
    """Switch port -> the device pairs whose peer traffic turns around there. Only pairs with peer
    traffic: two GPUs (P2P), or a GPU and an RDMA NIC (GPUDirect RDMA); a management NIC under a
    GPU's switch moves its traffic to host memory, where ACS redirect costs it nothing."""
    pairs = list(combinations(facts.gpus, 2)) + [(g, n) for g in facts.gpus for n in facts.nics if n.rdma]
    between: dict[str, list[str]] = {}
    for a, b in pairs:
        for port in shared_switch_ports(a, b):
            between.setdefault(port, []).append(f"{a.label()} and {b.label()}")
    return between


def acs_without_redirect(facts: PcieFacts) -> dict[str, str]:
    """Switch ports between peers with ACS bits on but no redirect (SrcValid+, UpstreamFwd+): port ->
    its ACSCtl. Peer traffic still crosses the switch there; said in the details, never a finding."""
    out = {}
    for port in peer_ports(facts):
        acs = facts.bridges[port].acs
        if acs is not None and (on := acs.on()) and not any(bit in on for bit in REDIRECT):
            out[port] = "ACSCtl " + " ".join(b + "+" for b in on)
    return out


def judge_acs(facts: PcieFacts) -> tuple[list[Finding], str | None]:
    """Findings, and the reason ACS went unjudged (None: judged): a redirect bit (REDIRECT) on a
    switch port where two peers' paths part. Other ACS bits leave P2P across the switch alone."""
    between = peer_ports(facts)
    if not between:
        return [], None
    unread = [facts.bridges[p] for p in between if facts.bridges[p].acs_unread]
    redirect = []
    for port, where in between.items():
        acs = facts.bridges[port].acs
        if acs is None:
            continue
        on = acs.on()
        if any(bit in on for bit in REDIRECT):
            redirect.append(f"{port} (ACSCtl {' '.join(b + '+' for b in on)}) between {where[0]}" + (f" (+{len(where) - 1} more pairs)" if len(where) > 1 else ""))
    out = []
    if redirect:
        out.append(Finding(FAIL, f"ACS redirects peer traffic on {len(redirect)} switch port{'s' if len(redirect) > 1 else ''} between GPUs/NICs",
                           f"ACS Request/Completion Redirect is on at {names(redirect, 3)}: P2P and GPUDirect RDMA traffic is forced up "
                           f"to the root complex instead of across the switch, so NCCL runs slow or hangs ({NCCL_ACS})", FIX_ACS))
    why = None
    if unread:
        why = f"ACS not read on {len(unread)} switch port{'s' if len(unread) > 1 else ''} ({names([b.bdf for b in unread])}): {unread[0].acs_unread}"
    return out, why


# ---- IOMMU ----------------------------------------------------------------------------------

TRANSLATED = ("DMA", "DMA-FQ")


def _cmdline_says(cmdline: str) -> tuple[str | None, str]:
    """("pt" | "translated" | "off" | None, the words that said it)."""
    words = cmdline.split()
    for w in words:
        if w in ("iommu=pt", "iommu.passthrough=1", "amd_iommu=pt"):
            return "pt", w
    for w in words:
        if w in ("iommu=off", "intel_iommu=off", "amd_iommu=off"):
            return "off", w
    for w in words:
        if w in ("intel_iommu=on", "amd_iommu=on", "iommu.passthrough=0", "iommu=nopt", "iommu=force"):
            return "translated", w
    return None, ""


NO_PEER_PATH = "no GPU peer or RDMA path"


def peer_path(facts: PcieFacts) -> bool:
    """Whether any DMA crosses between devices: GPU to GPU (P2P), or GPU to an RDMA NIC
    (GPUDirect RDMA). A management NIC (a net device without RDMA) has no such path."""
    return len(facts.gpus) >= 2 or bool(facts.gpus and any(n.rdma for n in facts.nics))


def judge_iommu(facts: PcieFacts) -> list[Finding]:
    """Only devices on a peer path: a translated IOMMU slows and breaks peer DMA, not a
    lone GPU's copies to host memory or a management NIC's traffic."""
    if not peer_path(facts):
        return []
    devices = facts.gpus + [n for n in facts.nics if n.rdma]
    if not facts.iommu_groups:
        return []  # no IOMMU groups: DMA is not remapped at all
    translated = [e for e in devices if e.iommu_type in TRANSLATED]
    mode, word = _cmdline_says(facts.cmdline or "")
    cmdline = f"kernel command line: {word or 'no iommu= setting'}"
    if translated:
        kinds = "/".join(sorted({e.iommu_type or "" for e in translated}))
        return [Finding(WARN, f"IOMMU translates DMA for {len(translated)} GPU/NIC{'s' if len(translated) > 1 else ''}",
                        f"the IOMMU groups of {names([e.label() for e in translated], 3)} are of type {kinds} ({cmdline}): every "
                        "P2P and GPUDirect RDMA transfer goes through IOMMU page tables and the kernel enables ACS on the switches, "
                        f"cutting bandwidth or hanging NCCL ({NCCL_ACS})", FIX_IOMMU)]
    typed = [e for e in devices if e.iommu_type]
    if typed or mode in ("pt", "off"):
        return []  # the groups say identity (passthrough), or the command line does
    if mode == "translated":
        return [Finding(WARN, f"IOMMU on in translated mode ({word}, no iommu=pt)",
                        f"{facts.iommu_groups} IOMMU groups and {word} without iommu=pt on the kernel command line: the GPUs' and NICs' "
                        f"DMA is translated, and the kernel enables ACS on the switches ({NCCL_ACS})", FIX_IOMMU)]
    return [Finding(WARN, "IOMMU on, mode unknown",
                    f"{facts.iommu_groups} IOMMU groups, no group type in sysfs (kernel before 5.11) and no iommu= setting on the kernel "
                    "command line: the kernel's build default decides whether GPU and NIC DMA is translated", FIX_IOMMU)]


# ---- switch links -----------------------------------------------------------------------------


def _gts(speed: str | None) -> float | None:
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed or "")
    return float(m.group(1)) if m else None


# Ports whose PCIe link leads away from the CPU: a root port, a switch's downstream port,
# and a PCI-to-PCIe bridge (its secondary side is PCIe).
DOWNSTREAM_FACING = ("root", "downstream", "pci-to-pcie")


def switch_links(facts: PcieFacts) -> list[tuple[str, str]]:
    """(upper port, switch upstream port) of each bridge-to-bridge link on the paths: a
    downstream-facing port and the switch upstream port below it, by their Device/Port Type.
    Where a path's types are not all known (config space unreadable), a path reads root
    port, then each switch as its upstream then downstream port: positions (0, 1), (2, 3), ..."""
    links: dict[tuple[str, str], None] = {}
    for e in facts.gpus + facts.nics:
        chain = e.bridges or []
        types = [facts.bridges[b].port_type if b in facts.bridges else None for b in chain]
        if chain and all(types):
            pairs = [(chain[i], chain[i + 1]) for i in range(len(chain) - 1)
                     if types[i] in DOWNSTREAM_FACING and types[i + 1] == "upstream"]
        else:
            pairs = [(chain[i], chain[i + 1]) for i in range(0, len(chain) - 1, 2)]
        links.update(dict.fromkeys(pairs))
    return list(links)


def judge_links(facts: PcieFacts) -> list[Finding]:
    out = []
    for up, down in switch_links(facts):
        a, b = facts.bridges[up].link, facts.bridges[down].link
        if a is None or b is None:
            continue
        said = []
        widths = [w for w in (a.max_width, b.max_width) if w]
        if b.width and widths and b.width < min(widths):
            said.append(f"x{b.width} of x{min(widths)}")
        speeds = [s for s in (_gts(a.max_speed), _gts(b.max_speed)) if s]
        now = _gts(b.speed)
        if now and speeds and now < min(speeds):
            said.append(f"{now:g} of {min(speeds):g} GT/s")
        if said:
            out.append(Finding(FAIL, f"switch link {up} -> {down} runs at {' and '.join(said)}",
                               f"the link from {up} to the switch port {down} trained at {' and '.join(said)} (sysfs current_link_* against "
                               "the max_link_* of both ends): every GPU and NIC below that switch shares the cut bandwidth",
                               f"reseat or replace the switch board or its cable/riser at {down}; check `lspci -vv -s {down}` LnkSta against LnkCap, "
                               "and the BIOS link speed setting"))
    return out


def judge(facts: PcieFacts) -> tuple[dict[str, list[Finding]], dict[str, str]]:
    """Findings by part, and the parts left unjudged with the reason."""
    acs, why = judge_acs(facts)
    unjudged = {"acs": why} if why else {}
    if not peer_path(facts):
        unjudged["iommu"] = NO_PEER_PATH
    return {"acs": acs, "iommu": judge_iommu(facts), "links": judge_links(facts)}, unjudged


def pcie_sources(facts: PcieFacts) -> Sources:
    """Where the paths and each bridge's ACS were read, and lspci's output where it could not be used."""
    sources = Sources()
    if facts.bridges:
        sources.took("bridges and links", "sysfs")
        read = sorted({b.acs.source for b in facts.bridges.values() if b.acs})
        if read:
            sources.took("ACS", " and ".join("sysfs config space" if r == "config space" else "lspci -vvv" for r in read))
    if facts.lspci:
        # lspci is asked only where sysfs could not give config space: nothing stands in for it.
        sources.failed("lspci -vvv", facts.lspci)
    return sources


# ---- the check ----------------------------------------------------------------------------------


class Pcie(Check):
    name = "pcie"
    description = "PCIe under the GPUs and NICs: ACS redirect on shared switch ports, the IOMMU mode, switch links at full width and speed"
    timeout_seconds = 30.0
    order = 22
    beside_ranks = True  # reads the node: runs while the ranks import torch

    def applies(self, ctx: Context) -> str | None:
        if not ctx.profile.has_gpus:
            return f"profile {ctx.profile.name} has no GPUs: there is no GPU path to judge"
        return None

    def run(self, ctx: Context) -> Result:
        gpus = list(ctx.shape.slots) if ctx.shape and ctx.shape.slots else (pci_nvidia(ctx.host).gpus or [])
        facts = pcie.gather(ctx.host, gpus, deadline_s=min(pcie.LSPCI_TIMEOUT, ctx.deadline - time.monotonic() - 2.0))
        sources = pcie_sources(facts)
        skip = not_applicable(facts)
        if skip:
            return self.result(SKIP, skip, details={**facts.model_dump(mode="json"), **sources.details()}, measurements=sources.measurements())
        parts, unjudged = judge(facts)
        details = facts.model_dump(mode="json")
        details["parts"] = {part: ("SKIP" if part in unjudged else worst(found)) for part, found in parts.items()}
        details["unjudged"] = unjudged
        if on := acs_without_redirect(facts):
            details["acs_without_redirect"] = on  # SrcValid/UpstreamFwd alone: P2P still turns at the switch
        findings = [f for found in parts.values() for f in found]
        acs = "ACS not judged" if "acs" in unjudged else "no ACS redirect on shared switch ports"
        iommu = "IOMMU not judged" if "iommu" in unjudged else "IOMMU off" if not facts.iommu_groups else "IOMMU in passthrough"
        ok = (f"{len(facts.gpus)} GPUs, {len(facts.nics)} NICs, {len(facts.bridges)} bridges on their paths: {acs}, "
              f"{len(switch_links(facts))} switch links at full width and speed, {iommu}")
        if unjudged:
            ok += "; " + "; ".join(unjudged.values())
        details.update(sources.details())
        lines = [f"not judged: {why}" for why in unjudged.values()] + ([line] if (line := sources.line()) else [])
        return self.conclude(findings, ok, details=details, lines=lines, measurements=sources.measurements())
