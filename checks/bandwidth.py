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
the arithmetic is in pure functions (preflight/checkkit/bandwidth_figures.py:
a figure is the median of the repeats, with how sure it is and whether it
converged; a collective's repeat lasts as long as its slowest rank; bus
bandwidth follows nccl-tests), the steps in preflight/checkkit/bandwidth_plan.py.
Here: gather, and judge. A figure under its floor FAILs naming the GPU, pair
or direction; within the profile's margin above it WARNs (marginal node).
Before a figure FAILs, the steps that measured it run again, once
(preflight/checkkit/confirm.py): under the floor twice is "confirmed", once "transient" (WARN).
"""

from __future__ import annotations

import json
import sys
from typing import ClassVar

from preflight.checkkit import figures as figs_mod
from preflight.checkkit import confirm, host_link, network_link
from preflight.checkkit import nvls as nvls_mod
from preflight.checkkit import outliers
from preflight.checkkit.bandwidth_figures import (
    BPS, COLLECTIVE, INTERNODE, MEMBERS, PER_DEVICE, REASONS, SECONDS, WORDS, BandwidthFacts, Figure, RankReport, figures, source, who,
)
from preflight.checkkit.bandwidth_plan import (
    exclusive_gpus, foreign_contexts, foreign_line, seconds_skipped, steps_again, steps_for, time_line,
)
from preflight.checkkit.p2p_cohorts import cohort, link_kinds
from preflight.checkkit.placement import linked_pairs, numa_nodes
from preflight.gpuwork import launch, meeting, ranks, ranks_judge
from preflight.pipeline import floor_bounds, shape
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.load_expectations import BandwidthExpect, OutlierExpect
from preflight.base.units import fmt_value
from preflight.checkkit import transports
from preflight.readers.nccl import nccl_env, nccl_log as nccl_lines
from preflight.readers.machine import layout
from preflight.readers.nvidia import nvml, nvml_facts

# Kept importable from here: tests/perf/time_model.py and plugins read the step plan and
# nccl-tests' factor from the check that runs them.
from preflight.checkkit.bandwidth_figures import bus_factor  # noqa: F401
from preflight.checkkit.bandwidth_plan import p2p_plan  # noqa: F401

FAIL, WARN = Status.FAIL, Status.WARN

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
# Floors a run over fewer ranks than the node's cannot be held to (busbw and latency depend on the rank count).
WHOLE_NODE = ("allreduce_bus_bandwidth", "allreduce_bus_bandwidth_ring", "allgather_bus_bandwidth", "reducescatter_bus_bandwidth", "allreduce_latency", "allreduce_latency_p99")
INTERNODE_FLOORS = tuple(name for name in FLOORS if name.startswith("internode_"))


# ---- judging -------------------------------------------------------------------


RERUN = "preflight run --only bandwidth"


def judge_floors(figs: list[Figure], floors: dict[str, ResolvedFloor], margin: float) -> list[Finding]:
    return figs_mod.judge_floors(figs, floors, margin, WORDS, REASONS, RERUN)


def judge_outliers(figs: list[Figure], expect: OutlierExpect | None, kinds: dict[frozenset[int], str], all_nvlink: bool,
                   first: list[Figure] | None = None, why: str | None = None, vm: bool = False, one_node: bool = False) -> list[Finding]:
    """``one_node``: the guest of a VM shows one NUMA node, so its host copies may split by the host's sockets (p2p_cohorts.host_parts)."""
    return outliers.judge(figs, expect, MEMBERS, WORDS, REASONS, RERUN, cohort(kinds, all_nvlink, vm, one_node), first, why)


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
                bad.append(f"{who(src, gpu)} -> {who(res.peer, gpu) if res.peer is not None else '?'}")  # type: ignore[arg-type]
    if not bad:
        return []
    said = "node's NVSwitch fabric" if all_nvlink else "topology"
    cause = f"CUDA reports peer access impossible between {len(bad)} ordered pair(s) the {said} says NVLink joins: {', '.join(bad[:8])}; their copies go through host memory"
    remedy = "check `nvidia-smi nvlink -s` and `nvidia-smi topo -p2p r`, that nvidia-fabricmanager runs (NVSwitch boards), and the IOMMU/ACS settings; reboot, and drain the node if it persists"
    return [Finding(FAIL, f"no peer access between NVLink GPUs ({bad[0]})", cause, remedy)]


def _figure_names(step: str) -> list[str]:
    """The figures a worker step gives, by their floors' names (a collective's on one node and across nodes)."""
    name = PER_DEVICE.get(step) or COLLECTIVE.get(step)
    return [name, INTERNODE[name]] if name in INTERNODE else [name] if name else []


def judge_setup(f: BandwidthFacts, floors: dict[str, ResolvedFloor] | None = None) -> list[Finding]:
    """Sizes clamped to the memory free now, where a floor judges the figure (``floors``; None:
    every figure), and ranks that could not be bound to their NUMA node. A figure no floor judges
    may run smaller, as on a card of a few GiB under generic: it is only reported."""
    out = []
    clamped = sorted({res.clamped for o in f.ranks if isinstance(o.report, RankReport) for res in o.report.results
                      if res.clamped and (floors is None or any(name in floors for name in _figure_names(res.step)))})
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
        "run": ranks_judge.judge_run(f, "the bandwidth worker", by_hand(f)),
        "floors": judge_floors(figs, floors, expect.margin),
        "peer_access": judge_peer_access(f, nvlink_pairs, all_nvlink),
        "setup": judge_setup(f, floors),
    }


def by_hand(f: BandwidthFacts) -> str:
    return ranks.by_hand(f, "bandwidth.py")



# ---- gathering ------------------------------------------------------------------


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


def node_inventory(ctx: Context) -> nvml_facts.Inventory | None:
    """The run's NVML facts where the profile scales a floor by them (its SKU's PCIe link); None otherwise or where NVML is silent."""
    if ctx.profile.gpu is None or ctx.profile.gpu.pcie_gen is None:
        return None
    try:
        return ctx.inventory(timeout=min(10.0, ranks.time_left(ctx.deadline)))
    except nvml.NvmlUnavailable:
        return None


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
                            during=" in the large collectives", by_design=transports.without_p2p_here(ctx))


# ---- reporting ------------------------------------------------------------------


def measurements(figs: list[Figure], floors: dict[str, ResolvedFloor], expect: OutlierExpect | None = None,
                 kinds: dict[frozenset[int], str] | None = None, all_nvlink: bool = False, vm: bool = False, one_node: bool = False) -> list[Measurement]:
    return figs_mod.measurements(figs, floors) + outliers.measurements(figs, expect, MEMBERS, cohort(kinds or {}, all_nvlink, vm, one_node))


def lines(figs: list[Figure], floors: dict[str, ResolvedFloor]) -> list[str]:
    return figs_mod.lines(figs, floors, WORDS)


def summary(f: BandwidthFacts, figs: list[Figure], floors: dict[str, ResolvedFloor] | None = None) -> str:
    if not figs:
        return f"{ranks.count(f)}: no figure measured"
    parts = []
    for name in ("hbm_copy_bandwidth", "memcpy_bandwidth", "h2d_bandwidth", "d2h_bandwidth", "p2p_bandwidth", "allreduce_bus_bandwidth", "allreduce_latency",
                 "internode_allreduce_bus_bandwidth", "internode_allreduce_latency"):
        group = [g for g in figs if g.key == name]
        if group:
            value = max(g.value for g in group) if group[0].unit == SECONDS else min(g.value for g in group)
            parts.append(f"{WORDS[name].replace(' bus bandwidth', ' busbw')} {fmt_value(value, group[0].unit)}")
    held = "every figure within its floor" if floors is None or any(g.key in floors for g in figs) else "no floor for these figures (reported, and held to the node's own)"
    return f"{ranks.count(f)}, {held}: " + ", ".join(parts) + figs_mod.unsure_note(figs, WORDS)


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
        if not profile.has_gpus:
            return ("memcpy_bandwidth",)
        return ("hbm_copy_bandwidth", "h2d_bandwidth", "d2h_bandwidth") if profile.gpu.model_floors else ()

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
        # A host of older or narrower slots than the SKU's (never a VM's, whose links the hypervisor reports).
        vm = layout.under_hypervisor(ctx.host)  # a VM's matrix may hide the host's PCIe tree (p2p_cohorts.PairCohort)
        floors, host_line = host_link.fit(floors, ctx.profile.gpu, node_inventory(ctx), vm)
        # Across nodes: the NICs' floors at the rate the site cabled them (the rdma check's reading).
        floors, net_line = network_link.fit(floors, ctx.results.get("rdma"), ctx.profile.rdma.reference_rate_gbps if ctx.profile.rdma else None)
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
        one_node = facts.numa_nodes == 1  # with vm: the guest cannot bind a rank near its GPU's host socket
        again, again_figs, again_parts, redo, why = None, None, None, [], None
        odd = outliers.failing(figs, ctx.profile.outliers, MEMBERS, cohort(kinds, all_nvlink, vm, one_node))
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
                                           why if odd and not redone else None, vm, one_node)
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
        details["outliers"] = outliers.statuses(figs, ctx.profile.outliers, MEMBERS, cohort(kinds, all_nvlink, vm, one_node), [g for g in first if g.key in redone] if redone else None)
        findings = [x for found in parts.values() for x in found]
        result = self.conclude(findings, summary(facts, figs, floors), measurements=measurements(figs, floors, ctx.profile.outliers, kinds, all_nvlink, vm, one_node), details=details)
        result.lines = lines(figs, floors) + time_line(facts)
        result.lines += settled.lines + [t.replace("time:", "time, second reading:", 1) for t in (time_line(again) if again else [])]
        result.lines += ([f"host copies: {host_line}"] if host_line else []) + ([f"inter-node: {net_line}"] if net_line and ctx.meeting else []) + nvls_lines + shape.unjudged_lines(unjudged) + ([facts.left_out] if facts.left_out else []) + foreign_line(facts)
        return result

