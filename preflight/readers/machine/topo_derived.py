"""The facts of `nvidia-smi topo -m`, built from NVML and sysfs where that matrix
cannot be read (a driver's new layout, nvidia-smi missing, wedged or printing
nothing): nvidia-smi only prints what NVML and the kernel already know, so a
reader's trouble with its text must not cost the node its layout.

Each fact says which source answered it, and a fact no source answers is said
as such (``unanswered``), never filled with a guess a judge would hold the node
to: NVLink pairs (NVML: each link's state and far end), each GPU's NUMA node
(sysfs numa_node, NVML's memory affinity, the node whose CPUs hold the GPU's
local CPUs, the machine's only node), each GPU's CPUs (NVML's CPU affinity,
sysfs local_cpulist) and each GPU-NIC distance (the PCI tree: a bridge in
common is PIX/PXB, the same host bridge PHB, the same NUMA node NODE, else SYS).
"""

from __future__ import annotations

from preflight.base.host import Host
from preflight.base.units import format_cpulist, parse_cpulist
from preflight.readers.machine.layout import GpuPlace, TopologyFacts
from preflight.readers.machine.pcie import bridges_above
from preflight.readers.nvidia.topo import Topo, TopoGpu

SOURCE = "NVML and sysfs"
# The facts a judge needs from the matrix, as the details name them.
LINKS, NUMA, CPUS, NICS = "GPU links (NVLink)", "NUMA node of each GPU", "CPUs of each GPU", "GPU-NIC distance"


def complete(host: Host, facts: TopologyFacts) -> TopologyFacts:
    """``facts`` with a matrix: nvidia-smi's where it was read, else one built from
    NVML and sysfs (``matrix_source`` says which, ``answered``/``unanswered`` each fact)."""
    if facts.matrix is not None:
        answered = dict.fromkeys((LINKS, CPUS, NICS), facts.matrix_source)
        # The kernel's word on a GPU's NUMA node comes first (layout_queries.gpu_numa), the matrix's where it has none.
        placed = [g.numa_node is not None for g in facts.gpus]
        answered[NUMA] = "; ".join((["sysfs numa_node"] if any(placed) else []) + ([facts.matrix_source] if not all(placed) else []))
        return facts.model_copy(update={"answered": answered})
    if not facts.gpus or [g.index for g in facts.gpus] != list(range(len(facts.gpus))):
        return facts  # no GPU, or one NVML lost: nothing to number the matrix by (the cuda check names the lost GPU)
    answered: dict[str, str] = {}
    unanswered: dict[str, str] = {}
    nodes = {int(k): set(parse_cpulist(v)) for k, v in (facts.cpus.nodes if facts.cpus else {}).items()}
    gpus = [_place(g, nodes, answered) for g in facts.gpus]
    links = _links(facts.gpus, unanswered)
    if LINKS not in unanswered and len(facts.gpus) > 1:
        answered[LINKS] = "NVML (each NVLink's state and far end)"
    chains = {g.pci: bridges_above(host, g.pci) for g in facts.gpus}
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            key = f"{a}-{b}"
            if not links.get(key):
                near = _distance(chains[facts.gpus[a].pci], chains[facts.gpus[b].pci], gpus[a], gpus[b], len(nodes))
                links[key] = near or "SYS"  # no judge holds GPUs to a PCIe distance; the notes say where it is a guess
            else:
                links[key] = f"NV{links[key]}"
    nic_cells = _nic_cells(host, facts, gpus, chains, len(nodes), answered, unanswered)
    gpus = [g.model_copy(update={"nics": nic_cells.get(g.index, {})}) for g in gpus]
    notes = [f"built from {SOURCE}: `nvidia-smi topo -m` could not be read (matrix_error says why)"]
    if any(c is None for c in chains.values()):
        notes.append("the PCI tree is hidden (a VM, a flat sysfs): PCIe distances between GPUs are told by NUMA node only")
    matrix = Topo(gpus=gpus, nics=sorted({n for g in gpus for n in g.nics}), links=links,
                  columns=["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"], notes=notes)
    return facts.model_copy(update={"matrix": matrix, "matrix_source": SOURCE, "answered": answered, "unanswered": unanswered})


def _place(g: GpuPlace, nodes: dict[int, set[int]], answered: dict[str, str]) -> TopoGpu:
    cpus, cpu_from = (g.cpu_affinity, "NVML (CPU affinity)") if g.cpu_affinity else (g.local_cpus, "sysfs local_cpulist") if g.local_cpus else (None, None)
    numa, numa_from = _numa(g, set(parse_cpulist(cpus)) if cpus else set(), nodes)
    if cpus is None and numa is not None and len(numa) == 1 and numa[0] in nodes:
        cpus, cpu_from = format_cpulist(nodes[numa[0]]), "sysfs: the CPUs of its NUMA node"
    for fact, source in ((CPUS, cpu_from), (NUMA, numa_from)):
        said = answered[fact].split("; ") if fact in answered else []
        if source and source not in said:  # several GPUs answered from several sources: each is said once
            answered[fact] = "; ".join(said + [source])
    return TopoGpu(index=g.index, cpu_affinity=cpus, cpus=parse_cpulist(cpus) if cpus else None,
                   numa_affinity=format_cpulist(numa) if numa is not None else None, numa_nodes=numa, gpu_numa_id=g.gpu_numa_id)


def _numa(g: GpuPlace, cpus: set[int], nodes: dict[int, set[int]]) -> tuple[list[int] | None, str | None]:
    if g.numa_node is not None:
        return [g.numa_node], "sysfs numa_node"
    if g.numa_affinity:
        return sorted(g.numa_affinity), "NVML (memory affinity)"
    if cpus and (holding := [n for n, node_cpus in nodes.items() if cpus <= node_cpus]):
        return holding[:1], "sysfs: the NUMA node whose CPUs hold its local_cpulist"
    if len(nodes) == 1:
        return list(nodes), "sysfs: the machine's only NUMA node"
    return None, None


def _links(places: list[GpuPlace], unanswered: dict[str, str]) -> dict[str, int]:
    """GPU pair -> NVLinks between them, as `topo -m` counts them: NVSwitch links (the
    fewer of the two GPUs') plus direct links (bridges, a direct mesh)."""
    buses = {g.pci for g in places}
    unknown = [g for g in places if not _knows_links(g, buses)]
    if unknown and len(places) > 1:
        who = ", ".join(str(g.index) for g in unknown)
        unanswered[LINKS] = (f"NVML does not say which GPUs the NVLinks of GPU {who} reach (link state or far end unanswered) "
                             "and `nvidia-smi topo -m` could not be read")
    out = {}
    for a in places:
        for b in places:
            if a.index < b.index and a not in unknown and b not in unknown and a.nvlinks_active and b.nvlinks_active:
                switched = min((a.nvlink_remote or {}).get("switch", 0), (b.nvlink_remote or {}).get("switch", 0))
                direct = [n for n in ((a.nvlink_peers or {}).get(b.pci), (b.nvlink_peers or {}).get(a.pci)) if n]
                out[f"{a.index}-{b.index}"] = switched + (min(direct) if direct else 0)
    return out


def _knows_links(g: GpuPlace, buses: set[str]) -> bool:
    """Whether NVML says where every active link of ``g`` ends. A link of unknown kind
    counts only once its far end is one of the GPUs here: it may as well end at a
    switch, and reading it as no link would fail a healthy board."""
    if g.nvlinks_active is None:
        return False
    if g.nvlinks_active == 0:
        return True  # every link inactive: no NVLink partner
    if g.nvlink_remote is None:
        return False
    to_gpus = g.nvlink_remote.get("gpu", 0) + g.nvlink_remote.get("unknown", 0)
    if not to_gpus:
        return True
    if g.nvlink_peers is None:
        return False
    return not g.nvlink_remote.get("unknown", 0) or sum(n for bus, n in g.nvlink_peers.items() if bus in buses) == to_gpus


def _distance(a: list[str] | None, b: list[str] | None, ga: TopoGpu, gb: TopoGpu, machine_nodes: int) -> str | None:
    """`topo -m`'s PCIe distance between two devices from the bridges above each
    (root port first); by NUMA node alone where the tree is hidden; None: unknown."""
    if a is not None and b is not None and a and b:
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        if common:
            return "PIX" if len(a) - common <= 1 and len(b) - common <= 1 else "PXB"
        if a[0].rpartition(":")[0] == b[0].rpartition(":")[0]:  # root ports on one root bus: one host bridge
            return "PHB"
    na, nb = ga.numa_nodes, gb.numa_nodes
    if machine_nodes == 1:
        return "NODE"
    if na is None or nb is None:
        return None
    return "NODE" if set(na) & set(nb) else "SYS"


def _nic_cells(host: Host, facts: TopologyFacts, gpus: list[TopoGpu], chains: dict[str, list[str] | None], machine_nodes: int,
               answered: dict[str, str], unanswered: dict[str, str]) -> dict[int, dict[str, str]]:
    if not facts.nics:
        answered[NICS] = "sysfs /sys/class/infiniband (no RDMA NIC)"
        return {}
    out: dict[int, dict[str, str]] = {}
    for nic in facts.nics:
        chain = bridges_above(host, nic.pci) if nic.pci else None
        nic_place = TopoGpu(index=0, numa_nodes=[nic.numa_node] if nic.numa_node is not None else None)
        for place, g in zip(facts.gpus, gpus):
            if not chain or not chains[place.pci]:
                # Without the PCI tree a NIC on the GPU's own NUMA node may or may not be behind its switch.
                # No bridge above a device (a VM's flat bus) hides the tree as much as no sysfs entry does.
                unanswered[NICS] = (f"the PCI tree above GPU {g.index} or {nic.name} is hidden (no bridges in sysfs), "
                                    "so whether a NIC sits behind a GPU's PCIe switch is unknown")
                return {}
            link = _distance(chains[place.pci], chain, g, nic_place, machine_nodes)
            if link is None:
                unanswered[NICS] = f"neither the PCI tree nor the NUMA nodes tell how far {nic.name} is from GPU {g.index}"
                return {}
            out.setdefault(g.index, {})[nic.name] = link
    answered[NICS] = "sysfs (the PCI tree above each GPU and NIC)"
    return out
