"""Where the GPUs, NICs and CPUs sit relative to each other, judged against
the SKU.

A node can pass every yes/no test and still train at half speed: GPUs split
4+4 across sockets with NCCL's threads on the wrong one, a missing NVLink
between a pair, a NIC two hops from its GPU, too few CPUs for eight ranks.
This check reads the layout (readers.layout: `nvidia-smi topo -m`, sysfs,
NVML, this process's cpuset and CPU quota), judges it in pure functions and
writes per-rank pinning advice (checkkit.placement) into the report.
"""

from __future__ import annotations

import re
import sys
import time

from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.base.host import Host
from preflight.base.units import format_cpulist, parse_cpulist
from preflight.checkkit import settle
from preflight.checkkit.placement import advise
from preflight.checkkit.sources import Sources
from preflight.pipeline import floor_bounds
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.expectations import TopologyExpect
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import layout
from preflight.readers.nvidia import nvml
from preflight.readers.machine import topo_derived
from preflight.readers.machine.layout import (NVIDIA_SMI_TIMEOUT, TopologyFacts, gpu_count, gpu_numa, numa_span, numa_unknown,
                                      nvlink_count, rank_gpus)
from preflight.readers.nvidia.nvml import Inventory
from preflight.readers.nvidia.topo import NEAR, Topo

FAIL, WARN = Status.FAIL, Status.WARN
PIN = "bind each rank to its GPU's NUMA node (the advice, details.advice in the report, has the exact command)"


def gather(host: Host, settings: Settings, deadline: float, inventory: Inventory | None = None) -> TopologyFacts:
    """The layout, read as the settings say (the NVML source, the job's interpreter), from
    ``inventory`` where the run has read NVML (Context.inventory); where `nvidia-smi topo -m`
    cannot be read, its matrix built from NVML and sysfs.
    Raises NvmlUnavailable when NVML cannot answer at all."""
    python = str(settings.python) if settings.python else sys.executable
    # NVIDIA_SMI_TIMEOUT is looked up here at each call, so a test can shorten it.
    return topo_derived.complete(host, layout.gather(host, settings.nvml_fake, python, deadline, NVIDIA_SMI_TIMEOUT, inventory))


# ---- judging -------------------------------------------------------------------


def name_list(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def link_mode(expect: TopologyExpect, shape: NodeShape | None) -> str:
    """What to hold the matrix to on this node. The profile says how a model's GPUs
    are joined when they are (NVSwitch: every pair NV<width>; bridges: pairs);
    the node says whether they are. A saved capture (no shape) gets the profile's word.
    "mesh": every pair by some NVLink (a direct-link board, e.g. 4-GPU HGX, NV6 a pair);
    "peers": no GPU left out where the others have NVLink."""
    if shape is None:
        return expect.nvlink
    if shape.fabric == "nvswitch":
        return "all" if expect.nvlink == "all" else "peers"
    if shape.fabric == "nvlink":
        return {"all": "mesh", "pairs": "pairs"}.get(expect.nvlink, "peers")
    return "none"  # one GPU, or GPUs joined by PCIe only: no NVLink to judge


def judge_links(facts: TopologyFacts, expect: TopologyExpect, shape: NodeShape | None = None) -> list[Finding]:
    m, want = facts.matrix, expect.nvlink_width
    out = []
    down = {g.index: g.nvlinks_down for g in facts.gpus if g.nvlinks_down}
    mode = link_mode(expect, shape)
    if topo_derived.LINKS in facts.unanswered:
        # No source says which GPUs the links join: nothing to hold the node to, and nothing to clear it by.
        if mode != "none" and gpu_count(facts) > 1:
            out.append(Finding(WARN, "NVLink pairs unknown", facts.unanswered[topo_derived.LINKS] + ": NVLink between the GPUs was not judged",
                               "run `nvidia-smi topo -m` and `nvidia-smi nvlink -s` by hand; update nvidia-ml-py to the driver's generation"))
        m = None
    if m is not None and mode in ("mesh", "peers"):
        out += _left_out(m, every_pair=mode == "mesh", elsewhere=bridged_elsewhere(facts))
    if m is not None and mode == "all":
        short = {k: v for k, v in m.links.items() if nvlink_count(v) < want}
        n = len(m.gpus)
        if n > 2 and len(short) == len(m.links) and not any(nvlink_count(v) for v in short.values()):
            kinds = "/".join(sorted(set(short.values())))
            return [Finding(FAIL, f"no NVLink between any GPUs, NV{want} expected",
                            f"every GPU pair is joined by {kinds}, none by NVLink: this is not the board the profile describes, or its NVSwitch fabric is down",
                            "check the profile (`preflight detect`), then `nvidia-smi nvlink -s` and nvidia-fabricmanager")]
        every = dict(short)
        for i in range(n):  # a GPU short to every peer lost its own links: name the GPU, not 7 pairs
            mine = [k for k in every if i in map(int, k.split("-"))]
            if n > 2 and len(mine) == n - 1:
                links = sorted({every[k] for k in mine})
                nvml_says = f"; NVML reports its link(s) {', '.join(map(str, down[i]))} down" if i in down else ""
                out.append(Finding(FAIL, f"GPU {i} has {'/'.join(links)} to every peer, NV{want} expected",
                                   f"GPU {i} reaches its {n - 1} peers over {'/'.join(links)} instead of NV{want}{nvml_says}: "
                                   "its NVLink bandwidth is cut",
                                   _NVLINK_REMEDY))
                short = {k: v for k, v in short.items() if k not in mine}
        if short:
            pairs = [f"GPU {k.replace('-', '-GPU ')} {v}" for k, v in short.items()]
            out.append(Finding(FAIL, f"NVLink below NV{want} between {len(short)} GPU pair(s)",
                               f"expected NV{want} between every GPU pair, found {name_list(pairs)}", _NVLINK_REMEDY))
    elif m is not None and mode == "pairs":
        for g in range(len(m.gpus)):
            peers = {j: m.link(g, j) for j in range(len(m.gpus)) if j != g and nvlink_count(m.link(g, j))}
            best = max(peers.items(), key=lambda kv: nvlink_count(kv[1]), default=None)
            if best is None:
                if g in bridged_elsewhere(facts):
                    continue
                out.append(Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU (NV{want} bridge to its pair expected): "
                                   "the bridge is missing or unseated", "reseat or replace the NVLink bridge of this GPU pair; " + _NVLINK_REMEDY))
            elif nvlink_count(best[1]) < want and g < best[0]:
                out.append(Finding(FAIL, f"GPU {g}-GPU {best[0]} bridged at {best[1]}, NV{want} expected",
                                   f"GPU {g} and GPU {best[0]} are joined by {best[1]} instead of NV{want}: a bridge of the pair is missing or a link is down",
                                   "reseat the NVLink bridges of this pair; " + _NVLINK_REMEDY))
    listed = {i for f in out for i in range(gpu_count(facts)) if re.search(rf"GPU {i}\b", f.cause)}
    for i, links in sorted(down.items()):
        if i not in listed:
            out.append(Finding(FAIL, f"GPU {i}: NVLink {', '.join(map(str, links))} down",
                               f"NVML reports NVLink link(s) {', '.join(map(str, links))} of GPU {i} present but not active", _NVLINK_REMEDY))
    return out


def bridged_elsewhere(facts: TopologyFacts) -> dict[int, list[str]]:
    """GPU index -> the bus ids of GPUs outside this view (another pod's or job's) that its active
    NVLinks reach, as NVML says: such a GPU has its bridge, to a partner it was not given with."""
    ours = {p.pci.lower() for p in facts.gpus}
    out = {}
    for p in facts.gpus:
        # Only links NVML says end at a GPU: where it cannot tell a GPU from an NVSwitch, the
        # peers it lists may be switches, and a GPU cut off from its fabric must still fail.
        if not (p.nvlink_remote or {}).get("gpu") or "switch" in (p.nvlink_remote or {}):
            continue
        if away := sorted(bus for bus in (p.nvlink_peers or {}) if bus.lower() not in ours):
            out[p.index] = away
    return out


def _left_out(m: Topo, every_pair: bool, elsewhere: dict[int, list[str]]) -> list[Finding]:
    """On a node whose GPUs NVLink joins: a GPU with no NVLink peer at all, or
    (``every_pair``) a pair with none between them. A GPU whose links reach only GPUs
    outside this view (``elsewhere``) is left out by whoever chose the GPUs, not by a fault."""
    n = len(m.gpus)
    lone = [g for g in range(n) if not any(nvlink_count(m.link(g, j)) for j in range(n) if j != g) and g not in elsewhere]
    out = [Finding(FAIL, f"GPU {g} has no NVLink peer", f"GPU {g} has no NVLink to any GPU while the node's other GPUs are joined by NVLink: "
                   "its bridge is missing or unseated, or its links are down", "reseat or replace the NVLink bridge of this GPU; " + _NVLINK_REMEDY)
           for g in lone if len(lone) < n]
    if every_pair:
        pairs = [f"GPU {a}-GPU {b} {m.link(a, b)}" for a in range(n) for b in range(a + 1, n) if a not in lone and b not in lone and not nvlink_count(m.link(a, b))]
        if pairs:
            out.append(Finding(FAIL, f"no NVLink between {len(pairs)} GPU pair(s)", f"this board joins every GPU pair by NVLink; found {name_list(pairs)}", _NVLINK_REMEDY))
    return out


_NVLINK_REMEDY = ("check `nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` for the GPU; on NVSwitch systems check that "
                  "nvidia-fabricmanager is running; a link that stays down needs a reset or an RMA")


def judge_numa(facts: TopologyFacts, expect: TopologyExpect) -> list[Finding]:
    n = gpu_count(facts)
    known = {i: node for i in range(n) if (node := gpu_numa(facts, i)) is not None}
    out = []
    unknown = [i for i in range(n) if numa_unknown(facts, i)]
    several = (facts.cpus is not None and len(facts.cpus.nodes) > 1) or bool(facts.matrix and facts.matrix.spans_numa)
    # A VM's guest sees the NUMA layout its hypervisor chose to show: a GPU passed through without
    # a proximity node is no fault of the node, and no tenant can change it. The advice says it.
    if unknown and several and not (facts.live and facts.hypervisor):
        who = name_list([str(i) for i in unknown])
        if facts.live:
            cause = f"neither the kernel (numa_node -1) nor {'NVML' if facts.matrix_source == topo_derived.SOURCE else 'nvidia-smi'} knows the NUMA node of GPU {who} on a machine with several"
            remedy = "enable NUMA reporting in the BIOS (ACPI SRAT / PCIe proximity); meanwhile bind their ranks by the CPU lists in the advice"
        else:
            cause = f"the capture does not say which NUMA node GPU {who} sits on (no NUMA column, or N/A), and its GPUs use different CPUs"
            remedy = "read /sys/bus/pci/devices/<GPU>/numa_node on the node, or capture `nvidia-smi topo -m` with a newer driver"
        out.append(Finding(WARN, f"NUMA node of GPU {who} unknown", cause + ": nothing can pin their ranks to the right socket", remedy))
    span = numa_span(facts)
    limit = expect.numa_fail_above
    status = FAIL if limit is not None and span > limit else WARN if span > expect.numa_warn_above else None
    if status is not None:
        if known and (not unknown or facts.matrix is None):
            split = "; ".join(f"node {node}: GPU {format_cpulist([i for i, x in known.items() if x == node])}" for node in sorted(set(known.values())))
        else:  # the CPU sets stand for the sockets
            m = facts.matrix
            split = "; ".join(f"CPUs {g}: GPU {format_cpulist([x.index for x in m.gpus if x.cpu_affinity == g])}" for g in m.cpu_groups)  # type: ignore[union-attr]
        allowed = limit if status == FAIL else expect.numa_warn_above
        out.append(Finding(status, f"GPUs span {span} NUMA nodes ({split})",
                           f"the GPUs sit on {span} NUMA nodes ({split}), more than the {allowed} expected: a rank left "
                           "unpinned runs its NCCL proxy threads and data loader on whichever socket the scheduler picks, and its "
                           "host<->device copies then cross the socket interconnect (UPI/xGMI)",
                           PIN if status == WARN else "set the BIOS NUMA mode (NPS/SNC) to the fleet's; meanwhile " + PIN))
    return out


def judge_nics(facts: TopologyFacts, expect: TopologyExpect, shape: NodeShape | None = None, multi_node: bool = False) -> list[Finding]:
    """A NIC at PIX/PXB beside every GPU, on a model built for multi-node jobs.
    On a live node it applies where the node has NICs at all: a node with none
    (a single-node VM) says so once, in its shape, unless the site pins
    multi-node use; one GPU has no GPU-to-NIC layout to get wrong."""
    m = facts.matrix
    if not expect.nic_per_gpu or m is None:
        return []
    if shape is not None and not multi_node and (shape.gpus <= 1 or not (m.nics or facts.nics)):
        return []
    if topo_derived.NICS in facts.unanswered:
        return [Finding(WARN, "GPU-NIC distance unknown", facts.unanswered[topo_derived.NICS] + ": whether each GPU has a NIC at PIX/PXB was not judged",
                        "run `nvidia-smi topo -m` by hand and read each GPU's row for a NIC at PIX or PXB")]
    remedy = "check that the NICs are seated and their driver (mlx5_core, mlx5_ib) is loaded (`ibv_devinfo`); a node built for multi-node jobs needs one NIC beside each GPU"
    if not m.nics:
        return [Finding(FAIL, "no NIC in the GPU topology", f"{'`nvidia-smi topo -m`' if facts.matrix_source != topo_derived.SOURCE else 'sysfs (/sys/class/infiniband)'} lists no NIC: multi-node traffic would leave through "
                        "the host's other network at a fraction of the speed, without GPUDirect RDMA", remedy)]
    out = []
    # The matrix names RDMA devices (mlx5_0) or, on some drivers, netdevs (ibp24s0): look up both.
    ports = {name: nic.ports for nic in facts.nics for name in (nic.name, *nic.netdevs)}
    if facts.live:
        near_all = {n for g in m.gpus for n in m.nearest_nics.get(str(g.index), []) if g.nics[n] in NEAR}
        unseen = sorted(near_all - set(ports))
        if unseen:
            out.append(Finding(WARN, f"state of NIC {name_list(unseen)} unknown",
                               f"`nvidia-smi topo -m` lists {name_list(unseen)} beside GPUs, but /sys/class/infiniband has no RDMA device of that name, "
                               "so whether its port is up is unknown", "check that mlx5_ib (or the NIC's RDMA driver) is loaded: `ibv_devinfo`, `ibstat`"))
    for g in m.gpus:
        near = [n for n, link in g.nics.items() if link in NEAR]
        if not near:
            best = m.nearest_nics.get(str(g.index), [])
            out.append(Finding(FAIL, f"GPU {g.index} has no NIC at PIX/PXB",
                               f"GPU {g.index}'s nearest NIC is {'/'.join(best) or 'none'} at {g.nics.get(best[0], '?') if best else '-'}: "
                               "NCCL uses GPUDirect RDMA only up to PXB by default (NCCL_NET_GDR_LEVEL), so its traffic is staged through host memory",
                               remedy))
            continue
        # NCCL gives each GPU its nearest NIC: if all of those are down, the
        # GPU's traffic moves to a NIC another GPU already uses.
        nearest = [n for n in m.nearest_nics.get(str(g.index), []) if ports.get(n)]
        if nearest and not any(p.state == "ACTIVE" for n in nearest for p in ports[n]):
            states = ", ".join(f"{n} port {p.port} {p.state}" for n in nearest for p in ports[n])
            out.append(Finding(FAIL, f"GPU {g.index}'s NIC is down", f"the NIC nearest GPU {g.index} has no active port ({states})",
                               "check the cable and the switch port (`ibstat`, `ibv_devinfo`); until then this GPU's traffic shares another GPU's NIC"))
    return out


def judge_cpus(facts: TopologyFacts, floor: float | None) -> list[Finding]:
    c = facts.cpus
    # A shared node may show every GPU but give this job a few (CUDA_VISIBLE_DEVICES): count those.
    n = len(rank_gpus(facts, gpu_count(facts)))
    if c is None or not n:
        return []
    out = []
    per_gpu = c.usable() / n
    online, allowed = parse_cpulist(c.online), set(parse_cpulist(c.allowed)) & set(parse_cpulist(c.online))
    if floor is not None and per_gpu < floor:
        why = [f"{len(online)} CPUs online"]
        if len(allowed) < len(online):
            why.append(f"this process's cpuset allows {len(allowed)} ({format_cpulist(allowed)})")
        if c.quota is not None and c.quota < len(allowed):
            why.append(f"the cgroup's CPU quota grants {c.quota:g} CPUs' time")
        out.append(Finding(FAIL, f"{per_gpu:.1f} vCPUs per GPU, {floor:g} needed",
                           f"{c.usable():g} usable vCPUs for {n} {'visible ' if facts.cuda_visible_devices else ''}GPUs ({'; '.join(why)}): NCCL runs a busy proxy thread per rank and "
                           "each rank needs its own host loop and data loader, so starved ranks stall the GPUs",
                           "give the job more CPUs (container cpuset/CPU limit), or use a host with more cores per GPU"))
    for node, cpus in c.nodes.items():
        gpus = [i for i in range(n) if gpu_numa(facts, i) == int(node)]
        if gpus and not (set(parse_cpulist(cpus)) & allowed):
            out.append(Finding(WARN, f"no allowed CPU on NUMA node {node}",
                               f"GPU {format_cpulist(gpus)} sit on NUMA node {node}, but this process's cpuset has none of its CPUs ({cpus}): "
                               "their ranks must run across the socket interconnect",
                               "widen the container's cpuset to include CPUs of every GPU's NUMA node"))
    return out


def judge_agreement(facts: TopologyFacts) -> list[Finding]:
    """Where nvidia-smi and the kernel disagree, the pinning advice may be wrong."""
    m = facts.matrix
    if m is None or not facts.gpus or facts.matrix_source == topo_derived.SOURCE:  # built from the very facts it would be held to
        return []
    out = []
    if len(m.gpus) != len(facts.gpus):
        # GPU n of the matrix is NVML's GPU n only when both list the same GPUs.
        return [Finding(FAIL, "nvidia-smi and NVML count different GPUs",
                        f"`nvidia-smi topo -m` shows {len(m.gpus)} GPUs, NVML {len(facts.gpus)}: the layout cannot be matched to the GPUs",
                        "run `nvidia-smi -L` and `preflight detect`; a GPU may have dropped off between the two reads")]
    for g in facts.gpus:
        if g.index >= len(m.gpus):
            continue
        t = m.gpus[g.index]
        said = []
        if g.numa_node is not None and t.numa_nodes is not None and t.numa_nodes != [g.numa_node]:
            said.append(f"NUMA node: nvidia-smi {t.numa_affinity}, sysfs {g.numa_node}")
        # nvidia-smi prints the affinity cut to the CPUs the caller may use (a Slurm job's or a pod's
        # cpuset: `srun -c32` reads "0-15,56-71", rapidsai/dask-cuda#1381); the kernel's, the whole node's.
        local = set(parse_cpulist(g.local_cpus)) if g.local_cpus else None
        allowed = set(parse_cpulist(facts.cpus.allowed)) if facts.cpus is not None and facts.cpus.allowed else None
        if local is not None and t.cpus is not None and set(t.cpus) not in (local, local & allowed if allowed else local):
            said.append(f"CPUs: nvidia-smi {t.cpu_affinity}, sysfs {g.local_cpus}")
        if said:
            out.append(Finding(WARN, f"nvidia-smi and sysfs disagree about GPU {g.index}", f"GPU {g.index} ({g.pci}): {'; '.join(said)}",
                               "the advice follows sysfs (the kernel's view); update the driver, and check the BIOS NUMA settings"))
    return out


def judge_pcie(facts: TopologyFacts) -> list[Finding]:
    """Width from sysfs (links do not narrow to save power; speed does, so it is not judged)."""
    out = []
    for what, link, status in [(f"GPU {g.index} ({g.pci})", g.link, FAIL) for g in facts.gpus] + [(f"NIC {n.name} ({n.pci})", n.link, WARN) for n in facts.nics]:
        if link and link.width and link.max_width and link.width < link.max_width:
            out.append(Finding(status, f"{what.split(' (')[0]} PCIe link x{link.width} of x{link.max_width}",
                               f"{what}'s PCIe link trained at x{link.width} of x{link.max_width} (sysfs current_link_width): it moves at most "
                               f"{link.width / link.max_width:.0%} of its bandwidth", "reseat the card or its riser; check the slot with `lspci -vv`"))
    return out


def judge(facts: TopologyFacts, expect: TopologyExpect, vcpu_floor: float | None,
          shape: NodeShape | None = None, multi_node: bool = False) -> dict[str, list[Finding]]:
    """Findings by part, so a report says which part failed. ``shape`` is the live
    node's (None for a saved capture, judged by the profile's word alone)."""
    matrix = []
    if facts.matrix is None:
        # Neither nvidia-smi nor NVML and sysfs gave a matrix (a GPU NVML lost leaves the others unnumbered):
        # a reader's trouble, not a layout fault; a lost or missing GPU is the cuda check's FAIL.
        lost = f"; NVML lists GPU {', '.join(str(g.index) for g in facts.gpus)} only, so the GPUs cannot be numbered into a matrix" if facts.gpus else ""
        matrix.append(Finding(WARN, "GPU layout not judged", f"no GPU link matrix: {facts.matrix_error}{lost}: links, NUMA split and NICs were not judged",
                              "run `nvidia-smi topo -m` by hand; reinstall the driver's userspace if nvidia-smi is missing; `preflight detect` lists the GPUs NVML sees"))
    return {
        "matrix": matrix,
        "nvlink": judge_links(facts, expect, shape),
        "numa": judge_numa(facts, expect),
        "nics": judge_nics(facts, expect, shape, multi_node),
        "cpus": judge_cpus(facts, vcpu_floor),
        "pcie": judge_pcie(facts),
        "agreement": judge_agreement(facts),
    }


# ---- the check ---------------------------------------------------------------------

# With no profile (`preflight topology --from` a capture): only what needs no SKU.
GENERIC = TopologyExpect(numa_warn_above=1, numa_source="any SKU: GPUs on one NUMA node need no per-rank pinning")


def measurements(facts: TopologyFacts, vcpu_floor: float | None, expect: TopologyExpect | None = None, shape: NodeShape | None = None) -> list[Measurement]:
    out = []
    n = gpu_count(facts)
    if facts.cpus is not None:
        out.append(Measurement(name="usable", unit="cpus", value=facts.cpus.usable()))
        if n:
            out.append(Measurement(name="vcpus_per_gpu", unit="ratio", value=round(facts.cpus.usable() / n, 3), floor=vcpu_floor))
    if span := numa_span(facts):
        out.append(Measurement(name="gpu_numa", unit="nodes", value=span, ceiling=expect.numa_fail_above if expect else None))
    m = facts.matrix if topo_derived.LINKS not in facts.unanswered else None
    for g in facts.gpus:
        if m and g.index < len(m.gpus) and len(m.gpus) > 1:
            width = min(nvlink_count(m.link(g.index, j)) for j in range(len(m.gpus)) if j != g.index)
            # NVSwitch boards join every pair at the same width; a bridged pair says nothing of the others.
            floor = expect.nvlink_width if expect and link_mode(expect, shape) == "all" else None
            out.append(Measurement(name="gpu_nvlink_peer_min", unit="links", value=width, labels={"gpu": str(g.index), "UUID": g.uuid}, floor=floor))
    return out


class Topology(Check):
    name = "topology"
    description = "GPU/NIC/CPU layout: NVLink between GPU pairs, NUMA span, a NIC beside each GPU, vCPUs per GPU; per-rank pinning advice"
    timeout_seconds = 30.0
    order = 20
    beside_ranks = True  # reads the node: runs while the ranks import torch
    floor_units = {"vcpus_per_gpu": ("ratio", "min")}
    floor_sane = floor_bounds.by_unit(floor_units)

    def applies(self, ctx: Context) -> str | None:
        if not ctx.profile.has_gpus or ctx.profile.topology is None:
            return f"profile {ctx.profile.name} has no GPUs: there is no GPU layout to judge"
        return None

    def run(self, ctx: Context) -> Result:
        assert ctx.profile.topology is not None
        try:
            left = max(1.0, ctx.deadline - time.monotonic())
            # On an NVSwitch board the fabric manager trains the NVLinks: while it still registers the
            # GPUs a link reads inactive, so wait for it (bounded) before judging them.
            waited = settle.settled_inventory(ctx, timeout=min(20.0, left))
            facts = gather(ctx.host, ctx.settings, ctx.deadline, waited.inventory)
        except nvml.NvmlUnavailable as e:
            return self.result(FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        floor = ctx.profile.floors["vcpus_per_gpu"].value if "vcpus_per_gpu" in ctx.profile.floors else None
        multi_node = ctx.settings.node_multi_node or ctx.settings.nnodes > 1
        parts = judge(facts, ctx.profile.topology, floor, ctx.shape, multi_node)
        if ctx.settings.nvml_fake is not None:  # fail closed, as the cuda check does
            parts["source"] = [nvml.fake_finding(str(ctx.settings.nvml_fake))]
        advice = advise(facts)
        src = sources(facts)
        details = facts.model_dump(mode="json", exclude={"answered", "not_run"}) | src.details()  # as details.sources and .unread
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        details["advice"] = advice.model_dump(mode="json")
        if said := waited.describe():
            details["settle"] = said  # how long it waited for the fabric to register the GPUs
        findings = [f for found in parts.values() for f in found]
        ok = f"{ctx.shape.describe() if ctx.shape else f'{gpu_count(facts)} GPUs'}; {advice.summary}"
        if facts.cpus:
            ok += f"; {facts.cpus.usable() / max(1, gpu_count(facts)):.1f} vCPUs per GPU"
        result = self.conclude(findings, ok, measurements=measurements(facts, floor, ctx.profile.topology, ctx.shape) + src.measurements(), details=details)
        if line := src.line():
            result.lines.append(line)
        if said:
            result.lines.append(f"NVLink judged after waiting: {said}")
        return result


def sources(facts: TopologyFacts) -> Sources:
    """Which source answered each fact the judges read, and what could not be read."""
    src = Sources()
    for fact, source in facts.answered.items():
        src.took(fact, source)
    if facts.matrix_error:
        src.failed("nvidia-smi topo -m", facts.matrix_error, facts.matrix_source if facts.matrix is not None else None)
    for tool, why in facts.not_run.items():  # the advice then names both ways to bind
        src.failed(tool, why)
    return src
