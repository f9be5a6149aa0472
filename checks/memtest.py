"""The memtest check (full level): patterns written over most of every GPU's
free memory and read back (a host buffer per gloo rank on the cpu profile),
capped by the profile's time.

Each rank (checks/workers/memtest.py) writes address-in-address, walking
ones and seeded random words and reads them back; a word that reads back
other than written FAILs naming the GPU, the pattern and the first
mismatching byte offsets with what was written and what was read. HBM with
ECC corrects single-bit errors silently, so what reaches this test is an
uncorrectable fault, or a part of memory ECC does not cover: either way the
GPU must not train. Patterns the time cap cut off are said, not passed over.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from pydantic import Field

from preflight.base.findings import Finding, Measurement, Status
from preflight.gpuwork import launch, ranks, ranks_judge
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.load_expectations import MemtestExpect

FAIL, WARN = Status.FAIL, Status.WARN
PATTERNS = ("address", "walking_ones", "random")


class RankReport(ranks.RankReport):
    """What checks/workers/memtest.py writes for one rank."""

    step_noun: ClassVar[str] = "pass"

    buffer_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None  # the GPU's memory; None on the host
    fraction: float | None = None  # of the free memory, as the worker took it (less on a GPU with the host's memory)
    contexts_elsewhere: list[int] = Field(default_factory=list)  # other GPUs (local ranks) this rank's process holds a context on
    patterns: list[dict] = Field(default_factory=list)  # {name, passes, seconds, mismatched_words}
    mismatches: list[dict] = Field(default_factory=list)  # {pattern, offset, wrote, read}: the first few
    not_reached: list[str] = Field(default_factory=list)
    step: int = 0
    test_seconds: float | None = None

    def progress(self) -> int:
        return self.step


class MemtestFacts(ranks.RunFacts):
    uuids: dict[int, str] = Field(default_factory=dict)


def judge_mismatches(f: MemtestFacts) -> list[Finding]:
    out = []
    for o in f.ranks:
        r = o.report
        if not isinstance(r, RankReport) or not r.mismatches:
            continue
        words = sum(p["mismatched_words"] for p in r.patterns)
        first = r.mismatches[0]
        where = "; ".join(f"{m['pattern']}: offset {m['offset']:#x} wrote {m['wrote']} read {m['read']}" for m in r.mismatches[:4])
        memory = "GPU memory" if o.gpu else "host memory"
        cause = f"{o.who}: {words} word(s) of {memory} read back other than written in a {_size(r.buffer_bytes)} buffer; first: {where}"
        remedy = ("drain the node; check `nvidia-smi -q -d ECC,ROW_REMAPPER` and `preflight xid`, reset the GPU (`nvidia-smi -r`) and run "
                  "`dcgmi diag -r 3`; a GPU whose memory returns wrong data goes back to the vendor") if o.gpu else "run memtest86+ on this host; replace the failing DIMM"
        out.append(Finding(FAIL, f"{o.gpu or o.who}: memory reads back wrong at offset {first['offset']:#x} ({first['pattern']})", cause, remedy))
    return out


def judge_coverage(f: MemtestFacts, expect: MemtestExpect) -> list[Finding]:
    """Patterns the time cap cut off, and GPUs of which too little was free to test:
    the memory is not vouched for by a pass that did not cover it."""
    out = []
    cut = {o.who: o.report.not_reached for o in f.ranks if isinstance(o.report, RankReport) and o.report.not_reached}
    if cut:
        words = "; ".join(f"{who}: {', '.join(names)}" for who, names in cut.items())
        out.append(Finding(WARN, "memory test cut short by its time cap", f"patterns not reached within [memtest] seconds = {expect.seconds:g}: {words}",
                           "raise [memtest] seconds in the profile, or lower [memtest] fraction"))
    # Half of what the fraction the worker took of a whole GPU would be: another process holds the rest.
    small = {o.gpu or o.who: o.report for o in f.ranks if isinstance(o.report, RankReport) and o.report.total_bytes and o.report.buffer_bytes is not None
             and o.report.buffer_bytes < (o.report.fraction or expect.fraction) * o.report.total_bytes / 2}
    if small:
        words = "; ".join(f"{who}: {_size(r.buffer_bytes)} of {_size(r.total_bytes)} ({_size(r.free_bytes or 0)} free)" for who, r in small.items())
        out.append(Finding(WARN, f"memory test covered under half of {', '.join(small)}'s memory", f"too little was free to test: {words}",
                           "run the full level on an idle node (`nvidia-smi` lists what holds GPU memory)"))
    return out


def foreign_contexts(f: MemtestFacts) -> dict[str, str]:
    """GPU -> whose context, besides its own rank's, takes part of its memory while it is
    tested: in a launch shared with bandwidth, local rank 0's, which made the P2P copies."""
    gpu = {o.rank: o.gpu or o.who for o in f.ranks}
    return {gpu.get(j, f"local rank {j}"): f"a context of {o.who}'s process (bandwidth's GPU->GPU copies), not free to test"
            for o in f.ranks if isinstance(o.report, RankReport) for j in o.report.contexts_elsewhere}


def judge(f: MemtestFacts, expect: MemtestExpect) -> list[Finding]:
    return ranks_judge.judge_run(f, "the memory test", ranks.by_hand(f, "memtest.py"), judge_mismatches(f)) + judge_coverage(f, expect)


def measurements(f: MemtestFacts) -> list[Measurement]:
    out = []
    for o in f.ranks:
        r = o.report
        if not isinstance(r, RankReport) or r.buffer_bytes is None:
            continue
        labels = ranks.labels(o.rank, o.gpu, f.uuids)
        out.append(Measurement(name="memtest_tested", unit="bytes", value=r.buffer_bytes, labels=labels))
        out.append(Measurement(name="memtest_mismatched_words", unit="count", value=sum(p["mismatched_words"] for p in r.patterns), labels=labels))
        if r.test_seconds:
            out.append(Measurement(name="memtest_duration", unit="seconds", value=r.test_seconds, labels=labels))
    return out


def gather(ctx: Context, nproc: int, expect: MemtestExpect, backend: str) -> MemtestFacts:
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts = MemtestFacts(python=python, backend=backend, nproc=nproc, uuids=ranks.gpu_uuids(ctx.results))
    left = ranks.time_left(ctx.deadline)
    pass_timeout = min(60.0, max(5.0, left / 4))
    args = ["--backend", backend, "--device", "cuda" if backend == "nccl" else "cpu", "--fraction", f"{expect.fraction:g}",
            "--seconds", f"{expect.seconds:g}", "--seed", str(expect.seed), "--timeout", f"{pass_timeout:g}"]
    if expect.host_bytes:
        args += ["--host-bytes", str(expect.host_bytes)]
    worker = launch.Worker("memtest.py", args, nproc=nproc, rdzv_port=ctx.settings.rdzv_port)
    ranks.collect(facts, worker, RankReport, ctx.host.environ, left, ranks.settle_rule(nproc, pass_timeout, pass_timeout + ranks.STUCK), ctx.progress, ctx.worlds)
    return facts


def summary(f: MemtestFacts) -> str:
    reps = [o.report for o in f.ranks if isinstance(o.report, RankReport) and o.report.buffer_bytes]
    parts = [ranks.count(f)]
    if reps:
        where = "GPU" if f.backend == "nccl" else "host buffer"
        parts.append(f"{_size(min(r.buffer_bytes or 0 for r in reps))} per {where}")
        done = sorted({p["name"] for r in reps for p in r.patterns}, key=PATTERNS.index)
        parts.append(f"patterns {', '.join(done)} read back intact")
        secs = [r.test_seconds for r in reps if r.test_seconds]
        if secs:
            parts.append(f"in {max(secs):.1f} s")
    return ", ".join(parts)


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class Memtest(Check):
    name = "memtest"
    description = "address, walking-ones and seeded random patterns over most of every GPU's free memory read back intact"
    requires = ("cuda",)
    timeout_seconds = 600.0
    order = 75

    def applies(self, ctx: Context) -> str | None:
        return f"profile {ctx.profile.name} has no [memtest] table" if ctx.profile.memtest is None else None

    def ranks_wanted(self, ctx: Context) -> int | None:
        return ctx.ranks(ctx.profile.memtest.ranks) if ctx.profile.memtest is not None else None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.memtest
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.has_gpus else "gloo"
        facts = gather(ctx, ctx.ranks(expect.ranks), expect, backend)
        findings = judge(facts, expect)
        details = {**facts.model_dump(mode="json"), "foreign_contexts": foreign_contexts(facts)}
        return self.conclude(findings, summary(facts), measurements=measurements(facts), details=details)
