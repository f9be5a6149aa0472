"""The topology check's judges of the layout around the GPUs, pure functions of
readers/machine/layout.py's facts: the NUMA nodes the GPUs span, a NIC beside
each GPU, vCPUs per GPU and the NUMA nodes the cpuset leaves out, nvidia-smi
against sysfs, and PCIe link width. The NVLinks are judged in
checkkit/nvlink_pairs.py; checks/topology.py gathers the parts.
"""

from __future__ import annotations

from preflight.base.findings import Finding, Status
from preflight.base.units import format_cpulist, parse_cpulist
from preflight.pipeline.expectations import TopologyExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import topo_derived
from preflight.readers.machine.layout import PciLink, TopologyFacts
from preflight.readers.machine.layout_queries import gpu_count, gpu_indices, gpu_numa, matrix_gpu, numa_span, numa_unknown, rank_gpus, socket_span
from preflight.readers.nvidia.topo import NEAR

FAIL, WARN = Status.FAIL, Status.WARN
PIN = "bind each rank to its GPU's NUMA node (the advice, details.advice in the report, has the exact command)"


def name_list(items: list[str], most: int = 6) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def judge_numa(facts: TopologyFacts, expect: TopologyExpect) -> list[Finding]:
    present = gpu_indices(facts)  # NVML's numbers: under a device cgroup, GPUs 4-7 may be all there are
    known = {i: node for i in present if (node := gpu_numa(facts, i)) is not None}
    out = []
    unknown = [i for i in present if numa_unknown(facts, i)]
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
    # The WARN counts sockets where sysfs says which socket each node is on. NPS2/NPS4 (AMD) and
    # SNC2/3/4 (Intel) split one socket into several NUMA nodes without moving a GPU off it: NVIDIA's
    # DGX A100 ships NPS4 (its GPUs on nodes 1, 3, 5, 7: NVIDIA/nccl#1505), Xeon 6900P boots SNC3 by
    # default (phoronix.com/review/xeon-6980p-snc3-hex), Dell's EPYC GPU servers support NVIDIA GPUs
    # only on CPUs that support NPS4 (XC6515 manual, "Optimal NPS configuration"), and a rank bound to
    # its GPU's node (the advice) pays nothing for it. A site that pins its fleet's NPS/SNC mode sets
    # numa_fail_above, which counts NUMA nodes.
    sockets = socket_span(facts)
    spread = sockets if sockets is not None else span
    # A Grace superchip (GH200, GB200) wires each GPU to its own CPU by NVLink-C2C, its memory a NUMA
    # node of its own (GPU NUMA ID): a node of four GH200 spans four sockets by construction (Alps'
    # quad GH200 node, arXiv:2408.11556), and no BIOS setting moves a GPU. A site's pin still holds.
    status = FAIL if limit is not None and span > limit else WARN if spread > expect.numa_warn_above and not superchips(facts) else None
    if status is not None:
        if known and (not unknown or facts.matrix is None):
            split = "; ".join(f"node {node}: GPU {format_cpulist([i for i, x in known.items() if x == node])}" for node in sorted(set(known.values())))
        else:  # the CPU sets stand for the sockets
            m = facts.matrix
            split = "; ".join(f"CPUs {g}: GPU {format_cpulist([x.index for x in m.gpus if x.cpu_affinity == g])}" for g in m.cpu_groups)  # type: ignore[union-attr]
        allowed = limit if status == FAIL else expect.numa_warn_above
        where = f"{span} NUMA nodes" if status == FAIL or sockets is None else f"{sockets} sockets"
        out.append(Finding(status, f"GPUs span {where} ({split})",
                           f"the GPUs sit on {where} ({split}), more than the {allowed} expected: a rank left "
                           "unpinned runs its NCCL proxy threads and data loader on whichever socket the scheduler picks, and its "
                           "host<->device copies then cross the socket interconnect (UPI/xGMI)",
                           PIN if status == WARN else "set the BIOS NUMA mode (NPS/SNC) to the fleet's; meanwhile " + PIN))
    return out


def superchips(facts: TopologyFacts) -> bool:
    """Every GPU is a NUMA node of its own (NVML's or nvidia-smi's GPU NUMA ID): Grace superchips."""
    if facts.gpus:
        ids = [g.gpu_numa_id if g.gpu_numa_id is not None else getattr(matrix_gpu(facts, g.index), "gpu_numa_id", None) for g in facts.gpus]
    else:
        ids = [t.gpu_numa_id for t in facts.matrix.gpus] if facts.matrix else []
    return bool(ids) and all(i is not None for i in ids)


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
    # A VM's guest sees the PCI tree its hypervisor chose to show: one that shows no GPU a NIC behind
    # its switch has not replicated the host's switches (each device on its own virtual root port or
    # bus), so nvidia-smi's NODE/SYS there is a guess by NUMA node, no tenant can change it, and the
    # provider gives NCCL the host's tree another way (NCCL_TOPO_FILE: NVIDIA/nccl#1464, #1843).
    hidden = bool(facts.live and facts.hypervisor) and not any(link in NEAR for g in m.gpus for link in g.nics.values())
    for g in m.gpus:
        near = [n for n, link in g.nics.items() if link in NEAR]
        if not near and not hidden:
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
    used = rank_gpus(facts, gpu_count(facts))
    n = len(used)
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
        # The GPUs the ranks use (CUDA_VISIBLE_DEVICES): a job given GPUs 4-7 and the CPUs of their
        # node needs none of the other node's, where GPUs 0-3 sit unused.
        gpus = [i for i in used if gpu_numa(facts, i) == int(node)]
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
        if (t := matrix_gpu(facts, g.index)) is None:
            continue
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


DEVICE = "the device"


def link_ends(link: PciLink, nvml_width_max: int | None = None) -> list[tuple[str, int]]:
    """What each known end of ``link`` allows: (who, max width), the device first.

    sysfs max_link_width is the device's own capability (LnkCap), not its slot's: an x16 card in
    a slot wired x8 (a board splitting its lanes x8/x8, a riser, a root port with two lanes) trains
    x8 by design. A link trains to the narrower of its two ends, so the port above the device counts,
    and for a GPU NVML's maximum (the card's and its slot's, nvml.h). A bound narrower than the link
    already trained is not this link's other end (a VM's virtual root port advertising x1): left out."""
    out = [(DEVICE, link.max_width)] if link.max_width else []
    for who, other in ((f"its port {link.port}", link.port_max_width), ("NVML's maximum for the GPU and its slot", nvml_width_max)):
        if other and (not link.width or other >= link.width):
            out.append((who, other))
    return out


def link_bound(link: PciLink, nvml_width_max: int | None = None) -> tuple[int | None, str | None]:
    """The widest ``link`` can train, and what other than the device holds it there (None: the device,
    or no end known). Where only the device is known (no port in sight: a VM), its own maximum."""
    ends = link_ends(link, nvml_width_max)
    if not ends:
        return None, None
    who, bound = min(ends, key=lambda e: e[1])  # the device first: it wins a tie
    return bound, None if who == DEVICE else who


def _pcie_links(facts: TopologyFacts) -> list[tuple[str, str | None, PciLink, int | None, Status]]:
    """(who, PCI address, link, NVML's maximum, the status a narrow link earns) of each GPU and NIC with a link."""
    return ([(f"GPU {g.index}", g.pci, g.link, g.nvml_width_max, FAIL) for g in facts.gpus if g.link] +
            [(f"NIC {n.name}", n.pci, n.link, None, WARN) for n in facts.nics if n.link])


def judge_pcie(facts: TopologyFacts) -> list[Finding]:
    """Width from sysfs, against what both ends of the link allow (link_ends): a link below that
    trained short. Speed is not judged: an idle link drops to 2.5 GT/s to save power (links do not
    narrow to save it)."""
    out = []
    for who, pci, link, nvml_max, status in _pcie_links(facts):
        bound, _ = link_bound(link, nvml_max)
        if not (link.width and bound and link.width < bound):
            continue
        ends = link_ends(link, nvml_max)
        said = ", ".join(f"{end} x{width}" for end, width in ends)
        if len(ends) == 1:  # the device alone: nothing says what its slot is wired for
            said += "; no port above it is in sight (a VM shows none), so a slot wired narrower could not be told"
        check = " and ".join(f"`lspci -vv -s {a}`" for a in (pci, link.port) if a)
        out.append(Finding(status, f"{who} PCIe link x{link.width} of x{bound}",
                           f"{who} ({pci})'s PCIe link trained at x{link.width}, held to x{bound}, the narrower of what its ends allow "
                           f"({said}; sysfs current_link_width against max_link_width): it moves at most {link.width / bound:.0%} of its bandwidth",
                           f"reseat the card or its riser; check the slot: LnkSta against LnkCap in {check or '`lspci -vv`'}"))
    return out


def pcie_held(facts: TopologyFacts) -> list[str]:
    """Links narrower than their device allows because the other end is (the design, no finding):
    what each was held to, for the check's lines."""
    out = []
    for who, _, link, nvml_max, _ in _pcie_links(facts):
        bound, by = link_bound(link, nvml_max)
        if by is not None and link.width and bound and link.max_width and link.width >= bound:
            out.append(f"{who} PCIe x{link.width}: held to x{bound} by {by} (the device allows x{link.max_width})")
    return out
