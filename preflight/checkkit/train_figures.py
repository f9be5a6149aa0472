"""The train check's figures: what its probe (checks/workers/train_probe.py)
reports for each rank (`RankReport`, `TrainFacts`), each figure's words and the
causes of a low one (`WORDS`, `REASONS`), and the arithmetic in pure functions:
the FLOPs of a training token and of a GEMM, the straggler against its peers,
and `figures`, the judged numbers from the ranks' raw times with how sure each is.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from preflight.checkkit import figures as figs_mod
from preflight.checkkit.figures import Figure, median, quantile
from preflight.gpuwork import ranks
from preflight.pipeline.load_expectations import TrainExpect

FLOPS = "flops_per_second"

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
