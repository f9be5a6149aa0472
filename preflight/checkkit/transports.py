"""Which transport NCCL's channels used between two GPUs of one node, judged.

NCCL sets up the channels a collective needs when it first runs at that size
and algorithm: the nccl check's smoke test shows the small and 32 MiB
collectives' rings, the bandwidth check's stage the large collectives' (more
channels, NVLS where it is on). Each check judges the channels its own stage's
NCCL lines show (preflight/gpuwork/world.py gives each stage its own lines).
"""

from __future__ import annotations

from collections import defaultdict

from preflight.base.findings import Finding, Status
from preflight.gpuwork import ranks
from preflight.pipeline.check import Context
from preflight.pipeline.expectations import NcclExpect
from preflight.pipeline.shape import FABRIC_WORDS, NodeShape
from preflight.readers.nccl import nccl_env, nccl_log
from preflight.readers.nvidia import nvml
from preflight.readers.nvidia.nvml_facts import Inventory

FAIL, WARN = Status.FAIL, Status.WARN
REMEDY = (
    "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL; check NVLink (`nvidia-smi nvlink -s`) and nvidia-fabricmanager; "
    "in a container allow IPC (--ipc=host); disable PCI ACS / IOMMU translation for P2P over PCIe"
)


def p2p_for_shape(expect: NcclExpect, shape: NodeShape | None) -> NcclExpect:
    """The profile's "P2P or fail" is for GPUs joined by NVLink. On a node whose
    GPUs are joined by PCIe only (a VM slice, bridge-less cards), P2P is a bonus
    that ACS, an IOMMU or the hypervisor may forbid: a fallback warns. On an
    NVSwitch it fails, whatever a profile of no one board (generic) says."""
    if shape is not None and shape.fabric == "nvswitch" and expect.p2p != "fail":
        # Every pair on an NVSwitch is joined by NVLink, whether or not the topology matrix could be read.
        why = f"this node's GPUs are {FABRIC_WORDS[shape.fabric]} ({shape.fabric_from}): every pair is joined by NVLink"
        return expect.model_copy(update={"p2p": "fail", "p2p_source": why})
    if expect.p2p != "fail" or shape is None or shape.fabric in ("nvswitch", "nvlink", "unknown"):
        return expect
    why = f"this node's GPUs are {FABRIC_WORDS[shape.fabric]} ({shape.fabric_from}): P2P over PCIe is not promised"
    return expect.model_copy(update={"p2p": "warn", "p2p_source": why})


def without_p2p_here(ctx: Context) -> set[frozenset[int]]:
    """without_p2p of the run's NVML facts; none where NVML is silent (the cuda check says why)."""
    if not ctx.profile.has_gpus:
        return set()
    try:
        return without_p2p(ctx.inventory(timeout=min(10.0, ranks.time_left(ctx.deadline))))
    except nvml.NvmlUnavailable:
        return set()


# NVIDIA's driver refuses P2P over PCIe between GeForce cards whatever the platform (a patched driver,
# tinygrad/open-gpu-kernel-modules, is what enables it), and NVML words the refusal per driver:
# GNS (2x RTX 5090: noonghunna/club-3090#1130) or CNS (RTX 3090 pairs without a bridge, an 8x
# RTX 5090 server, RTX 5080 with a 5070 Ti: public `nvidia-smi topo -p2p r` captures; 8x RTX 3090
# "CANNOT Access Peer": NVIDIA/nccl#1127). NCCL gives a pair P2P only where NVML says OK
# (src/graph/paths.cc ncclTopoCheckP2p).
BY_DESIGN = ("gpu_not_supported",)
GEFORCE_BY_DESIGN = ("gpu_not_supported", "chipset_not_supported")


def without_p2p(inventory: Inventory | None) -> set[frozenset[int]]:
    """GPU pairs (nvidia-smi indices) NVML says cannot do P2P over PCIe by the GPU's design
    (NVML_P2P_STATUS_GPU_NOT_SUPPORTED, `nvidia-smi topo -p2p r` GNS; between GeForce cards
    also CNS, BY_DESIGN's comment): NCCL's SHM between them is how such a node works, never a
    finding. CNS between other GPUs (ACS, an IOMMU, a hypervisor) stays the fallback it is."""
    gpus = inventory.gpus if inventory else []
    index = {g.pci_bus_id.lower(): g for g in gpus}
    out = set()
    for g in gpus:
        for bus, said in (g.p2p_read or {}).items():
            other = index.get(bus.lower())
            geforce = other is not None and "GeForce" in g.name and "GeForce" in other.name
            if other is not None and said in (GEFORCE_BY_DESIGN if geforce else BY_DESIGN):
                out.add(frozenset((g.index, other.index)))
    return out


def judge(log: nccl_log.NcclLog | None, outcomes: list[ranks.RankOutcome], env: dict[str, list[tuple[str, str]]], expect: NcclExpect,
          nvlink_pairs: set[frozenset[int]], switch_pairs: set[frozenset[int]] | None = None, during: str = "",
          by_design: set[frozenset[int]] | None = None) -> list[Finding]:
    """Two ranks on this node should talk P2P (or NVLS). SHM between GPUs with
    NVLink fails; elsewhere it earns the profile's ``p2p`` status, but where
    the topology is known only for GPUs under one PCIe switch (``switch_pairs``:
    PIX/PXB), since NCCL's default P2P level stops at PXB on purpose. A network
    between two ranks of one node always fails. ``during`` names the collectives
    in the summary (" in the large collectives"); ``env`` is NCCL's settings (nccl_env);
    ``by_design``: pairs whose GPUs cannot do P2P over PCIe at all (without_p2p)."""
    if log is None:
        return []
    # NCCL's log numbers ranks across the whole group; a node's outcomes know both numbers.
    hosts = {(o.rank if o.global_rank is None else o.global_rank): o.report.host for o in outcomes if o.report}
    gpu = {(o.rank if o.global_rank is None else o.global_rank): o.gpu for o in outcomes}
    out: list[Finding] = []
    by_status: dict[Status, list[str]] = defaultdict(list)
    for (a, b), transports in sorted(log.peers().items()):
        if hosts.get(a) is None or hosts.get(a) != hosts.get(b):
            continue  # across nodes a network is right; unknown ranks cannot be judged
        kinds = {t.split("/")[0] for t in transports}
        if kinds <= {"P2P", "NVLS"}:
            continue
        pair = f"rank {a} ({gpu.get(a)}) -> rank {b} ({gpu.get(b)}) via {', '.join(transports)}"
        ga, gb = ranks.gpu_index(gpu.get(a)), ranks.gpu_index(gpu.get(b))
        nvlinked = ga is not None and gb is not None and frozenset((ga, gb)) in nvlink_pairs
        if "NET" in kinds:
            by_status[FAIL].append(pair)
        elif nvlinked or expect.p2p == "fail":
            by_status[FAIL].append(pair)
        elif ga is not None and gb is not None and frozenset((ga, gb)) in (by_design or set()):
            continue  # the GPUs cannot do P2P over PCIe: host memory is this node's way, not a fallback
        elif expect.p2p == "warn" and (switch_pairs is None or (ga is not None and gb is not None and frozenset((ga, gb)) in switch_pairs)):
            by_status[WARN].append(pair)
    switches = [f"{name}={value}" for name, value, _, _ in nccl_env.switches_on(env) if name != "NCCL_IB_DISABLE"]
    hint = f" ({', '.join(switches)} set)" if switches else ""
    for status, pairs in by_status.items():
        shown = "; ".join(pairs[:4]) + (f"; and {len(pairs) - 4} more" if len(pairs) > 4 else "")
        cause = f"{len(pairs)} pair(s) of GPUs on this node do not use P2P{during}{hint}: {shown}; {expect.p2p_source or ''}".rstrip("; ")
        out.append(Finding(status, f"GPUs fall back from P2P{during} ({len(pairs)} pairs)", cause, REMEDY))
    return out
