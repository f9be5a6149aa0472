"""The bandwidth check's figures: what its worker reports and the arithmetic
that turns the reports into judged numbers, shared by the check, the tools that
read nccl-tests beside it and the time model.

The worker (checks/workers/bandwidth.py) reports every timed repeat raw; here,
in pure functions: a figure is the median of the repeats (with how sure it is,
and whether it converged), a collective's repeat lasts as long as its slowest
rank, bus bandwidth follows nccl-tests (doc/PERFORMANCE.md). Each figure's
name is its floor's and its metric's; WORDS and REASONS say it to a person and
name what makes it low.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, Field

from preflight.checkkit import figures as figs_mod
from preflight.gpuwork import ranks
from preflight.readers.nccl import nccl_log as nccl_lines

BPS, SECONDS = "bytes_per_second", "seconds"

# Step in the worker -> the figure's name (= its floor's name and its metric's).
PER_DEVICE = {"hbm_copy": "hbm_copy_bandwidth", "memcpy": "memcpy_bandwidth", "h2d": "h2d_bandwidth", "d2h": "d2h_bandwidth", "p2p": "p2p_bandwidth"}
COLLECTIVE = {"all_reduce": "allreduce_bus_bandwidth", "all_gather": "allgather_bus_bandwidth", "reduce_scatter": "reducescatter_bus_bandwidth"}
INTERNODE = {name: f"internode_{name}" for name in COLLECTIVE.values()}

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


class PairFigure(Figure):
    """A P2P pair's figure, with whether CUDA gave the pair peer access (False: the copy went
    through host memory). Only the judge reads it: the figure's labels and dump are a Figure's."""

    peer_access: bool | None = Field(default=None, exclude=True)


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
                              where=f"slowest of {len(lat)} ranks{' on this node' if group else ''}: {who(worst_rank, gpu)}",
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
    labels, where = ranks.labels(r, gpu.get(r), f.uuids), who(r, gpu)
    if res.peer is not None:
        peer = gpu.get(res.peer) or f"local rank {res.peer}"  # one node: the peer is a local rank
        labels["peer_gpu"] = peer.removeprefix("GPU ")
        where = f"{where} -> {peer}"
    kind = Figure if res.peer is None else PairFigure
    extra = {} if res.peer is None else {"peer_access": res.peer_access}
    return kind(name=name, unit=BPS, value=res.moved_bytes / med, where=where, labels=labels, bytes=res.bytes,  # type: ignore[operator]
                repeats=len(res.seconds), spread=spread(res.seconds), rank=r, **extra, **figs_mod.sureness(res.seconds, res.tolerance, res.stopped))


def who(r: int, gpu: dict[int, str | None]) -> str:
    return gpu.get(r) or f"rank {r}"


# ---- cohorts (checkkit/outliers.py) ----------------------------------------------


# Per GPU, per pair or per rank: each is also judged against the node's own median (checkkit/outliers.py).
MEMBERS = tuple(PER_DEVICE.values())
