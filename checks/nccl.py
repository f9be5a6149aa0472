"""NCCL smoke test: torchrun on every GPU, the job's own collectives checked
for the right answer, NCCL's choice of transport read from its own log, and
a deadline that names the rank when anything hangs or dies.

What a hand-rolled `init_process_group` + all_reduce script misses, and this
check does not: a dead peer (that script waits NCCL's 10 minutes), a wrong
or stale result (it never compares), NVLink peers that fell back to SHM or
sockets (it never looks), and debugging switches left in the environment.
On the cpu profile the same launcher, worker and judges run with gloo.
"""

from __future__ import annotations

import socket
import sys
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import psutil
from pydantic import BaseModel, Field

from preflight.checkkit import transports
from preflight.checkkit.nccl_settings import env_without_cost, gpu_pairs, judge_env, judge_ifnames, layout_of, ranks_pairs, reaches_cpu
from preflight.checkkit.placement import linked_pairs
from preflight.checkkit.transports import p2p_for_shape
from preflight.gpuwork import launch, meeting, ranks, ranks_judge
from preflight.readers.nccl import nccl_env, nccl_log, nccl_net
from preflight.readers.system.cpu_vendor import cpu_vendor
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.base.host import Host
from preflight.pipeline.expectations import NcclExpect
from preflight.pipeline.shape import rdma_nics
from preflight.base.units import fmt_bytes, fmt_value

FAIL, WARN = Status.FAIL, Status.WARN
TORCH = ranks.TORCH


class OpResult(BaseModel):
    name: str  # all_reduce_fp32_small
    op: str
    dtype: str | None = None
    bytes: int
    seconds: float | None = None
    error: str | None = None  # a wrong answer, described
    skipped: str | None = None


class RankReport(ranks.RankReport):
    """What checks/workers/nccl_smoke.py writes for one rank."""

    step_noun: ClassVar[str] = "op"

    nccl_version: str | None = None
    first_collective_seconds: float | None = None
    ops: list[OpResult] = Field(default_factory=list)

    def progress(self) -> int:
        return len(self.ops)


RankOutcome = ranks.RankOutcome


class NcclFacts(ranks.RunFacts):
    env: dict[str, list[tuple[str, str]]] = Field(default_factory=dict)  # NCCL_*/GLOO_* -> [(value, where)]
    rdma: list[str] | None = None  # the node's RDMA devices (/sys/class/infiniband); None: not read
    cpu_vendor: str | None = None  # x86's vendor_id: NCCL's default P2P level depends on it (nccl_settings.reaches_cpu)
    interfaces: dict[str, list[str] | None] | None = None  # name -> addresses (None: unknown); None: not read
    nccl: nccl_log.NcclLog | None = None
    # Across nodes: what the network judge needs (the log's own words, IB devices, peermem).
    net: nccl_net.NetFacts | None = None
    nccl_text: str = Field(default="", exclude=True)


# ---- gathering -------------------------------------------------------------


def interfaces(host: Host) -> dict[str, list[str] | None] | None:
    """Network interfaces -> their IP addresses (None: not known). The live
    machine's from getifaddrs; under a recorded root, the names in sysfs."""
    if host.root == Path("/"):
        try:
            ip = (socket.AF_INET, socket.AF_INET6)
            return {name: [a.address for a in addrs if a.family in ip] for name, addrs in psutil.net_if_addrs().items()}
        except OSError:
            return None
    try:
        return {p.name: None for p in host.path("/sys/class/net").iterdir()}
    except OSError:
        return None


def gather(ctx: Context, nproc: int, expect: NcclExpect, backend: str) -> NcclFacts:
    host = ctx.host
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts = NcclFacts(python=python, backend=backend, nproc=nproc, env=nccl_env.read(host), interfaces=interfaces(host),
                      rdma=ctx.shape.nics if ctx.shape is not None else rdma_nics(host), cpu_vendor=cpu_vendor(host))
    if bad := judge_ifnames(facts.env, facts.interfaces):
        facts.not_started = bad[0].cause  # a bad interface name fails every rank: say so before launching
        return facts
    left = ranks.time_left(ctx.deadline)
    # Ranks give up on a stuck peer well before the deadline, so they live to say who it was.
    op_timeout = min(expect.op_timeout_seconds, max(2.0, left / 3))
    device = "cuda" if backend == "nccl" else "cpu"
    args = ["--backend", backend, "--device", device, "--small-bytes", str(expect.small_bytes), "--large-bytes", str(expect.large_bytes), "--timeout", f"{op_timeout:g}"]
    if backend == "nccl":
        args.append("--nccl-debug")
    worker = launch.Worker("nccl_smoke.py", args, nproc=nproc, rdzv_port=ctx.settings.rdzv_port, group=meeting.torchrun_group(ctx, "nccl", left))
    done = ranks.collect(facts, worker, RankReport, host.environ, left, ranks.waited_out(nproc, op_timeout), ctx.progress, ctx.worlds)
    if done is None:
        return facts
    texts = [done.texts[name] for name in sorted(done.texts) if name.startswith("nccl.")]
    if texts:
        facts.nccl = nccl_log.parse("\n".join(texts))
        if ctx.meeting is not None:
            facts.net, facts.nccl_text = nccl_net.gather(host, host.environ), "\n".join(texts)
    return facts


def judge_network(f: NcclFacts, expect: NcclExpect) -> tuple[list[Finding], dict | None]:
    """Across nodes: the network NCCL chose to each peer, against the profile's (NET/IB with GPUDirect RDMA on HGX)."""
    if f.nccl is None or f.net is None:
        return [], None
    local = {o.global_rank for o in f.ranks if o.global_rank is not None} or None
    return nccl_net.judge(f.nccl, f.net, expect.network, local, f.nccl_text)


# ---- judging ---------------------------------------------------------------


def _by_hand(f: NcclFacts) -> str:
    return ranks.by_hand(f, "nccl_smoke.py")


def judge_run(f: NcclFacts) -> list[Finding]:
    """Did every rank run every op to the right answer, in time, and leave nothing behind?"""
    said = None
    # A warning (a CollNet fallback) does not stop a run: the first failure NCCL logged is what to name.
    if f.nccl and (p := next((p for p in f.nccl.problems if p.severity == "fail"), None)):
        said = (p.title, p.text, p.fix)
    return ranks_judge.judge_run(f, "the NCCL smoke test", _by_hand(f), _judge_answers(f), said)


def _judge_answers(f: NcclFacts) -> list[Finding]:
    wrong: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for o in f.ranks:
        for op in o.report.ops if o.report else []:
            if op.error:
                wrong[op.name].append((o.rank, op.error))
    out = []
    for name, hits in wrong.items():
        ranks = ", ".join(str(r) for r, _ in hits)
        cause = f"{name} returned wrong values on rank(s) {ranks}: {hits[0][1]}"
        if f.backend == "nccl":
            remedy = "drain the node and run `dcgmi diag -r 3` on it: a collective that returns wrong data is a GPU, NVLink or driver fault"
        else:
            remedy = "a bug in the collective library or the worker: report it"
        out.append(Finding(FAIL, f"{name} returned wrong values", cause, remedy))
    return out


def judge_timing(f: NcclFacts, expect: NcclExpect) -> list[Finding]:
    inits = [(o.report.init_seconds, o) for o in f.ranks if o.report and o.report.init_seconds is not None]
    if not inits:
        return []
    slowest, o = max(inits, key=lambda t: t[0])
    if slowest <= expect.init_warn_seconds:
        return []
    cause = f"init_process_group took {slowest:.1f} s on {o.who}, over the {expect.init_warn_seconds:g} s a healthy node needs ({expect.init_source})"
    remedy = "check name resolution and NCCL_SOCKET_IFNAME (bootstrap), and GPU health on that rank; NCCL_DEBUG=INFO shows the init timings"
    return [Finding(WARN, f"slow {f.backend.upper()} init ({slowest:.1f} s)", cause, remedy)]


def judge_transports(f: NcclFacts, expect: NcclExpect, nvlink_pairs: set[frozenset[int]], switch_pairs: set[frozenset[int]] | None = None,
                     by_design: set[frozenset[int]] | None = None) -> list[Finding]:
    """The smoke test's channels (checkkit/transports.py)."""
    return transports.judge(f.nccl, f.ranks, f.env, expect, nvlink_pairs, switch_pairs, by_design=by_design)


def judge_log(f: NcclFacts, run_failed: bool) -> list[Finding]:
    """NCCL's own warnings on a run that otherwise passed (a failed run names them in its cause)."""
    if f.nccl is None or run_failed:
        return []
    out = [Finding(WARN, f"NCCL: {p.title}", f"{p.cause} (line: {p.text.strip()})", p.fix) for p in f.nccl.problems]
    if not out and f.nccl.warnings:
        w = f.nccl.warnings[0]
        out.append(Finding(WARN, f"NCCL warned {len(f.nccl.warnings)} time(s)", f"NCCL WARN {w.message}", "read the NCCL warnings in the report's details (nccl.warnings)"))
    return out


def cpu_too(f: NcclFacts) -> bool:
    """Whether NCCL's default P2P level reaches this node's pairs through the CPU: its CPU, the GPUs
    one node of the run holds (NCCL counts its own node's) and NCCL's version (nccl_settings.reaches_cpu)."""
    reports = [o.report for o in f.ranks if o.report]
    version = (f.nccl.version if f.nccl else None) or next((r.nccl_version for r in reports if r.nccl_version), None)
    return reaches_cpu(f.cpu_vendor, f.nproc, version)


def judge(f: NcclFacts, expect: NcclExpect, nvlink_pairs: set[frozenset[int]], switch_pairs: set[frozenset[int]] | None = None,
          by_design: set[frozenset[int]] | None = None, pairs: dict[frozenset[int], str] | None = None,
          spans_nodes: bool = True) -> dict[str, list[Finding]]:
    """``pairs``: NCCL's path type between GPU pairs (gpu_pairs); ``spans_nodes``: this node serves jobs across nodes."""
    run = judge_run(f)
    return {
        "environment": judge_env(f.env, ranks_pairs(f, pairs, by_design), f.rdma, spans_nodes, cpu_too(f)) + judge_ifnames(f.env, f.interfaces),
        "run": run,
        "timing": judge_timing(f, expect),
        "transports": judge_transports(f, expect, nvlink_pairs, switch_pairs, by_design),
        "log": judge_log(f, any(x.status == FAIL for x in run)),
    }


# ---- reporting ---------------------------------------------------------------


def op_table(f: NcclFacts) -> dict[str, dict[str, float]]:
    """op (all_reduce_fp32...) -> size (small/large) -> slowest rank's seconds."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for o in f.ranks:
        for op in o.report.ops if o.report else []:
            if op.seconds is not None:
                size = "large" if op.name.endswith("_large") else "small" if op.name.endswith("_small") else "none"
                base = op.name.removesuffix("_large").removesuffix("_small")
                table[base][size] = max(op.seconds, table[base].get(size, 0.0))
    return table


def lines(f: NcclFacts, expect: NcclExpect) -> list[str]:
    """Per-op figures for the console: the slowest rank's time at each message size."""
    table = op_table(f)
    if not table:
        return []
    out = [f"slowest rank per op: small = {fmt_bytes(expect.small_bytes)}, large = {fmt_bytes(expect.large_bytes)}"]
    for base, times in table.items():
        # fmt_value: an op under a millisecond (every op on NVLink) reads in microseconds, not "0 ms".
        out.append(f"  {base:<16} " + "  ".join(f"{size} {fmt_value(sec, 'seconds')}" if size != "none" else fmt_value(sec, "seconds") for size, sec in times.items()))
    return out


def measurements(f: NcclFacts, expect: NcclExpect) -> list[Measurement]:
    out = []
    reports = [o.report for o in f.ranks if o.report]
    inits = [r.init_seconds for r in reports if r.init_seconds is not None]
    firsts = [r.first_collective_seconds for r in reports if r.first_collective_seconds is not None]
    if inits:
        out.append(Measurement(name="nccl_init_duration", unit="seconds", value=max(inits), ceiling=expect.init_warn_seconds))
    if firsts:
        out.append(Measurement(name="nccl_first_collective_duration", unit="seconds", value=max(firsts)))
    for base, times in op_table(f).items():
        for size, seconds in times.items():
            out.append(Measurement(name="nccl_op_duration", unit="seconds", value=seconds, labels={"op": base, "size": size}))
    return out


def summary(f: NcclFacts, expect: NcclExpect) -> str:
    reports = [o.report for o in f.ranks if o.report]
    r0 = reports[0] if reports else None
    n_ops = len(r0.ops) if r0 else 0
    init = max((r.init_seconds or 0.0) for r in reports) if reports else 0.0
    what = f"{ranks.count(f)}: {n_ops} ops right on every rank ({fmt_bytes(expect.small_bytes)} and {fmt_bytes(expect.large_bytes)}), init {init:.2f} s"
    if f.nccl:
        peers = f.nccl.peers()
        kinds = sorted({t for ts in peers.values() for t in ts})
        what += f"; NCCL {f.nccl.version or (r0.nccl_version if r0 else '?')}, transports {', '.join(kinds) or 'none logged'}"
        if f.nccl.networks:
            what += f", network {'/'.join(f.nccl.networks)}"
    return what + (f"; torch {r0.torch_version}" if r0 and r0.torch_version else "")


class Nccl(Check):
    name = "nccl"
    description = "torchrun on every GPU: collectives give the right answer in time, NCCL uses P2P where it should, no debugging switches left on"
    requires = ("cuda",)
    timeout_seconds = 120.0
    order = 40

    def applies(self, ctx: Context) -> str | None:
        if ctx.profile.nccl is None:
            return f"profile {ctx.profile.name} has no [nccl] table"
        return None

    def ranks_wanted(self, ctx: Context) -> int | None:
        return ctx.ranks(ctx.profile.nccl.ranks) if ctx.profile.nccl is not None else None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.nccl
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.has_gpus else "gloo"
        nproc = ctx.ranks(expect.ranks)
        facts = gather(ctx, nproc, expect, backend)
        expect = p2p_for_shape(expect, ctx.shape)
        topology = layout_of(ctx)
        by_design = transports.without_p2p_here(ctx)
        # A node serves jobs across nodes where this run spans nodes, the site pins it, or its model is built for them
        # (a NIC beside each GPU: the topology check judges its NICs by the same rule).
        spans_nodes = (ctx.meeting is not None or ctx.settings.nnodes > 1 or ctx.settings.node_multi_node
                       or bool(ctx.profile.topology and ctx.profile.topology.nic_per_gpu))
        pairs = gpu_pairs(topology, ctx.shape)
        parts = judge(facts, expect, linked_pairs(topology, ("NV",)) or set(), linked_pairs(topology, ("PIX", "PXB")), by_design, pairs, spans_nodes)
        parts["network"], network = judge_network(facts, expect)
        details = facts.model_dump(mode="json", exclude={"nccl"})
        if costless := env_without_cost(facts.env, ranks_pairs(facts, pairs, by_design), facts.rdma, spans_nodes, cpu_too(facts)):
            details["settings_without_cost"] = costless
        if network is not None:
            details["network"] = network
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        if facts.nccl:
            details["nccl_log"] = {
                "version": facts.nccl.version,
                "networks": facts.nccl.networks,
                "nvls": facts.nccl.nvls,  # NVLS multicast available (not that it ran): bandwidth reads it after its own stage's nvls channels and the settings
                # "K nvls channels" of the communicators this stage made: bandwidth's too, where it reuses the group in a shared launch
                "nvls_channels": facts.nccl.nvls_channels,
                "peers": {f"{a}->{b}": t for (a, b), t in sorted(facts.nccl.peers().items())},
                "warnings": [w.message for w in facts.nccl.warnings[:50]],
                "problems": [p.model_dump() for p in facts.nccl.problems],
            }
        findings = [x for found in parts.values() for x in found]
        result = self.conclude(findings, summary(facts, expect), measurements=measurements(facts, expect), details=details)
        result.lines = lines(facts, expect)
        return result

