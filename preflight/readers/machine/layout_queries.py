"""What the topology facts (readers/machine/layout.py) say, asked by the judges and the
advice alike: each GPU's NUMA node and socket, how many nodes and sockets the GPUs span,
and which GPU each local rank gets. Pure functions of TopologyFacts, no reading."""

from __future__ import annotations

from preflight.readers.machine.layout import TopologyFacts
from preflight.readers.nvidia.topo import TopoGpu
from preflight.readers.nvidia.visible_devices import cuda_visible


def nvlink_count(link: str) -> int:
    """NVLinks in a `topo -m` cell: NV18 -> 18; any other link (SYS, PIX, ...) 0."""
    return int(link[2:]) if link.startswith("NV") else 0


def gpu_numa(facts: TopologyFacts, index: int) -> int | None:
    """The NUMA node of GPU ``index``: the kernel's word first, then nvidia-smi's."""
    for g in facts.gpus:
        if g.index == index and g.numa_node is not None:
            return g.numa_node
    t = matrix_gpu(facts, index)
    if t is not None and t.numa_nodes and len(t.numa_nodes) == 1:
        return t.numa_nodes[0]
    return None


def matrix_gpu(facts: TopologyFacts, index: int) -> TopoGpu | None:
    """nvidia-smi's row for NVML's GPU ``index`` (``matrix_position``), or None."""
    pos = matrix_position(facts, index)
    return facts.matrix.gpus[pos] if facts.matrix and pos is not None else None


def matrix_position(facts: TopologyFacts, index: int) -> int | None:
    """The matrix row (its GPUn) of NVML's GPU ``index``. Under a device cgroup (Slurm's
    ConstrainDevices) NVML keeps the node's numbers (GPUs 4-7 answer, 0-3 are refused, nvml.h on
    nvmlDeviceGetCount_v2) while nvidia-smi numbers the GPUs it may open from 0, in PCI order
    (`nvidia-smi -L` in a job's cgroup prints its one GPU as GPU 0: NVIDIA/deepops#1102,
    guilbaults/slurm-job-exporter#63). Where the two list the same number of GPUs, row k is the
    k-th in PCI order; else NVML's number, where the matrix has that row."""
    m = facts.matrix
    if m is None:
        return None
    order = gpu_indices(facts) if facts.gpus else []
    if order and len(order) == len(m.gpus):
        return order.index(index) if index in order else None
    return index if 0 <= index < len(m.gpus) else None


def gpu_count(facts: TopologyFacts) -> int:
    return len(facts.gpus) or (len(facts.matrix.gpus) if facts.matrix else 0)


def numa_unknown(facts: TopologyFacts, index: int) -> bool:
    """Nobody says where GPU ``index`` sits (a GPU affine to several nodes, "0-1", is known)."""
    if gpu_numa(facts, index) is not None:
        return False
    t = matrix_gpu(facts, index)
    return not (t is not None and t.numa_nodes)


def socket_groups(facts: TopologyFacts) -> int:
    """How many disjoint CPU sets the GPUs' affinities form: sockets, where NUMA numbers are missing."""
    m = facts.matrix
    return len(m.cpu_groups) if m and m.spans_numa and all(g.cpus for g in m.gpus) else 0


def numa_span(facts: TopologyFacts) -> int:
    """NUMA nodes the GPUs sit on; where their numbers are missing, the disjoint CPU sets stand for them."""
    return max(len({node for i in gpu_indices(facts) if (node := gpu_numa(facts, i)) is not None}), socket_groups(facts))


def socket_span(facts: TopologyFacts) -> int | None:
    """Sockets the GPUs sit on, by their NUMA nodes' physical packages (sysfs); None where a GPU's
    node is unknown or its socket is (a saved capture, a memory-only node): the node count then stands."""
    packages = facts.cpus.packages if facts.cpus is not None else {}
    nodes = [gpu_numa(facts, i) for i in gpu_indices(facts)]
    if not nodes or any(n is None or str(n) not in packages for n in nodes):
        return None
    return len({packages[str(n)] for n in nodes})


def gpu_indices(facts: TopologyFacts) -> list[int]:
    """The GPUs' indices in CUDA's order (PCI bus order, the launch's CUDA_DEVICE_ORDER), as NVML
    numbers them: under a device cgroup NVML may list GPUs 4-7 alone. Without NVML's word, the
    matrix's GPUs by position."""
    if facts.gpus:
        return [g.index for g in sorted(facts.gpus, key=lambda g: g.pci.lower())]
    return list(range(len(facts.matrix.gpus) if facts.matrix else 0))


def rank_gpus(facts: TopologyFacts, n: int) -> list[int]:
    """GPU index of each local rank: torch's cuda:r is the r-th visible GPU.

    Unset, every GPU in PCI order: what CUDA_DEVICE_ORDER=PCI_BUS_ID gives,
    and what the default FASTEST_FIRST gives on a node of identical GPUs."""
    present = gpu_indices(facts) or list(range(n))
    if facts.cuda_visible_devices is None:
        return present
    uuids: list[str | None] = [g.uuid for g in sorted(facts.gpus, key=lambda g: g.pci.lower())] if facts.gpus else [None] * len(present)
    return [present[i] for i in cuda_visible(facts.cuda_visible_devices, uuids).picked]
