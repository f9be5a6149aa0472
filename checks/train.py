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
times; the FLOP arithmetic (preflight/checkkit/train_figures.py), the probe's counts
(preflight/checkkit/train_plan.py) and the judging are pure functions. A speed figure or
straggler ratio beyond its bound is measured again, once, by a second launch
before it FAILs (preflight/checkkit/confirm.py); a wrong answer or NaN never is.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import ClassVar

from preflight.checkkit import figures as figs_mod
from preflight.checkkit import confirm
from preflight.checkkit import outliers
from preflight.checkkit.train_figures import FLOPS, MEMBERS, REASONS, WORDS, RankReport, TrainFacts, figures
from preflight.checkkit.train_plan import plan
from preflight.gpuwork import launch, ranks, ranks_judge
from preflight.pipeline import floor_bounds, shape
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Finding, Status, worst
from preflight.checkkit.figures import Figure
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.load_expectations import OutlierExpect, TrainExpect
from preflight.base.units import fmt_seconds, fmt_value

FAIL, WARN = Status.FAIL, Status.WARN

FLOORS = {
    "gemm_throughput": (FLOPS, "min"),  # per GPU: the n^3 bf16 matmul
    "train_mfu": ("ratio", "min"),
    "train_step_duration": ("seconds", "max"),  # the slowest rank's median synchronized step
    "train_step_duration_max": ("seconds", "max"),  # the longest single step of any rank
    "train_tokens_throughput": ("tokens_per_second", "min"),
}


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
        "run": ranks_judge.judge_run(f, "the training probe", ranks.by_hand(f, "train_probe.py")),
        "loss": judge_loss(f),
        "agreement": judge_agreement(f),
        "speed": judge_speed(figs, expect, floors),
        "straggler": judge_straggler(figs, expect),
        "setup": judge_setup(f),
    }


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
        return ("gemm_throughput",) if profile.has_gpus and profile.gpu.model_floors else ()

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

