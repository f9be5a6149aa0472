"""The burnin check (full level): minutes of sustained, verified load on every
GPU (the gloo ranks' CPUs on the cpu profile), for the faults that only show
under load: thermal and power problems, clocks that sag, arithmetic that goes
wrong once the GPU is hot, memory errors under traffic.

Each rank (checks/workers/burnin.py) runs GEMM bursts checked bit for bit
against a reference product, and large copies, for the profile's time; the
agent samples NVML beside it (preflight/readers/nvidia/nvml.py Sampler: SM clock,
power, temperature, clocks-event reasons, volatile uncorrectable ECC before
and after) and reads the kernel log's Xids before and after. The judges are
pure functions of those facts: a wrong result (against the GPU's own reference,
and its reference against its identical peers'), a new uncorrectable ECC error
or Xid, thermal or power-brake throttling in more than the profile's share of
the samples, a median SM clock under the profile's floor, or a GPU that is an
outlier against the node's median (preflight/checkkit/outliers.py).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from typing import ClassVar

from pydantic import Field

from preflight.base.findings import Finding, Measurement, Status
from preflight.checkkit import burnin_xid, outliers
from preflight.checkkit.burnin_traces import thinned, trace_summary
from preflight.checkkit.figures import Figure
from preflight.gpuwork import launch, ranks, ranks_judge
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.load_expectations import BurninExpect, OutlierExpect
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.kernel import log_sources

FAIL, WARN = Status.FAIL, Status.WARN
NO_NVML = "no NVML on a profile without GPUs: clocks, power, temperature, throttling, ECC and Xids are not sampled"
DIAG = "drain the node; run `dcgmi diag -r 3` (or `-r 4`) on that GPU and check `preflight xid`"


class RankReport(ranks.RankReport):
    """What checks/workers/burnin.py writes for one rank."""

    step_noun: ClassVar[str] = "burst"

    planned_seconds: float | None = None
    gemm_n: int | None = None
    gemms: int | None = None
    copy_bytes: int | None = None
    bursts: int = 0
    burst_at: list[float] = Field(default_factory=list)
    gemm_seconds: list[float] = Field(default_factory=list)
    copy_seconds: list[float] = Field(default_factory=list)
    wrong: list[dict] = Field(default_factory=list)
    wrong_bursts: int = 0
    burn_started_at: float | None = None  # time.time(): the NVML samples before it are not under load
    burn_seconds: float | None = None
    reference_checksum: str | None = None
    sm_count: int | None = None  # the GPU's multiprocessors: references are compared among GPUs of one name and SM count

    def progress(self) -> int:
        return self.bursts


class BurninFacts(ranks.RunFacts):
    uuids: dict[int, str] = Field(default_factory=dict)
    buses: dict[int, str] = Field(default_factory=dict)  # nvidia-smi index -> PCI bus id, for a rank whose torch does not say its own
    traces: list[nvml_facts.GpuTrace] = Field(default_factory=list)
    nvml_note: str | None = None  # why there is no trace
    new_xids: list[dict] = Field(default_factory=list)
    xid_log: str | None = None  # where the Xids came from, or why they could not be read
    xid_unread: dict[str, str] = Field(default_factory=dict)  # each kernel-log source that could not be read, and why
    xid_note: str | None = None  # what the kernel log's reading could not see (a wrapped ring, no journal), or how it pieced it
    xid_gap: str | None = None  # why Xids logged during the burn may be missing: the ring moved past them (lost_meanwhile)
    shortened: str | None = None  # why the burn ran shorter than the profile asks


# ---- figures -----------------------------------------------------------------------


def rank_figures(f: BurninFacts) -> dict[int, dict]:
    """Per rank: its GEMM and copy rates (median burst), bursts, and the NVML summary of its GPU under load."""
    by_bus = {t.pci_bus_id.lower(): t for t in f.traces}
    by_index = {t.index: t for t in f.traces}
    out: dict[int, dict] = {}
    for o in f.ranks:
        r = o.report
        if not isinstance(r, RankReport) or not r.gemm_seconds:
            continue
        fig: dict = {"who": o.who, "gpu": o.gpu, "bursts": r.bursts, "burn_seconds": r.burn_seconds,
                     "gemm_flops": 2.0 * (r.gemm_n or 0) ** 3 * (r.gemms or 1) / statistics.median(r.gemm_seconds),
                     "copy_bytes_per_second": 2.0 * (r.copy_bytes or 0) / statistics.median(r.copy_seconds)}  # read + written
        trace = by_bus.get((r.pci_bus_id or "").lower()) or by_index.get(ranks.gpu_index(o.gpu))  # type: ignore[arg-type]
        if trace is not None:
            fig.update(trace_summary(trace, r.burn_started_at, r.burn_seconds))
        out[o.rank] = fig
    return out


def series(f: BurninFacts) -> dict[str, dict[str, list]]:
    """Each GPU's samples under load as time series (seconds into its burn), for the report
    page's traces (burnin_traces.thinned)."""
    by_bus = {t.pci_bus_id.lower(): t for t in f.traces}
    by_index = {t.index: t for t in f.traces}
    out = {}
    for o in f.ranks:
        r = o.report
        if not isinstance(r, RankReport) or r.burn_started_at is None:
            continue
        # A rank that hung or died mid-burn never wrote burn_seconds: its last burst bounds it, and it is the one to look at.
        seconds = r.burn_seconds if r.burn_seconds is not None else (r.burst_at[-1] if r.burst_at else None)
        trace = by_bus.get((r.pci_bus_id or "").lower()) or by_index.get(ranks.gpu_index(o.gpu))  # type: ignore[arg-type]
        if trace is None or seconds is None:
            continue
        out[o.gpu or o.who] = thinned(trace, r.burn_started_at, seconds)
    return out


# ---- judging ------------------------------------------------------------------------


def judge_wrong(f: BurninFacts) -> list[Finding]:
    """A result that differs from the reference: the first rank to go wrong, when and in which burst."""
    bad = [(o.report.wrong[0], o) for o in f.ranks if isinstance(o.report, RankReport) and o.report.wrong]
    out = []
    for first, o in sorted(bad, key=lambda b: b[0]["at_seconds"]):
        rep = o.report
        what = "GEMM result" if first["what"] == "gemm" else "copy"
        cause = (f"{o.who}: the {what} of burst {first['burst']} ({first['at_seconds']:g} s into the burn-in) differs from the reference in "
                 f"{first['elements']} element(s) (first at index {first['first_index']}, off by up to {first['max_abs_diff']:g}); "
                 f"{rep.wrong_bursts} of {rep.bursts} bursts were wrong: the same inputs on the same GPU must give the same bits")
        remedy = DIAG if o.gpu else "drain the host; run a verifying CPU stress test on it (`stress-ng --matrix 0 --verify`) and check its memory (memtest86+)"
        out.append(Finding(FAIL, f"{o.gpu or o.who} computes wrong results under load (from {first['at_seconds']:g} s, burst {first['burst']})", cause, remedy))
    return out


def judge_reference(f: BurninFacts) -> list[Finding]:
    """The reference product, computed once at the start, against the other GPUs' of the same
    name and SM count: a GPU that computes the same wrong bits every time agrees with itself,
    so only its peers can tell. Identical GPUs give identical bits (cuBLAS "Results
    reproducibility": the same architecture and SM count, one toolkit); the train check holds
    its logits to the same rule. Only GPU ranks: a CPU library may take another path on
    another buffer's alignment."""
    by_name: dict[tuple, dict[int, ranks.RankOutcome]] = {}
    for o in f.ranks:
        r = o.report
        if isinstance(r, RankReport) and r.reference_checksum and r.device == "cuda" and r.gpu_name and r.sm_count:
            by_name.setdefault((r.gpu_name, r.sm_count), {})[o.rank] = o
    out = []
    for group in by_name.values():
        counts = Counter(o.report.reference_checksum for o in group.values())  # type: ignore[union-attr]
        if len(counts) < 2:
            continue
        (common, n), (_, m) = counts.most_common(2)
        odd = [o for o in group.values() if n == m or o.report.reference_checksum != common]  # type: ignore[union-attr]
        sums = ", ".join(f"{o.gpu or o.who} {o.report.reference_checksum}" for o in odd)  # type: ignore[union-attr]
        names = ", ".join(o.gpu or o.who for o in odd)
        head = (f"{names} compute{'s' if len(odd) == 1 else ''} a different GEMM result than {'its' if len(odd) == 1 else 'their'} peers" if n > m
                else f"GPUs disagree on the same GEMM: {names}")
        peers = f"than the other {n} (checksum {common})" if n > m else "and no majority agrees"
        out.append(Finding(FAIL, head, f"the same seeded reference product gave different bits on {sums} {peers}: a GPU that computes the same wrong "
                                       "answer every time passes its own bursts, but identical GPUs must give identical bits", DIAG))
    return out


def judge_nvml(figs: dict[int, dict], expect: BurninExpect) -> list[Finding]:
    out = []
    for fig in figs.values():
        who = fig["gpu"] or fig["who"]
        if fig.get("ecc_new"):
            out.append(Finding(FAIL, f"{who}: {fig['ecc_new']} new uncorrectable ECC error(s) during burn-in",
                               f"{who}'s volatile uncorrectable ECC count rose from {fig['ecc_before']} by {fig['ecc_new']} under load",
                               "drain the node; reset the GPU (`nvidia-smi -r`) and check row remapping (`nvidia-smi -q -d ROW_REMAPPER`); RMA if it recurs"))
        held = {k: v for k, v in (fig.get("throttle_share") or {}).items() if k in expect.throttle_reasons and v > expect.throttle_fraction}
        if held:
            words = ", ".join(f"{k} in {v:.0%} of samples" for k, v in held.items())
            out.append(Finding(FAIL, f"{who} throttled under sustained load ({', '.join(held)})",
                               f"{who}: {words} (more than {expect.throttle_fraction:.0%} is sustained); max temperature {fig.get('temperature_max_c')} C",
                               "check the node's cooling (fans, airflow, inlet temperature) and power delivery (PSUs, `nvidia-smi -q -d PERFORMANCE,POWER`)"))
        median, floor = fig.get("clock_median_mhz"), expect.clock_floor(fig.get("clock_max_mhz"))
        if floor is not None and median is not None and median < floor:
            of = f", {expect.clock_floor_fraction:.0%} of its {fig['clock_max_mhz']} MHz top clock" if expect.clock_floor_mhz is None else ""
            out.append(Finding(FAIL, f"{who}: SM clock sags to {median:g} MHz under load",
                               f"{who}'s median SM clock under load was {median:g} MHz (min {fig['clock_min_mhz']}), under the {floor:g} MHz floor{of} ({expect.clock_source})",
                               "check clocks and their reasons (`nvidia-smi -q -d PERFORMANCE,CLOCK`), application clocks and power limits; " + DIAG))
    return out


# (figure key, its name: its band's and its shortfall metric's, unit, scale). Not temperature:
# a ratio of Celsius values means nothing, and GPUs at different places in a chassis's
# airflow run 10-15 C apart under the same load; a GPU too hot shows as thermal slowdown.
OUTLIER_FIGURES = (("gemm_flops", "burnin_gemm_throughput", "flops_per_second", 1), ("copy_bytes_per_second", "burnin_copy_bandwidth", "bytes_per_second", 1),
                   ("clock_median_mhz", "burnin_sm_clock", "hertz", 1e6))
WORDS = {"burnin_gemm_throughput": "GEMM throughput under sustained load", "burnin_copy_bandwidth": "copy bandwidth under sustained load",
         "burnin_sm_clock": "median SM clock under sustained load"}
REASONS = {name: "its clocks, temperature and power against its peers' (`nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE,POWER`), "
                 "its cooling and power delivery, then `dcgmi diag -r 3` on that GPU" for _, name, _, _ in OUTLIER_FIGURES}
RERUN = "preflight run --level full --only burnin"


def outlier_figures(f: BurninFacts, figs: dict[int, dict]) -> list[Figure]:
    """Each rank's rates and median clock as figures (checkkit/figures.py), for the node's median."""
    return [Figure(name=name, unit=unit, value=fig[key] * scale, where=fig["gpu"] or fig["who"], rank=rank, labels=ranks.labels(rank, fig["gpu"], f.uuids))
            for rank, fig in figs.items() for key, name, unit, scale in OUTLIER_FIGURES if fig.get(key) is not None]


def judge_outliers(f: BurninFacts, figs: dict[int, dict], band: OutlierExpect | None) -> list[Finding]:
    return outliers.judge(outlier_figures(f, figs), band, tuple(WORDS), WORDS, REASONS, RERUN)


def judge_unwatched(f: BurninFacts) -> list[Finding]:
    """On a GPU node, a burn-in that could not watch the GPUs must not read as a full pass."""
    out = []
    if f.nvml_note and f.nvml_note != NO_NVML:
        out.append(Finding(WARN, "burn-in ran unwatched by NVML: clocks, power, throttling and ECC not judged", f.nvml_note,
                           "check that NVML answers (`nvidia-smi -q -d PERFORMANCE,POWER,ECC`) and run the burn-in again"))
    if f.shortened:
        out.append(Finding(WARN, "burn-in shortened to fit the check's deadline", f.shortened,
                           "raise [timeouts] burnin (in a site profile of the same name) above [burnin] seconds plus a minute"))
    if f.xid_log and f.xid_log.startswith(burnin_xid.XID_UNJUDGED):
        out.append(Finding(WARN, "Xids during burn-in not judged", f.xid_log,
                           "give the run read access to the kernel log (dmesg, journalctl or /dev/kmsg) and run the burn-in again"))
    if f.xid_gap:
        out.append(Finding(WARN, "Xids during burn-in not all seen", f.xid_gap,
                           "keep the kernel's messages in the journal (systemd-journald), or a larger ring (the log_buf_len= boot "
                           "parameter), find what filled it (`dmesg | tail`), and run the burn-in again"))
    return out


def judge(f: BurninFacts, figs: dict[int, dict], expect: BurninExpect, band: OutlierExpect | None,
          not_given: set[str] | frozenset[str] = frozenset()) -> list[Finding]:
    """``not_given``: the slots of the node's GPUs not given to this run (NodeShape.not_given)."""
    return (ranks_judge.judge_run(f, "the burn-in", ranks.by_hand(f, "burnin.py"), judge_wrong(f) + judge_reference(f))
            + judge_nvml(figs, expect) + burnin_xid.judge(f.new_xids, f.xid_note == log_sources.SYSLOG_NOTE, burnin_xid.burned_gpus(f.ranks, f.buses), DIAG, RERUN, not_given) + judge_outliers(f, figs, band) + judge_unwatched(f))


def measurements(f: BurninFacts, figs: dict[int, dict], band: OutlierExpect | None) -> list[Measurement]:
    out = []
    units = (("gemm_flops", "burnin_gemm_throughput", "flops_per_second", 1), ("copy_bytes_per_second", "burnin_copy_bandwidth", "bytes_per_second", 1),
             ("clock_min_mhz", "burnin_sm_clock_min", "hertz", 1e6), ("clock_median_mhz", "burnin_sm_clock_median", "hertz", 1e6),
             ("temperature_max_c", "burnin_temperature_max", "celsius", 1), ("power_median_w", "burnin_power_median", "watts", 1),
             ("power_max_w", "burnin_power_max", "watts", 1))
    for rank, fig in figs.items():
        labels = ranks.labels(rank, fig["gpu"], f.uuids)
        out += [Measurement(name=name, unit=unit, value=fig[key] * scale, labels=labels) for key, name, unit, scale in units if fig.get(key) is not None]
    return out + outliers.measurements(outlier_figures(f, figs), band, tuple(WORDS))


# ---- gathering -------------------------------------------------------------------------


# What the check needs beside the burn itself: the launch or stage start, the reference
# product, the last burst past the time, and the NVML sampler's stop.
BURN_MARGIN = 60.0


def burn_seconds(asked: float, left: float) -> float:
    """The burn's length: as asked, unless the check's deadline leaves less room."""
    return round(min(asked, max(1.0, left - BURN_MARGIN)), 1)


def gather(ctx: Context, nproc: int, expect: BurninExpect, backend: str) -> BurninFacts:
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts = BurninFacts(python=python, backend=backend, nproc=nproc, uuids=ranks.gpu_uuids(ctx.results), buses=ranks.gpu_buses(ctx.results))
    left = ranks.time_left(ctx.deadline)
    burst_timeout = min(60.0, max(5.0, left / 4))
    seconds = burn_seconds(expect.seconds, left)
    if seconds < expect.seconds:
        facts.shortened = (f"[burnin] seconds = {expect.seconds:g}, but the check has {left:.0f} s in all (its timeout) and needs "
                           f"{BURN_MARGIN:g} s of it beside the burn: it burned {seconds:g} s")
    args = ["--backend", backend, "--device", "cuda" if backend == "nccl" else "cpu", "--seconds", f"{seconds:g}", "--gemm-n", str(expect.gemm_n),
            "--gemms", str(expect.gemms_per_burst), "--copy-bytes", str(expect.copy_bytes), "--timeout", f"{burst_timeout:g}"]
    worker = launch.Worker("burnin.py", args, nproc=nproc, rdzv_port=ctx.settings.rdzv_port)
    before, sampler = None, None
    if ctx.profile.has_gpus:
        before, facts.xid_log, span = burnin_xid.xid_counts(ctx.host, facts)
        try:
            sampler = nvml.Sampler(expect.sample_seconds, left)
        except OSError as e:
            facts.nvml_note = f"the NVML sampler could not start: {e}"
    else:
        facts.nvml_note = NO_NVML
    try:
        ranks.collect(facts, worker, RankReport, ctx.host.environ, left, ranks.settle_rule(nproc, burst_timeout, burst_timeout + ranks.STUCK), ctx.progress, ctx.worlds)
    finally:
        if sampler is not None:
            try:
                facts.traces = sampler.stop(timeout=max(5.0, min(20.0, ctx.deadline - time.monotonic())))
            except nvml.NvmlUnavailable as e:
                facts.nvml_note = f"NVML sampling failed: {e.cause}"
    if before is not None:
        after, where, span_after = burnin_xid.xid_counts(ctx.host, facts)
        new = burnin_xid.new_xids(before, after, where == facts.xid_log) if after is not None else None
        if after is None:
            facts.xid_log = where
        elif new is None:
            facts.xid_log = (f"{burnin_xid.XID_UNJUDGED}the kernel log was read from {facts.xid_log} before the burn-in and from {where} after, "
                             "and a line without a time stamp cannot be matched across them")
        else:
            # What the ring still holds is judged, and what it lost is said: a GPU failing under load
            # is just what floods the ring, and its Xid must still FAIL where it can be seen.
            facts.xid_log, facts.new_xids, facts.xid_gap = where, new, burnin_xid.lost_meanwhile(span, span_after, where)
    return facts


def summary(f: BurninFacts, figs: dict[int, dict]) -> str:
    parts = [f"{ranks.count(f)} under load"]
    secs = [fig["burn_seconds"] for fig in figs.values() if fig.get("burn_seconds")]
    if secs:
        parts.append(f"{min(secs):.0f} s, {sum(fig['bursts'] for fig in figs.values())} bursts verified")
    gemm = [fig["gemm_flops"] for fig in figs.values()]
    if gemm:
        parts.append(f"GEMM min {min(gemm) / 1e12:.3g} TFLOP/s")
    clocks = [fig["clock_min_mhz"] for fig in figs.values() if fig.get("clock_min_mhz") is not None]
    if clocks:
        temps = [fig["temperature_max_c"] for fig in figs.values() if fig.get("temperature_max_c") is not None]
        power = [fig["power_max_w"] for fig in figs.values() if fig.get("power_max_w") is not None]
        parts.append(f"SM clock min {min(clocks)} MHz, max {max(temps, default='?')} C, max {max(power, default=0):.0f} W")
    return ", ".join(parts)


class Burnin(Check):
    name = "burnin"
    description = "minutes of verified GEMM and copy load on every GPU: no wrong result, no new ECC error or Xid, no sustained throttling, no sagging clock or outlier GPU"
    requires = ("cuda",)
    timeout_seconds = 600.0
    order = 70

    def applies(self, ctx: Context) -> str | None:
        return f"profile {ctx.profile.name} has no [burnin] table" if ctx.profile.burnin is None else None

    def ranks_wanted(self, ctx: Context) -> int | None:
        return ctx.ranks(ctx.profile.burnin.ranks) if ctx.profile.burnin is not None else None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.burnin
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.has_gpus else "gloo"
        facts = gather(ctx, ctx.ranks(expect.ranks), expect, backend)
        figs = rank_figures(facts)
        not_given = ctx.shape.not_given() if ctx.shape else set()
        findings = judge(facts, figs, expect, ctx.profile.outliers, not_given)
        details = facts.model_dump(mode="json", exclude={"traces"})
        details["traces"] = {str(r): {k: v for k, v in fig.items() if k not in ("who",)} for r, fig in figs.items()}
        details["series"] = series(facts)
        details["outlier_bands"] = outliers.bands(ctx.profile.outliers, tuple(WORDS))
        details["nvml"] = facts.nvml_note or f"{len(facts.traces)} GPU(s) sampled every {expect.sample_seconds:g} s"
        details["outliers_judged"] = "against the node's median" if ctx.profile.outliers else f"profile {ctx.profile.name} has no [outliers] band: not judged"
        details["outliers"] = outliers.statuses(outlier_figures(facts, figs), ctx.profile.outliers, tuple(WORDS))
        details["xid_elsewhere"] = theirs = burnin_xid.given_elsewhere(facts.new_xids, burnin_xid.burned_gpus(facts.ranks, facts.buses), not_given)
        sources = burnin_xid.kernel_log_sources(facts.xid_log or "", facts.xid_unread)
        details.update(sources.details())
        lines = [line] if (line := sources.line()) else []
        lines += [f"Xid {e['code']} on {e['pci']} during the burn-in: a GPU not given to this run, judged by the run that holds it" for e in theirs]
        return self.conclude(findings, summary(facts, figs), measurements=measurements(facts, figs, ctx.profile.outliers) + sources.measurements(),
                             details=details, lines=lines)
