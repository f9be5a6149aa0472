"""How to pin each local rank to its GPU's NUMA node, CPUs and nearest NIC,
from the layout the topology check read (readers.layout); and which GPU pairs
that check found linked, for the checks after it (nccl, bandwidth).
"""

from __future__ import annotations

from pydantic import BaseModel

from preflight.base.host import Host
from preflight.base.units import format_cpulist, parse_cpulist
from preflight.pipeline.check import Result
from preflight.readers.machine.layout import TopologyFacts, machine_cpus
from preflight.readers.machine.layout_queries import gpu_count, gpu_numa, matrix_gpu, numa_unknown, rank_gpus, socket_groups
from preflight.readers.machine.topo_derived import LINKS


class RankAdvice(BaseModel):
    local_rank: int
    gpu: int
    numa_node: int | None = None
    cpus: str | None = None  # the CPUs of that node this process may use
    nic: str | None = None  # the nearest NIC(s): what NCCL will pick for this GPU
    nic_link: str | None = None
    numactl: str | None = None


class Advice(BaseModel):
    bind: bool  # the GPUs span NUMA nodes, so pinning ranks matters
    summary: str
    ranks: list[RankAdvice] = []
    launch: list[str] = []  # whole commands, for train.py on this node


def _rank(facts: TopologyFacts, r: int, gpu: int, allowed: set[int] | None) -> RankAdvice:
    m, row = facts.matrix, matrix_gpu(facts, gpu)
    node = gpu_numa(facts, gpu)
    cpus = None
    if node is not None and facts.cpus and str(node) in facts.cpus.nodes:
        cpus = set(parse_cpulist(facts.cpus.nodes[str(node)]))
    elif row is not None and row.cpus:
        cpus = set(row.cpus)
    if cpus is not None and allowed is not None:
        cpus &= allowed
    near = m.nearest_nics.get(str(row.index), []) if m and row is not None else []  # the matrix's row, not NVML's number
    return RankAdvice(
        local_rank=r, gpu=gpu, numa_node=node, cpus=format_cpulist(cpus) if cpus else None,
        nic=",".join(near) or None, nic_link=row.nics[near[0]] if near and row is not None else None,
        numactl=f"numactl --cpunodebind={node} --membind={node}" if node is not None else None,
    )


def advise(facts: TopologyFacts) -> Advice:
    n = gpu_count(facts)
    if not n:
        return Advice(bind=False, summary="no GPU: nothing to pin")
    allowed = set(parse_cpulist(facts.cpus.allowed)) if facts.cpus else None
    ranks = [_rank(facts, r, gpu, allowed) for r, gpu in enumerate(rank_gpus(facts, n))]
    if not ranks:
        return Advice(bind=False, summary=f"CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices!r} leaves the job no GPU of this machine: nothing to pin")
    nodes = sorted({r.numa_node for r in ranks if r.numa_node is not None})
    unknown = [r.gpu for r in ranks if numa_unknown(facts, r.gpu)]
    several = (facts.cpus is not None and len(facts.cpus.nodes) > 1) or socket_groups(facts) > 1
    if unknown and several:
        return Advice(bind=True, summary=f"the NUMA node of GPU {format_cpulist(unknown)} is unknown on a machine with several: "
                      "bind each rank by hand to the CPU list below (`taskset -c CPUS`)", ranks=ranks)
    if len(nodes) < 2:
        if not nodes:
            return Advice(bind=False, summary="every GPU is affine to the same NUMA nodes: no per-rank binding needed", ranks=ranks)
        machine_nodes = len(facts.cpus.nodes) if facts.cpus else 1
        launch = [f"numactl --cpunodebind={nodes[0]} --membind={nodes[0]} torchrun --nproc-per-node={len(ranks)} train.py"] if machine_nodes > 1 else []
        summary = f"every GPU is on NUMA node {nodes[0]}: no per-rank binding needed"
        return Advice(bind=False, summary=summary + (_caveats(facts, ranks) if launch else ""), ranks=ranks, launch=launch)
    split = ", ".join(f"{node} (GPU {format_cpulist([r.gpu for r in ranks if r.numa_node == node])})" for node in nodes)
    launch = []
    if facts.torch_numa_binding is not False:  # None: a capture from elsewhere, whose torch is unknown
        launch.append(f"torchrun --numa-binding=node --nproc-per-node={len(ranks)} train.py")
    if all(r.numa_node is not None for r in ranks):
        order = " ".join(str(r.numa_node) for r in ranks)
        launch.append(f"torchrun --nproc-per-node={len(ranks)} --no-python sh -c 'n=$(echo {order} | cut -d\" \" -f$((LOCAL_RANK + 1))); "
                      "exec numactl --cpunodebind=$n --membind=$n python train.py'")
    how = {True: "torchrun's --numa-binding=node, or numactl per rank",
           False: "numactl per rank (this torch's torchrun has no --numa-binding)",
           None: "torchrun's --numa-binding=node where the installed torchrun has it, else numactl per rank"}[facts.torch_numa_binding]
    summary = f"GPUs on NUMA nodes {split}: bind each rank to its GPU's node with {how}"
    return Advice(bind=True, summary=summary + _caveats(facts, ranks), ranks=ranks, launch=launch)


def _caveats(facts: TopologyFacts, ranks: list[RankAdvice]) -> str:
    """What would make the advised binding fail on this machine."""
    out = ""
    if facts.live and (starved := [r for r in ranks if r.numa_node is not None and r.cpus is None]):
        out += (f"; but this process's cpuset has no CPU on NUMA node {format_cpulist({r.numa_node for r in starved})} "  # type: ignore[misc]
                f"(GPU {format_cpulist([r.gpu for r in starved])}), so binding there is refused until the cpuset is widened")
    if facts.numactl is False:
        out += "; numactl is not installed here (apt install numactl, or dnf install numactl)"
    return out


def linked_pairs(result: Result | None, kinds: tuple[str, ...]) -> set[frozenset[int]] | None:
    """Pairs of GPUs (nvidia-smi indices) whose `nvidia-smi topo -m` link in the
    topology check's result starts with one of ``kinds`` ("NV" for NVLink, "PIX"/"PXB"
    for one PCIe switch); None where the check did not read a matrix, or no source told its NVLinks."""
    matrix = result.details.get("matrix") if result else None
    if not matrix or not matrix.get("links"):
        return None
    if "NV" in kinds and LINKS in (result.details.get("unanswered") or {}):  # type: ignore[union-attr]
        return None  # built without NVML's word on the links: its cells hold no NVLink, known or not
    pairs = set()
    for key, kind in matrix["links"].items():
        a, _, b = key.partition("-")
        if str(kind).startswith(kinds) and a.isdigit() and b.isdigit():
            pairs.add(frozenset((int(a), int(b))))
    return pairs


def numa_nodes(result: Result | None, host: Host) -> int | None:
    """How many NUMA nodes with CPUs this machine has: the topology check's reading,
    else sysfs. One node leaves nothing to bind a rank to; None: neither says."""
    cpus = result.details.get("cpus") if result else None
    if isinstance(cpus, dict) and cpus.get("nodes"):
        return len(cpus["nodes"])
    try:
        return len(machine_cpus(host).nodes) or None
    except OSError:
        return None
