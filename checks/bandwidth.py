"""Bandwidth floors: measure what training speed depends on and judge each
figure against the SKU's floor.

A node with a PCIe link trained at x8, P2P disabled, a degraded NVSwitch or
a throttled GPU answers every yes/no question right and then trains at a
fraction of the speed; only a measurement catches it. One torchrun launch
(checks/workers/bandwidth.py) times HBM copies, pinned host<->device copies
(each rank bound to its GPU's NUMA node, from the topology check), copies
between every ordered pair of GPUs, large all_reduce / all_gather /
reduce_scatter and small all_reduce latency. On the cpu profile: host memcpy
and the same collectives over gloo.

The worker repeats each figure until the 95% interval of its median is within
the profile's tolerance or a cap is reached, and reports every timed repeat;
the arithmetic is here, in pure functions: a figure is the median of the
repeats (with how sure it is, and whether it converged), a collective's repeat
lasts as long as its slowest rank, bus bandwidth follows nccl-tests
(doc/PERFORMANCE.md). A figure under its floor FAILs naming the GPU, pair
or direction; within the profile's margin above it WARNs (marginal node).
Before a figure FAILs, the steps that measured it run again, once
(preflight/checkkit/confirm.py): under the floor twice is "confirmed", once "transient" (WARN).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import ClassVar, NamedTuple

from pydantic import BaseModel, Field

from preflight.checkkit import figures as figs_mod
from preflight.checkkit import confirm
from preflight.checkkit import nvls as nvls_mod
from preflight.checkkit import outliers
from preflight.checkkit.placement import linked_pairs, numa_nodes
from preflight.gpuwork import launch, meeting, ranks
from preflight.pipeline import floor_bounds, shape
from preflight.pipeline.check import Check, Context, Result
from preflight.readers import nccl_env, nvml
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.expectations import BandwidthExpect, OutlierExpect
from preflight.base.units import fmt_value
from preflight.checkkit import transports
from preflight.readers import nccl_env, nccl_log as nccl_lines

FAIL, WARN = Status.FAIL, Status.WARN
BPS, SECONDS = "bytes_per_second", "seconds"

# Floor name -> (unit, bound). Every floor this check may read; the pipeline
# refuses a profile whose floor of that name has another unit or bound.
FLOORS = {
    "hbm_copy_bandwidth": (BPS, "min"),
    "h2d_bandwidth": (BPS, "min"),
    "d2h_bandwidth": (BPS, "min"),
    "p2p_bandwidth": (BPS, "min"),
    "memcpy_bandwidth": (BPS, "min"),
    "allreduce_bus_bandwidth": (BPS, "min"),
    "allreduce_bus_bandwidth_ring": (BPS, "min"),  # where NCCL ran rings, not NVLS (checkkit/nvls.py)
    "allgather_bus_bandwidth": (BPS, "min"),
    "reducescatter_bus_bandwidth": (BPS, "min"),
    "allreduce_latency": (SECONDS, "max"),  # p50 of the blocking small all_reduce
    "allreduce_latency_p99": (SECONDS, "max"),
    # Across nodes (--nnodes): the network between them sets these, not NVLink.
    "internode_allreduce_bus_bandwidth": (BPS, "min"),
    "internode_allgather_bus_bandwidth": (BPS, "min"),
    "internode_reducescatter_bus_bandwidth": (BPS, "min"),
    "internode_allreduce_latency": (SECONDS, "max"),
}
# Step in the worker -> the figure's name (= its floor's name and its metric's).
PER_DEVICE = {"hbm_copy": "hbm_copy_bandwidth", "memcpy": "memcpy_bandwidth", "h2d": "h2d_bandwidth", "d2h": "d2h_bandwidth", "p2p": "p2p_bandwidth"}
# Floors a run over fewer ranks than the node's cannot be held to (busbw and latency depend on the rank count).
WHOLE_NODE = ("allreduce_bus_bandwidth", "allreduce_bus_bandwidth_ring", "allgather_bus_bandwidth", "reducescatter_bus_bandwidth", "allreduce_latency", "allreduce_latency_p99")
COLLECTIVE = {"all_reduce": "allreduce_bus_bandwidth", "all_gather": "allgather_bus_bandwidth", "reduce_scatter": "reducescatter_bus_bandwidth"}
INTERNODE = {name: f"internode_{name}" for name in COLLECTIVE.values()}
INTERNODE_FLOORS = tuple(name for name in FLOORS if name.startswith("internode_"))

WORDS = {
    "hbm_copy_bandwidth": "HBM copy",
    "memcpy_bandwidth": "host memcpy",
    "h2d_bandwidth": "host->device copy",
    "d2h_bandwidth": "device->host copy",
    "p2p_bandwidth": "GPU->GPU copy",
    "allreduce_bus_bandwidth": "all_reduce bus bandwidth",
    "allgather_bus_bandwidth": "all_gather bus bandwidth",
    "reducescatter_bus_bandwidth": "reduce_scatter bus bandwidth",
    "allreduce_latency": "small all_reduce latency p50",
    "allreduce_latency_p99": "small all_reduce latency p99",
    "allreduce_graph_latency": "small all_reduce latency in a CUDA graph",
    "internode_allreduce_bus_bandwidth": "inter-node all_reduce bus bandwidth",
    "internode_allgather_bus_bandwidth": "inter-node all_gather bus bandwidth",
    "internode_reducescatter_bus_bandwidth": "inter-node reduce_scatter bus bandwidth",
    "internode_allreduce_latency": "inter-node small all_reduce latency p50",
    "internode_allreduce_latency_p99": "inter-node small all_reduce latency p99",
}
_COLL = (
    "NCCL left NVLink for SHM or sockets (the nccl check's transports; NCCL_P2P_DISABLE, NCCL_P2P_LEVEL), "
    "an NVLink or NVSwitch port down (`nvidia-smi nvlink -s`, nvidia-fabricmanager), one slow or throttled GPU holding every step back, "
    "NCCL_ALGO / NCCL_PROTO / NCCL_*CHANNELS pinned in the environment, or ranks starved of CPU"
)
REASONS = {
    "hbm_copy_bandwidth": "clocks held down (power brake, thermal or HW slowdown: `nvidia-smi -q -d PERFORMANCE,CLOCK`), a power cap below default, "
    "another process on the GPU, or failing HBM (run `dcgmi diag -r 3`)",
    "memcpy_bandwidth": "other work on the host, CPU frequency scaling, memory on a remote NUMA node, or a VM's memory bandwidth cap",
    "h2d_bandwidth": "a PCIe link trained below its width or generation (the cuda check; `nvidia-smi -q -d PCIE`, `lspci -vv` LnkSta), "
    "the rank not on its GPU's NUMA node (details.binding), IOMMU/ACS translation, or a PCIe switch uplink shared with busy NICs",
    "p2p_bandwidth": "P2P not possible or disabled (peer access, IOMMU/ACS on PCIe), an NVLink down (`nvidia-smi nvlink -s`), "
    "nvidia-fabricmanager not running on NVSwitch boards, or a throttled GPU",
    "allreduce_bus_bandwidth": _COLL,
    "allgather_bus_bandwidth": _COLL,
    "reducescatter_bus_bandwidth": _COLL,
    "allreduce_latency": "ranks starved of CPU (too few vCPUs per GPU, a cpuset or quota), CPU power saving (C-states, frequency), "
    "NCCL_PROTO forcing Simple, NCCL falling back to sockets, or interrupts on the ranks' cores",
}
_NET = (
    "NCCL on sockets instead of IB/RoCE or without GPUDirect RDMA (the nccl check's network findings; nvidia_peermem), "
    "a NIC port down or trained at a lower speed (`ibstat`, `ethtool`), a congested or misconfigured fabric (PFC/ECN on RoCE), "
    "or one slow node dragging the group (find it with `preflight pairwise`)"
)
REASONS.update({name: _NET for name in INTERNODE.values()})
REASONS["internode_allreduce_latency"] = _NET
REASONS["d2h_bandwidth"] = REASONS["h2d_bandwidth"]
REASONS["allreduce_latency_p99"] = REASONS["allreduce_latency"]


class StepResult(BaseModel):
    step: str
    bytes: int = 0
    moved_bytes: int | None = None  # bytes a repeat moves (a copy reads and writes: 2 x bytes)
    seconds: list[float] = Field(default_factory=list)  # every timed repeat, warm-up excluded
    samples: list[float] = Field(default_factory=list)  # latency: every blocking iteration
    sets: int = 1
    clamped: str | None = None
    src: int | None = None  # p2p: the local rank (GPU) copied from; None: the reporting rank's (an older worker)
    peer: int | None = None  # p2p: the local rank (GPU) written to
    peer_access: bool | None = None
    src_pci_bus_id: str | None = None
    peer_pci_bus_id: str | None = None
    ops_per_repeat: int = 1
    error: str | None = None
    stopped: str | None = None  # why the worker stopped repeating: converged, max_repeats or max_seconds
    tolerance: float | None = None  # what it repeated towards (the profile's); None: an older worker, not judged


class Setup(BaseModel):
    """What a rank made before timing a step (p2p: local rank 0's contexts on the other GPUs and every GPU's buffers)."""

    by: str = "local rank 0"
    gpus: int = 0
    contexts: int = 0
    contexts_seconds: float = 0.0
    buffers_seconds: float = 0.0
    bytes_per_gpu: int = 0


class RankReport(ranks.RankReport):
    """What checks/workers/bandwidth.py writes for one rank."""

    steps: list[str] = Field(default_factory=list)
    step: int = 0
    results: list[StepResult] = Field(default_factory=list)
    binding: dict | None = None
    cache_bytes: int | None = None
    step_seconds: dict[str, float] = Field(default_factory=dict)  # wall time of each step on this rank
    setup: dict[str, Setup] = Field(default_factory=dict)  # step -> what this rank made before timing it
    reading: int = 1  # 2: the launch that measures again to confirm a figure beyond its floor

    def progress(self) -> int:
        return self.step


class BandwidthFacts(ranks.RunFacts):
    steps: list[str] = Field(default_factory=list)
    binding: dict[str, dict] = Field(default_factory=dict)  # local rank -> {node, cpus} asked for
    numa_nodes: int | None = None  # NUMA nodes with CPUs on this machine: with one, there is nothing to bind to
    uuids: dict[int, str] = Field(default_factory=dict)  # nvidia-smi index -> GPU UUID (cuda check)
    left_out: str | None = None  # why a step the node would run was left out (p2p on GPUs in EXCLUSIVE_PROCESS mode)
    # This stage's own NCCL lines (each rank's, from the launch's log cut at the stage: gpuwork/world.py):
    # the large collectives' connections, NVLS among them. None: NCCL wrote nothing here (gloo).
    nccl_log: nccl_lines.Summary | None = None
    nccl: nccl_lines.NcclLog | None = Field(default=None, exclude=True)  # the same lines whole, for the transport judge


Figure, median, quantile, spread = figs_mod.Figure, figs_mod.median, figs_mod.quantile, figs_mod.spread


# ---- arithmetic (nccl-tests' definitions) ---------------------------------------


def bus_factor(collective: str, n: int) -> float:
    """busbw = algbw x this (nccl-tests doc/PERFORMANCE.md): the factor that makes
    every collective's figure comparable to the hardware's link speed."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"no bus bandwidth factor for {collective!r}")


def algbw(nbytes: float, seconds: float) -> float:
    """Bytes per second; ``nbytes`` is the whole buffer (all_gather's output, reduce_scatter's input)."""
    return nbytes / seconds


def figures(f: BandwidthFacts) -> list[Figure]:
    """Every figure the ranks' repeats give: per device, per pair, per collective."""
    out: list[Figure] = []
    gpu = {o.rank: o.gpu for o in f.ranks}
    reports = {o.rank: o.report for o in f.ranks if isinstance(o.report, RankReport)}
    by_step: dict[str, dict[int, StepResult]] = defaultdict(dict)
    for r, rep in reports.items():
        for res in rep.results:
            if res.step in PER_DEVICE and res.seconds and res.moved_bytes:
                out.append(_device_figure(f, source(r, res), res, gpu))
            elif res.step not in PER_DEVICE:
                by_step[res.step][r] = res
    n = f.nproc  # this node's ranks: the only reports it reads
    # Across nodes the collective spans every node's ranks: busbw's factor is the world's,
    # and its figures are judged by the inter-node floors.
    world = max((rep.world_size for rep in reports.values()), default=n)
    group = world > n
    where = f"{world} ranks on {world // n} nodes" if group else f"{n} ranks"
    for step, name in COLLECTIVE.items():
        got = by_step.get(step, {})
        if len(got) == n and world > 1 and all(x.seconds for x in got.values()):
            # A repeat is over when its slowest rank is done.
            times = [max(ts) for ts in zip(*(x.seconds for x in got.values()))]
            first = next(iter(got.values()))
            value = algbw(first.bytes, median(times)) * bus_factor(step, world)
            name = INTERNODE.get(name, name) if group else name
            out.append(Figure(name=name, unit=BPS, value=value, where=where, labels={"collective": step}, bytes=first.bytes, repeats=len(times), spread=spread(times),
                              **figs_mod.sureness(times, first.tolerance, first.stopped)))
    lat = by_step.get("latency", {})
    if len(lat) == n and all(x.samples for x in lat.values()):
        stats = ((0.5, "p50", "allreduce_latency"), (0.99, "p99", "allreduce_latency_p99"))
        if group:
            stats = ((0.5, "p50", "internode_allreduce_latency"), (0.99, "p99", "internode_allreduce_latency_p99"))  # p99: no floor, information
        for q, stat, floor in stats:
            per_rank = {r: quantile(x.samples, q) for r, x in lat.items()}
            worst_rank = max(per_rank, key=lambda r: per_rank[r])
            res = lat[worst_rank]
            # The worker repeats until each rank's p50 is sure; the p99 of a few hundred samples has no such interval.
            sure = figs_mod.sureness(res.samples, res.tolerance, res.stopped) if stat == "p50" else {}
            out.append(Figure(name="internode_allreduce_latency" if group else "allreduce_latency", floor=floor, unit=SECONDS, value=per_rank[worst_rank],
                              where=f"slowest of {len(lat)} ranks{' on this node' if group else ''}: {_who(worst_rank, gpu)}",
                              labels={"stat": stat}, bytes=res.bytes, repeats=len(res.samples), rank=worst_rank, **sure))
    graph = by_step.get("graph_latency", {})
    if len(graph) == n and not group and all(x.seconds for x in graph.values()):
        first = next(iter(graph.values()))
        # Each repeat replays ops_per_repeat all_reduces: the slowest rank's replay, per op.
        times = [max(ts) / first.ops_per_repeat for ts in zip(*(x.seconds for x in graph.values()))]
        out.append(Figure(name="allreduce_graph_latency", unit=SECONDS, value=median(times), where=f"{n} ranks", bytes=first.bytes, repeats=len(times), spread=spread(times),
                          **figs_mod.sureness(times, first.tolerance, first.stopped)))
    return out


def source(rank: int, res: StepResult) -> int:
    """The local rank (GPU) a figure belongs to: a P2P pair's source, which local rank 0
    measures for every pair, else the rank that measured it."""
    return res.src if res.src is not None else rank


def _device_figure(f: BandwidthFacts, r: int, res: StepResult, gpu: dict[int, str | None]) -> Figure:
    name = PER_DEVICE[res.step]
    med = median(res.seconds)
    labels, where = ranks.labels(r, gpu.get(r), f.uuids), _who(r, gpu)
    if res.peer is not None:
        peer = gpu.get(res.peer) or f"local rank {res.peer}"  # one node: the peer is a local rank
        labels["peer_gpu"] = peer.removeprefix("GPU ")
        where = f"{where} -> {peer}"
    return Figure(name=name, unit=BPS, value=res.moved_bytes / med, where=where, labels=labels, bytes=res.bytes,  # type: ignore[operator]
                  repeats=len(res.seconds), spread=spread(res.seconds), rank=r, **figs_mod.sureness(res.seconds, res.tolerance, res.stopped))


def _who(r: int, gpu: dict[int, str | None]) -> str:
    return gpu.get(r) or f"rank {r}"


# ---- judging -------------------------------------------------------------------


RERUN = "preflight run --only bandwidth"


def judge_floors(figs: list[Figure], floors: dict[str, ResolvedFloor], margin: float) -> list[Finding]:
    return figs_mod.judge_floors(figs, floors, margin, WORDS, REASONS, RERUN)


# Per GPU, per pair or per rank: each is also judged against the node's own median (checkkit/outliers.py).
MEMBERS = tuple(PER_DEVICE.values())


def link_kinds(topology: Result | None) -> dict[frozenset[int], str]:
    """GPU pair -> its `nvidia-smi topo -m` link ("NV18", "PIX", "SYS"), from the topology check."""
    matrix = topology.details.get("matrix") if topology else None
    out = {}
    for key, kind in ((matrix or {}).get("links") or {}).items():
        a, _, b = str(key).partition("-")
        if a.isdigit() and b.isdigit():
            out[frozenset((int(a), int(b)))] = str(kind)
    return out


def cohort(kinds: dict[frozenset[int], str], all_nvlink: bool):
    """Which P2P pairs share a median: those over the same kind of link (an NVLink pair is
    not slow next to a pair that crosses the CPUs' interconnect). A pair whose link is not
    known is judged only on an NVSwitch board, where every pair's path is alike."""
    def of(g: Figure) -> str | None:
        if g.key != "p2p_bandwidth":
            return ""
        a, b = ranks.gpu_index(f"GPU {g.labels.get('gpu')}"), ranks.gpu_index(f"GPU {g.labels.get('peer_gpu')}")
        kind = kinds.get(frozenset((a, b))) if a is not None and b is not None else None
        return kind or ("NVSwitch" if all_nvlink else None)
    return of


def judge_outliers(figs: list[Figure], expect: OutlierExpect | None, kinds: dict[frozenset[int], str], all_nvlink: bool,
                   first: list[Figure] | None = None, why: str | None = None) -> list[Finding]:
    return outliers.judge(figs, expect, MEMBERS, WORDS, REASONS, RERUN, cohort(kinds, all_nvlink), first, why)


def judge_peer_access(f: BandwidthFacts, nvlink_pairs: set[frozenset[int]], all_nvlink: bool) -> list[Finding]:
    """CUDA peer access impossible between two GPUs the profile or topology says NVLink joins: P2P is down."""
    bad = []
    gpu = {o.rank: o.gpu for o in f.ranks}
    for o in f.ranks:
        for res in o.report.results if isinstance(o.report, RankReport) else []:
            if res.step != "p2p" or res.peer_access is not False:
                continue
            src = source(o.rank, res)
            a, b = ranks.gpu_index(gpu.get(src)), ranks.gpu_index(gpu.get(res.peer))
            if all_nvlink or (a is not None and b is not None and frozenset((a, b)) in nvlink_pairs):
                bad.append(f"{_who(src, gpu)} -> {_who(res.peer, gpu) if res.peer is not None else '?'}")  # type: ignore[arg-type]
    if not bad:
        return []
    said = "node's NVSwitch fabric" if all_nvlink else "topology"
    cause = f"CUDA reports peer access impossible between {len(bad)} ordered pair(s) the {said} says NVLink joins: {', '.join(bad[:8])}; their copies go through host memory"
    remedy = "check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p r`, that nvidia-fabricmanager runs (NVSwitch boards), and the IOMMU/ACS settings; reboot, and drain the node if it persists"
    return [Finding(FAIL, f"no peer access between NVLink GPUs ({bad[0]})", cause, remedy)]


def judge_setup(f: BandwidthFacts) -> list[Finding]:
    """Sizes clamped to the memory free now, and ranks that could not be bound to their NUMA node."""
    out = []
    clamped = sorted({res.clamped for o in f.ranks if isinstance(o.report, RankReport) for res in o.report.results if res.clamped})
    if clamped:
        cause = "the profile's sizes did not fit in the memory free now, so these ran smaller and their figures may read low: " + "; ".join(clamped[:6])
        remedy = "find what holds the memory (`nvidia-smi`, other jobs) before trusting the node; or lower the sizes in the profile's [bandwidth]"
        out.append(Finding(WARN, "buffer sizes clamped to free memory", cause, remedy))
    unbound = [f"rank {o.rank}: {o.report.binding['error']}" for o in f.ranks if isinstance(o.report, RankReport) and o.report.binding and o.report.binding.get("error")]
    if f.backend == "nccl" and f.numa_nodes != 1:
        reports = [o for o in f.ranks if isinstance(o.report, RankReport)]
        unbound += [f"{o.who}: no NUMA advice from the topology check" for o in reports if not o.report.binding]  # type: ignore[union-attr]
    if unbound:
        cause = "host<->device figures may read low, since nvbandwidth-style figures assume each rank on its GPU's NUMA node: " + "; ".join(unbound)
        remedy = "run the topology check before bandwidth (it gives each GPU's node), and allow preflight the CPUs of every NUMA node (cpuset)"
        out.append(Finding(WARN, "ranks not bound to their GPU's NUMA node", cause, remedy))
    return out


def judge(f: BandwidthFacts, figs: list[Figure], floors: dict[str, ResolvedFloor], expect: BandwidthExpect,
          nvlink_pairs: set[frozenset[int]], all_nvlink: bool) -> dict[str, list[Finding]]:
    return {
        "run": ranks.judge_run(f, "the bandwidth worker", by_hand(f)),
        "floors": judge_floors(figs, floors, expect.margin),
        "peer_access": judge_peer_access(f, nvlink_pairs, all_nvlink),
        "setup": judge_setup(f),
    }


def by_hand(f: BandwidthFacts) -> str:
    return ranks.by_hand(f, "bandwidth.py")


# ---- gathering ------------------------------------------------------------------


class CopyPlan(NamedTuple):
    """How one copy step is laid out on n GPUs, as the worker runs it: what a time model
    multiplies its measured costs by (each field's cost in the comment)."""

    timed: int  # figures timed one after the other (each: warm-up + repeats of one copy, the convergence rule's)
    contexts: int  # CUDA contexts opened before any timing, one after the other (~0.13 s each on an H100)
    allocations: int  # rounds of buffer making in series (every rank at once is one round): cudaMalloc, cudaHostAlloc, the fill
    barriers: int  # gloo barriers between turns (a turn's deadline each)
    foreign_contexts: int  # GPUs left holding one context of another rank's process, until the launch ends


def p2p_plan(n: int) -> CopyPlan:
    """The p2p step on n GPUs: local rank 0 opens a context on each other GPU and makes every
    buffer (once), then times each ordered pair alone, the other ranks at a barrier per pair
    (checks/workers/bandwidth.py pairs() lists them; a test holds the two alike)."""
    if n < 2:
        return CopyPlan(0, 0, 0, 0, 0)
    return CopyPlan(timed=n * (n - 1), contexts=n - 1, allocations=1, barriers=n * (n - 1) + 2, foreign_contexts=n - 1)


def host_copy_plan(n: int) -> CopyPlan:
    """h2d or d2h on n GPUs: every rank pins and fills its host buffers at once (one round),
    then each times its copies in its own turn while the others wait at a barrier."""
    return CopyPlan(timed=n, contexts=0, allocations=1, barriers=n + 1, foreign_contexts=0)


def steps_for(gpu: bool, nproc: int, expect: BandwidthExpect, nnodes: int = 1, one_process: str | None = None) -> list[str]:
    """``one_process``: why a GPU admits one process only (exclusive_gpus), which leaves p2p out."""
    steps = ["hbm_copy", "h2d", "d2h"] if gpu else ["memcpy"]
    if gpu and nproc > 1 and one_process is None:
        steps.append("p2p")
    if nproc * nnodes > 1:  # one rank has no peer to reduce with: nccl-tests prints busbw 0
        steps += ["all_reduce", "all_gather", "reduce_scatter", "latency"]
        if gpu and expect.graph:
            steps.append("graph_latency")
    return steps


# A figure's name -> the worker's step that measures it: only those steps run again to confirm.
STEP_OF = {**{v: k for k, v in PER_DEVICE.items()}, **{v: k for k, v in COLLECTIVE.items()}, "allreduce_latency": "latency", "allreduce_latency_p99": "latency"}


def steps_again(missed: list[str], steps: list[str]) -> list[str]:
    """The steps that measured the figures ``missed``, in the first run's order."""
    want = {STEP_OF.get(name) for name in missed}
    return [s for s in steps if s in want]


def seconds_skipped(f: BandwidthFacts, redo: list[str]) -> float:
    """Of the first launch's time, what its other steps took (the slowest rank's): a second launch of ``redo`` saves it."""
    slowest: dict[str, float] = {}
    for o in f.ranks:
        for step, sec in (o.report.step_seconds if isinstance(o.report, RankReport) else {}).items():
            slowest[step] = max(sec, slowest.get(step, 0.0))
    return sum(sec for step, sec in slowest.items() if step not in redo)


def exclusive_gpus(modes: dict[int, str | None]) -> str | None:
    """Why the p2p step cannot run, in words, where a GPU admits one process: its copies
    are made from local rank 0's process on every GPU, which needs a second context on
    each GPU but rank 0's (a job's NCCL reaches its peers through CUDA IPC inside its own
    context, and runs)."""
    held = sorted(i for i, mode in modes.items() if mode in ("exclusive_process", "exclusive_thread"))
    if not held:
        return None
    which = "every GPU is" if len(held) == len(modes) else f"GPU {', '.join(map(str, held))} {'is' if len(held) == 1 else 'are'}"
    return (f"GPU->GPU copies not measured: {which} in compute mode EXCLUSIVE_PROCESS (NVML), one process per GPU, and the copies, "
            "made from local rank 0's process over every GPU, would need a second context on each GPU but its own; the collectives, through NCCL, are measured")


def compute_modes(ctx: Context) -> dict[int, str | None]:
    """Each GPU's compute mode: from the cuda check's inventory, else NVML (--only bandwidth); {} where neither answers."""
    modes = ranks.compute_modes(ctx.results)
    if modes is not None:
        return modes
    try:
        inv = ctx.inventory(timeout=min(10.0, ranks.time_left(ctx.deadline)))
    except nvml.NvmlUnavailable:
        return {}  # the cuda check says why NVML is silent; the workers find out for themselves
    return {g.index: g.compute_mode for g in inv.gpus}


def binding(ctx: Context) -> dict[str, dict]:
    """local rank -> {node, cpus}: the topology check's advice, as nvbandwidth binds each GPU's host buffers."""
    topo = ctx.results.get("topology")
    advice = topo.details.get("advice") if topo else None
    out = {}
    for r in (advice or {}).get("ranks") or []:
        if r.get("cpus"):
            out[str(r["local_rank"])] = {"node": r.get("numa_node"), "cpus": r["cpus"]}
    return out


def uuids(ctx: Context) -> dict[int, str]:
    return ranks.gpu_uuids(ctx.results)


def gather(ctx: Context, nproc: int, expect: BandwidthExpect, backend: str, steps: list[str] | None = None, reading: int = 1) -> BandwidthFacts:
    """One launch of the worker: every step, or ``steps`` when measuring again (``reading`` 2)."""
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    gpu = backend == "nccl"
    nnodes = ctx.meeting.group.nnodes if ctx.meeting else 1
    one_process = exclusive_gpus(compute_modes(ctx)) if gpu and nproc > 1 else None
    steps = steps or steps_for(gpu, nproc, expect, nnodes, one_process)
    facts = BandwidthFacts(python=python, backend=backend, nproc=nproc, steps=steps, binding=binding(ctx) if gpu else {}, uuids=uuids(ctx),
                           numa_nodes=numa_nodes(ctx.results.get("topology"), ctx.host) if gpu else None, left_out=one_process)
    left = ranks.time_left(ctx.deadline)
    op_timeout = min(expect.op_timeout_seconds, max(2.0, left / 3))
    args = [
        "--backend", backend, "--device", "cuda" if gpu else "cpu", "--steps", ",".join(facts.steps),
        "--copy-bytes", str(expect.copy_bytes), "--host-bytes", str(expect.host_bytes), "--p2p-bytes", str(expect.p2p_bytes),
        "--collective-bytes", str(expect.collective_bytes), "--small-bytes", str(expect.small_bytes),
        "--warmup", str(expect.warmup), "--repeats", str(expect.repeats), "--latency-iters", str(expect.latency_iters),
        "--timeout", f"{op_timeout:g}", "--bind", json.dumps(facts.binding), "--reading", str(reading),
        "--tolerance", f"{expect.tolerance:g}", "--max-repeats", str(expect.max_repeats), "--max-latency-iters", str(expect.max_latency_iters),
        "--max-seconds", f"{expect.max_seconds:g}",
    ]  # fmt: skip
    worker = launch.Worker("bandwidth.py", args, nproc=nproc, rdzv_port=ctx.settings.rdzv_port, group=meeting.torchrun_group(ctx, "bandwidth", left))
    done = ranks.collect(facts, worker, RankReport, ctx.host.environ, left, ranks.waited_out(nproc, op_timeout), ctx.progress, ctx.worlds)
    facts.nccl = stage_nccl_log(done.texts if done else {})
    facts.nccl_log = nccl_lines.summary(facts.nccl) if facts.nccl else None
    return facts


def stage_nccl_log(texts: dict[str, str]) -> nccl_lines.NcclLog | None:
    """The stage's NCCL lines (``nccl.rank{N}.log``, every rank's) parsed; None where there are none."""
    logs = [texts[name] for name in sorted(texts) if name.startswith("nccl.")]
    return nccl_lines.parse("\n".join(logs)) if any(t.strip() for t in logs) else None


def judge_transports(f: BandwidthFacts, ctx: Context) -> list[Finding]:
    """The large collectives' own channels, judged as the nccl check judges its smoke test's
    (checkkit/transports.py): rings and NVLS that NCCL set up only for these sizes."""
    if f.nccl is None or ctx.profile.nccl is None:
        return []
    topology = ctx.results.get("topology")
    expect = transports.p2p_for_shape(ctx.profile.nccl, ctx.shape)
    return transports.judge(f.nccl, f.ranks, nccl_env.read(ctx.host), expect, linked_pairs(topology, ("NV",)) or set(), linked_pairs(topology, ("PIX", "PXB")),
                            during=" in the large collectives")


# ---- reporting ------------------------------------------------------------------


def measurements(figs: list[Figure], floors: dict[str, ResolvedFloor], expect: OutlierExpect | None = None,
                 kinds: dict[frozenset[int], str] | None = None, all_nvlink: bool = False) -> list[Measurement]:
    return figs_mod.measurements(figs, floors) + outliers.measurements(figs, expect, MEMBERS, cohort(kinds or {}, all_nvlink))


def lines(figs: list[Figure], floors: dict[str, ResolvedFloor]) -> list[str]:
    return figs_mod.lines(figs, floors, WORDS)


def time_line(f: BandwidthFacts) -> list[str]:
    """Where the check's time went, by step (the slowest rank's), so a profile can be tuned to its budget."""
    slowest: dict[str, float] = {}
    for o in f.ranks:
        for step, sec in (o.report.step_seconds if isinstance(o.report, RankReport) else {}).items():
            slowest[step] = max(sec, slowest.get(step, 0.0))
    if not slowest:
        return []
    init = max((o.report.import_seconds or 0) + (o.report.init_seconds or 0) for o in f.ranks if o.report)
    made = p2p_setup(f)

    def spent(step: str, sec: float) -> str:
        if step == "p2p" and made:
            return f"p2p {sec:.1f} s ({made.contexts} contexts {made.contexts_seconds:.1f} s, buffers {made.buffers_seconds:.1f} s)"
        return f"{step} {sec:.1f} s"

    return ["time: import + init " + f"{init:.1f} s, " + ", ".join(spent(step, sec) for step, sec in slowest.items()) + (f"; torchrun {f.seconds:.1f} s" if f.seconds else "")]


def p2p_setup(f: BandwidthFacts) -> Setup | None:
    """What local rank 0 made before timing the GPU->GPU copies (its contexts on the other GPUs, the buffers), as it reported it."""
    return next((o.report.setup["p2p"] for o in f.ranks if isinstance(o.report, RankReport) and "p2p" in o.report.setup), None)


def foreign_contexts(f: BandwidthFacts) -> dict | None:
    """The GPUs on which the P2P step left a context of another rank's process: local rank 0's,
    one on each other GPU, for as long as the launch lives (memtest then finds that much less free)."""
    made = p2p_setup(f)
    if not made or not made.contexts:
        return None
    gpu = {o.rank: o.gpu for o in f.ranks}
    return {"process": made.by, "gpus": [_who(r, gpu) for r in range(1, made.gpus)], "per_gpu": 1}


def foreign_line(f: BandwidthFacts) -> list[str]:
    held = foreign_contexts(f)
    if held is None:
        return []
    return [f"GPU->GPU copies made from {held['process']}'s process over every GPU: {', '.join(held['gpus'])} each hold that one context of it for the rest of the launch"]


def summary(f: BandwidthFacts, figs: list[Figure]) -> str:
    if not figs:
        return f"{ranks.count(f)}: no figure measured"
    parts = []
    for name in ("hbm_copy_bandwidth", "memcpy_bandwidth", "h2d_bandwidth", "d2h_bandwidth", "p2p_bandwidth", "allreduce_bus_bandwidth", "allreduce_latency",
                 "internode_allreduce_bus_bandwidth", "internode_allreduce_latency"):
        group = [g for g in figs if g.key == name]
        if group:
            value = max(g.value for g in group) if group[0].unit == SECONDS else min(g.value for g in group)
            parts.append(f"{WORDS[name].replace(' bus bandwidth', ' busbw')} {fmt_value(value, group[0].unit)}")
    return f"{ranks.count(f)}, every figure within its floor: " + ", ".join(parts) + figs_mod.unsure_note(figs, WORDS)


class Bandwidth(Check):
    name = "bandwidth"
    description = "HBM, host<->device, GPU<->GPU and collective bandwidth and small-message latency, judged against the SKU's floors"
    requires = ("cuda", "nccl")
    timeout_seconds = 120.0
    order = 50
    floor_units: ClassVar[dict[str, tuple[str, str]]] = FLOORS
    floor_sane = floor_bounds.by_unit(FLOORS)
    whole_node: ClassVar[tuple[str, ...]] = WHOLE_NODE + INTERNODE_FLOORS

    def required_floors(self, profile) -> tuple[str, ...]:
        """What a profile running this check must define: the per-device copies' floors."""
        return ("hbm_copy_bandwidth", "h2d_bandwidth", "d2h_bandwidth") if profile.has_gpus else ("memcpy_bandwidth",)

    def applies(self, ctx: Context) -> str | None:
        if ctx.profile.bandwidth is None:
            return f"profile {ctx.profile.name} has no [bandwidth] table"
        return None

    def ranks_wanted(self, ctx: Context) -> int | None:
        return ctx.ranks(ctx.profile.bandwidth.ranks) if ctx.profile.bandwidth is not None else None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.bandwidth
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.has_gpus else "gloo"
        nproc = ctx.ranks(expect.ranks)
        facts = gather(ctx, nproc, expect, backend)
        figs = figures(facts)
        all_nvlink = bool(ctx.shape and ctx.shape.fabric == "nvswitch")
        floors, unjudged = shape.fitting_floors(dict(ctx.profile.floors), self.whole_node, ctx.shape, nproc, expect.ranks)
        # Across nodes the inter-node floors judge the collectives; alone, they judge nothing.
        for name in (WHOLE_NODE if ctx.meeting else INTERNODE_FLOORS):
            floors.pop(name, None)
        # The all_reduce against the floor of the algorithm NCCL ran: NVLS, or rings.
        nvls = nvls_mod.decide(nccl_env.read(ctx.host), ctx.results["nccl"].details if "nccl" in ctx.results else None, facts.nccl_log, facts.world)
        both, floors = floors, nvls_mod.fit(floors, nvls)
        parts = judge(facts, figs, floors, expect, linked_pairs(ctx.results.get("topology"), ("NV",)) or set(), all_nvlink)
        parts["transports"] = judge_transports(facts, ctx)
        # Confirm before FAIL: the steps whose figures missed a floor, or were past the FAIL band
        # against the node's median, run again, once (preflight/checkkit/confirm.py).
        kinds = link_kinds(ctx.results.get("topology"))
        again, again_figs, again_parts, redo, why = None, None, None, [], None
        odd = outliers.failing(figs, ctx.profile.outliers, MEMBERS, cohort(kinds, all_nvlink))
        missed = list(dict.fromkeys(confirm.missed(figs, floors) + odd))
        if missed:
            redo = steps_again(missed, facts.steps)
            hard = [x for name, found in parts.items() if name != "floors" for x in found]
            need = confirm.need_seconds(facts.seconds, seconds_skipped(facts, redo))
            why = confirm.why_not(hard, ctx.meeting is not None, need, ranks.time_left(ctx.deadline))
            if why is None and not redo:  # every floor's figure has its step; if one ever lacks it, say so
                why = "not measured again: no step of the worker measures it alone"
            if why is None:
                again = gather(ctx, nproc, expect, backend, redo, reading=2)
                again_figs = figures(again)
                again_parts = judge(again, again_figs, floors, expect, linked_pairs(ctx.results.get("topology"), ("NV",)) or set(), all_nvlink)
        settled = confirm.settle(figs, again_figs, floors, lambda g: judge_floors(g, floors, expect.margin), WORDS, RERUN, why)
        parts = confirm.combine(parts, again_parts, settled, ("floors",), lambda name: "floors")
        # From here on the figures are those the verdict rests on, the measurements included: the second reading's where there is one.
        first, figs = figs, settled.figures
        # Against the node's own median: on the figures the verdict rests on, after the floors;
        # a name measured again is held to both readings.
        redone = {g.key for g in again_figs or []} & set(odd)
        parts["nvls"], nvls_lines = nvls_mod.explain([g.value for g in figs if g.key == "allreduce_bus_bandwidth"], both, nvls)
        parts["outliers"] = judge_outliers(figs, ctx.profile.outliers, kinds, all_nvlink, [g for g in first if g.key in redone] if redone else None,
                                           why if odd and not redone else None)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        details["confirm"] = confirm.details(settled, 2 if again else 1, redo if again else [], why)
        if again:
            details["second_run"] = again.model_dump(mode="json")
        details["figures"] = [g.model_dump(mode="json") for g in figs]
        details["nvls"] = nvls.model_dump()
        details["unjudged"] = unjudged = {k: v for k, v in unjudged.items() if k in {g.name for g in figs}}
        details["full_node"] = nproc == ((ctx.shape.gpus if ctx.shape else 0) or expect.ranks)
        details["outlier_bands"] = outliers.bands(ctx.profile.outliers, MEMBERS)
        details["foreign_contexts"] = (again and foreign_contexts(again)) or foreign_contexts(facts)
        details["outliers"] = outliers.statuses(figs, ctx.profile.outliers, MEMBERS, cohort(kinds, all_nvlink), [g for g in first if g.key in redone] if redone else None)
        findings = [x for found in parts.values() for x in found]
        result = self.conclude(findings, summary(facts, figs), measurements=measurements(figs, floors, ctx.profile.outliers, kinds, all_nvlink), details=details)
        result.lines = lines(figs, floors) + time_line(facts)
        result.lines += settled.lines + [t.replace("time:", "time, second reading:", 1) for t in (time_line(again) if again else [])]
        result.lines += nvls_lines + shape.unjudged_lines(unjudged) + ([facts.left_out] if facts.left_out else []) + foreign_line(facts)
        return result

