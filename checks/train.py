"""The train check: a few real data-parallel training steps of a small GPT on
every GPU (gloo ranks on CPU), the last gate before the job.

It catches what isolated probes miss: a GPU that computes wrong answers
(the same seeded forward pass must give the same bits everywhere), ranks
whose parameters drift apart after the all-reduce, a loss that is not finite
or does not fall, a rank slower than its peers (each rank's own forward and
backward, timed without the gradient sync that would hide it), a slow GEMM,
and a step too slow for the SKU (MFU). The worker repeats each timed figure
until it is sure (the 95% interval of its median, of the compute passes' first
quartile, within the profile's tolerance) or a cap is reached, and reports raw
times; the FLOP arithmetic and the judging are pure functions here. A speed figure or
straggler ratio beyond its bound is measured again, once, by a second launch
before it FAILs (preflight/checkkit/confirm.py); a wrong answer or NaN never is.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from preflight.checkkit import figures as figs_mod
from preflight.checkkit import confirm
from preflight.checkkit import outliers
from preflight.gpuwork import launch, ranks
from preflight.pipeline import floor_bounds, shape
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Finding, Status, worst
from preflight.checkkit.figures import Figure, median, quantile
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.expectations import OutlierExpect, TrainExpect
from preflight.base.units import fmt_seconds, fmt_value

FAIL, WARN = Status.FAIL, Status.WARN
FLOPS = "flops_per_second"
# One untimed own forward+backward pass before the timed ones: the no_sync path's first run.
COMPUTE_WARMUP = 1

FLOORS = {
    "gemm_throughput": (FLOPS, "min"),  # per GPU: the n^3 bf16 matmul
    "train_mfu": ("ratio", "min"),
    "train_step_duration": ("seconds", "max"),  # the slowest rank's median synchronized step
    "train_step_duration_max": ("seconds", "max"),  # the longest single step of any rank
    "train_tokens_throughput": ("tokens_per_second", "min"),
}
WORDS = {
    "gemm_throughput": "GEMM throughput",
    "train_mfu": "model FLOPs utilization",
    "train_step_duration": "training step time p50",
    "train_step_duration_max": "training step time max",
    "train_tokens_throughput": "training throughput",
    "train_model_throughput": "model FLOP/s",
    "train_straggler_ratio": "slowest rank over the median (own compute)",
    "train_compute_duration": "own forward+backward time (first quartile)",
}
_SLOW = "clocks held down (power brake, thermal or HW slowdown: `nvidia-smi -q -d PERFORMANCE,CLOCK`), a power cap below default, another process on the GPU"
REASONS = {
    "gemm_throughput": _SLOW + ", or a GPU failing (`dcgmi diag -r 3`)",
    "train_mfu": _SLOW + "; or the host loop starved (too few vCPUs per GPU, ranks not pinned to their NUMA node, PCIe trained low) or slow collectives (the bandwidth check)",
}
REASONS["train_step_duration"] = REASONS["train_tokens_throughput"] = REASONS["train_mfu"]
REASONS["train_compute_duration"] = REASONS["gemm_throughput"] + "; on CPU ranks, other work on that rank's cores"
# Per GPU or per rank: each is also judged against the node's own median (checkkit/outliers.py).
# The synchronized step is not: every rank waits for the slowest, so all read alike.
MEMBERS = ("gemm_throughput", "train_compute_duration")


class RankReport(ranks.RankReport):
    """What checks/workers/train_probe.py writes for one rank."""

    losses: list[float | str] = Field(default_factory=list)  # "nan"/"inf" as text: JSON has no NaN
    initial_loss: float | str | None = None  # the first warm-up step's, before any update
    step_seconds: list[float] = Field(default_factory=list)
    compute_seconds: list[float] = Field(default_factory=list)
    gemm_seconds: list[float] = Field(default_factory=list)
    gemm_warmup: dict | None = None  # matmuls and seconds run untimed before the first timed burst
    warmup_seconds: list[float] = Field(default_factory=list)  # the untimed steps: the first pays the process's one-time costs
    phases: dict[str, float] = Field(default_factory=dict)  # seconds of each part on this rank: model, data_parallel, then each stage
    dynamo_imported: bool | None = None  # whether the probe's torch imported torch._dynamo after all (seconds a launch)
    params: int | None = None
    tokens_per_step: int | None = None
    model: dict = Field(default_factory=dict)
    logits_checksum: str | None = None
    logits_checksums: list[str] | None = None
    param_checksums: list[str] | None = None
    nonfinite_step: int | None = None
    shrunk: str | None = None
    reading: int = 1  # 2: the launch that measures again to confirm a figure beyond its floor
    stopped: dict[str, str] = Field(default_factory=dict)  # steps, compute, gemm -> converged, max_repeats or max_seconds
    tolerance: float | None = None  # what the worker repeated towards (the profile's); None: not judged

    STAGES: ClassVar[tuple[str, ...]] = ("agreement", "warmup", "steps", "compute", "checksum", "gemm")
    step_noun: ClassVar[str] = "stage"  # "died in steps (stage 3)": the probe's stages, not training steps

    def progress(self) -> int:
        return self.STAGES.index(self.stage) if self.stage in self.STAGES else 0


class TrainFacts(ranks.RunFacts):
    uuids: dict[int, str] = Field(default_factory=dict)


# ---- arithmetic ------------------------------------------------------------------


def flops_per_token(params: int, layers: int, d_model: int, seq: int) -> float:
    """Training FLOPs per token, forward and backward: 6N for the weights and
    12·L·d·T for attention (PaLM, Chowdhery et al. 2022, appendix B). N counts
    the tied embedding once: it is the output head's matmul, 6·d·vocab a token."""
    return 6 * params + 12 * layers * d_model * seq


def gemm_flops(n: int) -> float:
    """An n x n by n x n matmul: n^2 dot products of n multiply-adds."""
    return 2.0 * n**3


def straggler(compute: dict[int, float]) -> tuple[int, float]:
    """(the slowest rank, its own compute time over the median of the others'):
    against its peers, so with two ranks a rank 4x slower reads 4x, not 1.6x."""
    slowest = max(compute, key=lambda r: compute[r])
    return slowest, compute[slowest] / median([t for r, t in compute.items() if r != slowest])


def figures(f: TrainFacts, expect: TrainExpect) -> list[Figure]:
    out: list[Figure] = []
    reps = {o.rank: o.report for o in f.ranks if isinstance(o.report, RankReport)}
    gpu = {o.rank: o.gpu for o in f.ranks}
    for r, rep in reps.items():
        if rep.gemm_seconds:
            n = expect.gemm_n
            value = gemm_flops(n) / median(rep.gemm_seconds)
            out.append(Figure(name="gemm_throughput", unit=FLOPS, value=value, where=_who(r, gpu), labels=ranks.labels(r, gpu.get(r), f.uuids), repeats=len(rep.gemm_seconds), rank=r,
                              **figs_mod.sureness(rep.gemm_seconds, rep.tolerance, rep.stopped.get("gemm"))))
    done = [rep for rep in reps.values() if rep.step_seconds]
    if len(done) == f.nproc and done:
        worst_rank = max(reps, key=lambda r: median(reps[r].step_seconds) if reps[r].step_seconds else 0)
        step = median(reps[worst_rank].step_seconds)
        rep = reps[worst_rank]
        where = f"slowest of {f.nproc} ranks: {_who(worst_rank, gpu)}"
        # The step's figures all rest on the slowest rank's median step: they are as sure as it is.
        steps = {"repeats": len(rep.step_seconds), **figs_mod.sureness(rep.step_seconds, rep.tolerance, rep.stopped.get("steps"))}
        out.append(Figure(name="train_step_duration", unit="seconds", value=step, where=where, labels={"stat": "p50"}, rank=worst_rank, **steps))
        longest = max(reps, key=lambda r: max(reps[r].step_seconds))
        out.append(Figure(name="train_step_duration", floor="train_step_duration_max", unit="seconds", value=max(reps[longest].step_seconds),
                          where=f"longest step of {f.nproc} ranks: {_who(longest, gpu)}", labels={"stat": "max"}, repeats=len(reps[longest].step_seconds), rank=longest))
        if rep.tokens_per_step and rep.params:
            tokens = rep.tokens_per_step / step
            out.append(Figure(name="train_tokens_throughput", unit="tokens_per_second", value=tokens, where=f"{f.nproc} ranks", **steps))
            achieved = flops_per_token(rep.params, rep.model.get("layers", 0), rep.model.get("d_model", 0), rep.model.get("seq", 0)) * tokens
            out.append(Figure(name="train_model_throughput", unit=FLOPS, value=achieved, where=f"{f.nproc} ranks", **steps))
            if expect.peak_flops:
                out.append(Figure(name="train_mfu", unit="ratio", value=achieved / (expect.peak_flops * f.nproc), where=f"{f.nproc} ranks", **steps))
    # Each rank's pass at the first quartile (nearest rank): a GPU that is really slow is
    # slow every time. Of the 3 passes a GPU profile takes that is the fastest, so a pass
    # another process interrupted is not a straggler; of the cpu profile's 20 on a shared
    # machine it is the 5th fastest, so neither is one lucky pass timed while the CPUs
    # happened to be free (by its fastest pass a healthy loaded rank read 2.8x).
    compute = {r: quantile(rep.compute_seconds, 0.25) for r, rep in reps.items() if rep.compute_seconds}
    for r, seconds in compute.items():
        out.append(Figure(name="train_compute_duration", unit="seconds", value=seconds, where=_who(r, gpu), labels=ranks.labels(r, gpu.get(r), f.uuids), rank=r,
                          repeats=len(reps[r].compute_seconds), **figs_mod.sureness(reps[r].compute_seconds, reps[r].tolerance, reps[r].stopped.get("compute"), q=0.25)))
    if len(compute) == f.nproc and f.nproc > 1:
        slowest, ratio = straggler(compute)
        out.append(Figure(name="train_straggler", floor="train_straggler_ratio", unit="ratio", value=ratio, where=_who(slowest, gpu), rank=slowest,
                          repeats=len(reps[slowest].compute_seconds), **straggler_sureness(reps, slowest)))
    return out


def straggler_sureness(reps: dict[int, RankReport], slowest: int) -> dict:
    """How sure the straggler ratio is: its numerator (the slowest rank's first quartile)
    within +-a, its denominator (the median of the others' quartiles, each within +-b_i,
    so within +-max b_i) within +-b: the ratio within (1 + a) / (1 - b) - 1."""
    def sure(r: int) -> dict:
        return figs_mod.sureness(reps[r].compute_seconds, reps[r].tolerance, reps[r].stopped.get("compute"), q=0.25)

    own, peers = sure(slowest), [sure(r) for r in reps if r != slowest]
    a, bs = own["ci"], [p["ci"] for p in peers]
    ci = None if a is None or None in bs or max(bs) >= 1 else (1 + a) / (1 - max(bs)) - 1
    tol = own["tolerance"]
    return {"ci": ci, "tolerance": tol, "converged": None if tol is None else ci is not None and ci <= tol, "stopped": own["stopped"]}


def _who(r: int, gpu: dict[int, str | None]) -> str:
    return f"rank {r}" + (f" ({gpu[r]})" if gpu.get(r) else "")


# ---- judging --------------------------------------------------------------------------


def judge_loss(f: TrainFacts) -> list[Finding]:
    """Finite on every step on every rank, and lower at the end than at the start."""
    reps = [(o, o.report) for o in f.ranks if isinstance(o.report, RankReport) and o.report.losses]
    bad = [(rep.nonfinite_step, o) for o, rep in reps if rep.nonfinite_step is not None]
    if bad:
        first = min(step for step, _ in bad)
        culprits = [o for step, o in bad if step == first]
        later = [o for step, o in bad if step != first]
        names = ", ".join(o.who for o in culprits)
        cause = f"the loss is not finite on {names} at step {first + 1}" + (f"; then on {', '.join(o.who for o in later)} (the all-reduce spread it)" if later else "")
        remedy = "run the GPU's diagnostics (`dcgmi diag -r 3`) and `preflight xid`: a NaN from a fixed seed on fixed data is the hardware or the driver"
        return [Finding(FAIL, f"loss is not finite on {culprits[0].who}", cause, remedy)]
    out = []
    for o, rep in reps:
        # Against the loss before any update: Adam's first steps are not monotone, so
        # the first timed step (after the warm-up) is no fair reference.
        first = rep.initial_loss if isinstance(rep.initial_loss, float) else rep.losses[0]
        last = rep.losses[-1]
        if isinstance(first, float) and isinstance(last, float) and not last < first:
            cause = f"{o.who}: loss {first:.4f} before training and {last:.4f} at the last step: it should fall on a fixed batch"
            out.append(Finding(FAIL, f"loss does not fall on {o.who}", cause, "a rank whose optimizer step has no effect: check the GPU (`dcgmi diag -r 3`) and the torch build"))
    return out


def _odd_ones(values: dict[int, str]) -> tuple[list[int], str | None]:
    """Ranks whose value differs from the majority's (all of them when there is none)."""
    counts = Counter(values.values())
    (common, n), *rest = counts.most_common()
    if rest and rest[0][1] == n:  # no majority: every rank is suspect
        return sorted(values), None
    return sorted(r for r, v in values.items() if v != common), common


def judge_agreement(f: TrainFacts) -> list[Finding]:
    out = []
    reps = {o.rank: o for o in f.ranks if isinstance(o.report, RankReport)}
    logits = {r: o.report.logits_checksum for r, o in reps.items() if o.report.logits_checksum}  # type: ignore[union-attr]
    if len(logits) > 1:
        odd, common = _odd_ones(logits)  # type: ignore[arg-type]
        if odd:
            names = ", ".join(reps[r].who for r in odd)
            cause = f"the same seeded forward pass gave different logits on {names} than on the other ranks (bit checksums {', '.join(logits[r] for r in odd)}): silent data corruption suspect"
            remedy = "drain the node; run `dcgmi diag -r 3` on that GPU and check `preflight xid`; a GPU that computes different results must not train"
            if common is None:  # no majority: which one is wrong cannot be told
                cause = f"the same seeded forward pass gave different logits on every rank and no majority agrees ({names}): silent data corruption suspect"
                head = "ranks disagree on the same forward pass: " + ", ".join(reps[r].gpu or reps[r].who for r in odd)
            else:
                head = f"{reps[odd[0]].gpu or reps[odd[0]].who} computes different results"
            out.append(Finding(FAIL, head, cause, remedy))
    params = {}
    for r, o in reps.items():
        sums = o.report.param_checksums  # type: ignore[union-attr]
        if sums and len(sums) == f.nproc:
            params = dict(enumerate(sums))
            break
    if len(params) > 1:
        odd, _ = _odd_ones(params)
        if odd:
            names = ", ".join(reps[r].who if r in reps else f"rank {r}" for r in odd)
            cause = f"after the all-reduced optimizer steps {names} hold parameters that differ from the other ranks' (bit checksums {', '.join(params[r] for r in odd)})"
            remedy = "a rank whose memory or arithmetic drifts, or a broken all-reduce: drain the node and run `dcgmi diag -r 3`"
            out.append(Finding(FAIL, "parameters diverged after all-reduce", cause, remedy))
    return out


RERUN = "preflight run --only train"
SOFT = ("speed", "straggler")  # the parts that judge measured figures: a miss there is measured again before it FAILs


def judge_speed(figs: list[Figure], expect: TrainExpect, floors: dict[str, ResolvedFloor]) -> list[Finding]:
    return figs_mod.judge_floors(figs, floors, expect.margin, WORDS, REASONS, RERUN)


def judge_straggler(figs: list[Figure], expect: TrainExpect) -> list[Finding]:
    out: list[Finding] = []
    ratio = next((g for g in figs if g.key == "train_straggler_ratio"), None)
    if ratio is not None and ratio.value > expect.straggler_max:
        cause = (f"{ratio.where}'s own forward+backward takes {ratio.value:.2f}x the median of the other ranks', over the {expect.straggler_max:g}x allowed "
                 f"({expect.straggler_source}); every synchronized step waits for it")
        remedy = "check that GPU's clocks and temperature (`nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE`) and that rank's CPUs; " + REASONS["gemm_throughput"]
        out.append(Finding(FAIL, f"straggler: {ratio.where} takes {ratio.value:.2f}x as long as its peers", cause, remedy))
    return out


def judge_outliers(figs: list[Figure], expect: OutlierExpect | None, first: list[Figure] | None = None, why: str | None = None) -> list[Finding]:
    """Each GPU's GEMM and each rank's own compute time against the node's median: the
    straggler ratio holds the slowest to a fixed bound; this names every rank, GEMM
    included, worse than its peers by the profile's band (past the FAIL band on both
    readings where it was measured again)."""
    return outliers.judge(figs, expect, MEMBERS, WORDS, REASONS, RERUN, first=first, why=why)


def judge_setup(f: TrainFacts) -> list[Finding]:
    shrunk = sorted({o.report.shrunk for o in f.ranks if isinstance(o.report, RankReport) and o.report.shrunk})
    if not shrunk:
        return []
    return [Finding(WARN, "probe model shrunk to fit free memory", "the profile's model did not fit: " + "; ".join(shrunk) + "; its speed figures describe a smaller model",
                    "find what holds the GPU memory (`nvidia-smi`), or lower [train] batch/layers in the profile")]


def judge(f: TrainFacts, figs: list[Figure], expect: TrainExpect, floors: dict[str, ResolvedFloor]) -> dict[str, list[Finding]]:
    return {
        "run": ranks.judge_run(f, "the training probe", ranks.by_hand(f, "train_probe.py")),
        "loss": judge_loss(f),
        "agreement": judge_agreement(f),
        "speed": judge_speed(figs, expect, floors),
        "straggler": judge_straggler(figs, expect),
        "setup": judge_setup(f),
    }


# ---- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the probe runs on each rank, in counts: the untimed warm-ups, and for each timed
    figure its least count and its caps (the worker repeats past the least until the figure's
    95% interval is within ``tolerance``: checks/workers/_converge.py). gather() hands the worker
    these numbers, and the time model (tests/perf/) multiplies them by each part's measured cost."""

    warmup_steps: int  # untimed steps: the first gives the loss before any update and pays the process's one-time costs
    steps: int  # timed synchronized steps, at least: the step figures, the longest step, the loss's fall
    max_steps: int
    compute_warmup: int  # untimed own forward+backward passes before the timed ones
    compute_steps: int
    max_compute_steps: int
    gemm_warmup_seconds: float  # untimed bursts (after two matmuls) until the power limiter settles
    gemm_burst: int  # matmuls in each timed burst
    gemm_repeats: int
    max_gemm_repeats: int
    max_seconds: float  # a figure's own time, past its least count
    tolerance: float

    def quiet(self) -> dict[str, int]:
        """Repeats where a quiet figure stops: its least count, or the first count whose
        statistic has a 95% interval at all (the median 6, the first quartile 13), within the cap."""
        def first(least: int, most: int, q: float) -> int:
            return min(most, next((n for n in range(least, most + 1) if figs_mod.interval_ranks(n, q) is not None), most))

        return {"steps": first(self.steps, self.max_steps, 0.5), "compute": first(self.compute_steps, self.max_compute_steps, 0.25),
                "gemm": first(self.gemm_repeats, self.max_gemm_repeats, 0.5)}

    def seconds(self, step: float, compute: float, matmul: float) -> dict[str, float]:
        """Each timed part's seconds on a quiet rank, from one step's, one own pass's and one
        matmul's seconds (the H200: 0.0437, 0.0379, 0.00163); a figure stops at its quiet count
        or where its next repeat would end past max_seconds, never before its least count."""
        def timed(unit: float, n: int, least: int, warm: float = 0.0) -> float:
            fits = int((self.max_seconds - warm) // unit) if unit > 0 else n
            return unit * min(n, max(least, fits))

        q, burst = self.quiet(), self.gemm_burst * matmul
        gemm_warm = 2 * matmul + (math.ceil(max(0.0, self.gemm_warmup_seconds - 2 * matmul) / burst) * burst if burst > 0 else 0.0)
        return {"warmup": self.warmup_steps * step, "steps": timed(step, q["steps"], self.steps),
                "compute": self.compute_warmup * compute + timed(compute, q["compute"], self.compute_steps, self.compute_warmup * compute),
                "gemm_warmup": gemm_warm, "gemm": timed(burst, q["gemm"], self.gemm_repeats)}


def plan(expect: TrainExpect) -> Plan:
    """The probe's plan for a profile's [train]."""
    e = expect
    return Plan(warmup_steps=e.warmup_steps, steps=e.steps, max_steps=e.max_steps, compute_warmup=COMPUTE_WARMUP, compute_steps=e.compute_steps,
                max_compute_steps=e.max_compute_steps, gemm_warmup_seconds=e.gemm_warmup_seconds, gemm_burst=e.gemm_burst, gemm_repeats=e.gemm_repeats,
                max_gemm_repeats=e.max_gemm_repeats, max_seconds=e.max_seconds, tolerance=e.tolerance)


# ---- gathering and reporting ----------------------------------------------------------------


def worker_args(expect: TrainExpect, backend: str, op_timeout: float, reading: int = 1) -> list[str]:
    """The worker's command line: the model from [train], every count from its plan."""
    e, n = expect, plan(expect)
    return ["--backend", backend, "--device", "cuda" if backend == "nccl" else "cpu", "--timeout", f"{op_timeout:g}",
            "--layers", str(e.layers), "--d-model", str(e.d_model), "--heads", str(e.heads), "--seq", str(e.seq), "--batch", str(e.batch),
            "--vocab", str(e.vocab), "--warmup-steps", str(n.warmup_steps), "--steps", str(n.steps), "--compute-steps", str(n.compute_steps),
            "--compute-warmup", str(n.compute_warmup), "--gemm-n", str(e.gemm_n), "--gemm-repeats", str(n.gemm_repeats), "--gemm-burst", str(n.gemm_burst),
            "--gemm-warmup-seconds", f"{n.gemm_warmup_seconds:g}", "--reading", str(reading),
            "--tolerance", f"{n.tolerance:g}", "--max-steps", str(n.max_steps), "--max-compute-steps", str(n.max_compute_steps),
            "--max-gemm-repeats", str(n.max_gemm_repeats), "--max-seconds", f"{n.max_seconds:g}"]  # fmt: skip


def gather(ctx: Context, nproc: int, expect: TrainExpect, backend: str, uuids: dict[int, str], reading: int = 1) -> TrainFacts:
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts = TrainFacts(python=python, backend=backend, nproc=nproc, uuids=uuids)
    left = ranks.time_left(ctx.deadline)
    op_timeout = min(expect.op_timeout_seconds, max(2.0, left / 3))
    args = worker_args(expect, backend, op_timeout, reading)
    # TunableOp would let each GPU pick its own GEMM kernels: the agreement check needs the same ones everywhere.
    worker = launch.Worker("train_probe.py", args, env={"PYTORCH_TUNABLEOP_ENABLED": "0"}, nproc=nproc, rdzv_port=ctx.settings.rdzv_port)
    ranks.collect(facts, worker, RankReport, ctx.host.environ, left, ranks.waited_out(nproc, op_timeout), ctx.progress, ctx.worlds)
    return facts


def summary(f: TrainFacts, figs: list[Figure]) -> str:
    reps = [o.report for o in f.ranks if isinstance(o.report, RankReport)]
    by = {g.key: g for g in figs}
    parts = [f"{f.nproc} {f.backend} rank(s)"]
    if reps and reps[0].params:
        parts.append(f"{reps[0].params / 1e6:.1f}M-parameter GPT")
    losses = reps[0].losses if reps else []
    first = reps[0].initial_loss if reps and isinstance(reps[0].initial_loss, float) else (losses[0] if losses else None)
    if isinstance(first, float) and losses and isinstance(losses[-1], float):
        parts.append(f"loss {first:.3f} -> {losses[-1]:.3f}, ranks agree")
    if "train_step_duration" in by:
        parts.append(f"step {fmt_seconds(by['train_step_duration'].value)}")
    if "train_mfu" in by:
        parts.append(f"MFU {by['train_mfu'].value:.1%}")
    gemm = [g.value for g in figs if g.name == "gemm_throughput"]
    if gemm:
        parts.append(f"GEMM min {fmt_value(min(gemm), FLOPS)}")
    if "train_straggler_ratio" in by:
        parts.append(f"straggler {by['train_straggler_ratio'].value:.2f}x")
    return ", ".join(parts) + figs_mod.unsure_note(figs, WORDS)


class Train(Check):
    name = "train"
    description = "a few real data-parallel training steps of a small GPT: loss falls, ranks agree bit for bit, no straggler, GEMM and MFU meet the SKU's floors"
    requires = ("cuda", "nccl")
    timeout_seconds = 180.0
    order = 60
    floor_units: ClassVar[dict[str, tuple[str, str]]] = FLOORS
    floor_sane = floor_bounds.by_unit(FLOORS)
    whole_node: ClassVar[tuple[str, ...]] = tuple(name for name in FLOORS if name != "gemm_throughput")  # GEMM is per GPU

    def required_floors(self, profile) -> tuple[str, ...]:
        return ("gemm_throughput",) if profile.has_gpus else ()

    def applies(self, ctx: Context) -> str | None:
        if ctx.profile.train is None:
            return f"profile {ctx.profile.name} has no [train] table"
        return None

    def ranks_wanted(self, ctx: Context) -> int | None:
        return ctx.ranks(ctx.profile.train.ranks) if ctx.profile.train is not None else None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.train
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.has_gpus else "gloo"
        nproc = ctx.ranks(expect.ranks)
        facts = gather(ctx, nproc, expect, backend, ranks.gpu_uuids(ctx.results))
        figs = figures(facts, expect)
        shrunk = any(isinstance(o.report, RankReport) and o.report.shrunk for o in facts.ranks)
        # Step time, throughput and MFU floors are for the whole node and the profile's model; GEMM is per GPU.
        floors, unjudged = shape.fitting_floors(dict(ctx.profile.floors), self.whole_node, ctx.shape, nproc, expect.ranks)
        if shrunk:
            unjudged.update({k: "the profile's model was shrunk to fit this GPU's memory" for k in floors if k != "gemm_throughput"})
            floors = {k: v for k, v in floors.items() if k == "gemm_throughput"}
        parts = judge(facts, figs, expect, floors)
        judged = floors  # what judge_speed holds the figures to (the straggler bound is judge_straggler's)
        # The straggler bound lives in [train] (a ratio between ranks, not a node figure); shown like a floor.
        floors = {**floors, "train_straggler_ratio": ResolvedFloor(value=expect.straggler_max, unit="ratio", bound="max", source=expect.straggler_source, origin=f"profile {ctx.profile.path} [train]")}
        # Confirm before FAIL: a figure beyond its floor (or the straggler bound) is measured again,
        # once, by the whole probe in a second launch (preflight/checkkit/confirm.py).
        again, again_figs, again_parts, why = None, None, None, None
        odd = outliers.failing(figs, ctx.profile.outliers, MEMBERS)  # past the FAIL band against the node's median: measured again too
        if confirm.missed(figs, floors) or odd:
            hard = [x for name, found in parts.items() if name not in SOFT for x in found]
            why = confirm.why_not(hard, False, confirm.need_seconds(facts.seconds), ranks.time_left(ctx.deadline))
            if why is None:
                again = gather(ctx, nproc, expect, backend, ranks.gpu_uuids(ctx.results), reading=2)
                again_figs = figures(again, expect)
                again_parts = judge(again, again_figs, expect, judged)
        soft_judge = lambda g: judge_speed(g, expect, judged) + judge_straggler(g, expect)  # noqa: E731
        settled = confirm.settle(figs, again_figs, floors, soft_judge, WORDS, RERUN, why)
        parts = confirm.combine(parts, again_parts, settled, SOFT, lambda name: "straggler" if name == "train_straggler_ratio" else "speed")
        # From here on the figures are those the verdict rests on, the measurements included: the second reading's where there is one.
        first, figs = figs, settled.figures
        # Against the node's own median, on the figures the verdict rests on; a name measured again is held to both readings.
        redone = set(odd) if again else set()
        parts["outliers"] = judge_outliers(figs, ctx.profile.outliers, [g for g in first if g.key in redone] if redone else None, why if odd and not again else None)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        details["confirm"] = confirm.details(settled, 2 if again else 1, ["the whole probe"] if again else [], why)
        if again:
            details["second_run"] = again.model_dump(mode="json")
        details["figures"] = [g.model_dump(mode="json") for g in figs]
        details["unjudged"] = unjudged = {k: v for k, v in unjudged.items() if k in {g.name for g in figs}}
        details["full_node"] = nproc == ((ctx.shape.gpus if ctx.shape else 0) or expect.ranks)
        details["outlier_bands"] = outliers.bands(ctx.profile.outliers, MEMBERS)
        details["outliers"] = outliers.statuses(figs, ctx.profile.outliers, MEMBERS, first=[g for g in first if g.key in redone] if redone else None)
        findings = [x for found in parts.values() for x in found]
        result = self.conclude(findings, summary(facts, figs), measurements=figs_mod.measurements(figs, floors) + outliers.measurements(figs, ctx.profile.outliers, MEMBERS), details=details)
        result.lines = figs_mod.lines(figs, floors, WORDS)
        result.lines += settled.lines + shape.unjudged_lines(unjudged)
        return result

