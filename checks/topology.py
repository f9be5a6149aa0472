"""Where the GPUs, NICs and CPUs sit relative to each other, judged against
the SKU.

A node can pass every yes/no test and still train at half speed: GPUs split
4+4 across sockets with NCCL's threads on the wrong one, a missing NVLink
between a pair, a NIC two hops from its GPU, too few CPUs for eight ranks.
This check reads the layout (readers.layout: `nvidia-smi topo -m`, sysfs,
NVML, this process's cpuset and CPU quota), judges it in pure functions
(checkkit.nvlink_pairs: the NVLinks; checkkit.topology_judges: NUMA, NICs,
CPUs, agreement, PCIe) and writes per-rank pinning advice (checkkit.placement)
into the report.
"""

from __future__ import annotations

import sys
import time

from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.base.host import Host
from preflight.checkkit import settle
from preflight.checkkit.nvlink_pairs import judge_links, link_mode
from preflight.checkkit.placement import advise
from preflight.checkkit.sources import Sources
from preflight.checkkit.topology_judges import judge_agreement, judge_cpus, judge_nics, judge_numa, judge_pcie, pcie_held
from preflight.pipeline import floor_bounds
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.expectations import TopologyExpect
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import layout
from preflight.readers.nvidia import nvml
from preflight.readers.machine import topo_derived
from preflight.readers.machine.layout import NVIDIA_SMI_TIMEOUT, TopologyFacts
from preflight.readers.machine.layout_queries import gpu_count, matrix_position, numa_span, nvlink_count, rank_gpus
from preflight.readers.nvidia.nvml_facts import Inventory


FAIL, WARN = Status.FAIL, Status.WARN


def gather(host: Host, settings: Settings, deadline: float, inventory: Inventory | None = None) -> TopologyFacts:
    """The layout, read as the settings say (the NVML source, the job's interpreter), from
    ``inventory`` where the run has read NVML (Context.inventory); where `nvidia-smi topo -m`
    cannot be read, its matrix built from NVML and sysfs.
    Raises NvmlUnavailable when NVML cannot answer at all."""
    python = str(settings.python) if settings.python else sys.executable
    # NVIDIA_SMI_TIMEOUT is looked up here at each call, so a test can shorten it.
    return topo_derived.complete(host, layout.gather(host, settings.nvml_fake, python, deadline, NVIDIA_SMI_TIMEOUT, inventory))


# ---- judging -------------------------------------------------------------------


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
ANY_SKU = TopologyExpect(numa_warn_above=1, numa_source="any SKU: GPUs on one NUMA node need no per-rank pinning")


def measurements(facts: TopologyFacts, vcpu_floor: float | None, expect: TopologyExpect | None = None, shape: NodeShape | None = None) -> list[Measurement]:
    out = []
    n = len(rank_gpus(facts, gpu_count(facts)))  # as judge_cpus counts: the GPUs the job's ranks see
    if facts.cpus is not None:
        out.append(Measurement(name="usable", unit="cpus", value=facts.cpus.usable()))
        if n:
            out.append(Measurement(name="vcpus_per_gpu", unit="ratio", value=round(facts.cpus.usable() / n, 3), floor=vcpu_floor))
    if span := numa_span(facts):
        out.append(Measurement(name="gpu_numa", unit="nodes", value=span, ceiling=expect.numa_fail_above if expect else None))
    m = facts.matrix if topo_derived.LINKS not in facts.unanswered else None
    for g in facts.gpus:
        if m and (k := matrix_position(facts, g.index)) is not None and len(m.gpus) > 1:
            width = min(nvlink_count(m.link(k, j)) for j in range(len(m.gpus)) if j != k)
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
            ok += f"; {facts.cpus.usable() / max(1, len(rank_gpus(facts, gpu_count(facts)))):.1f} vCPUs per GPU"
        result = self.conclude(findings, ok, measurements=measurements(facts, floor, ctx.profile.topology, ctx.shape) + src.measurements(), details=details)
        if line := src.line():
            result.lines.append(line)
        if said:
            result.lines.append(f"NVLink judged after waiting: {said}")
        # A link its slot holds narrower than the card is the design: said, so a reader need not wonder.
        result.lines.extend(pcie_held(facts))
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
