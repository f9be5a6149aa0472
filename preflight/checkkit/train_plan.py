"""The train probe's plan: the counts it runs on each rank from a profile's
[train] (the untimed warm-ups, each timed figure's least count and caps), which
checks/train.py hands the worker and the time model (tests/perf/) multiplies by
each part's measured cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from preflight.checkkit import figures as figs_mod
from preflight.pipeline.load_expectations import TrainExpect

# One untimed own forward+backward pass before the timed ones: the no_sync path's first run.
COMPUTE_WARMUP = 1


@dataclass(frozen=True)
class Plan:
    """What the probe runs on each rank, in counts: the untimed warm-ups, and for each timed
    figure its least count and its caps (the worker repeats past the least until the figure's
    95% interval is within ``tolerance``: checks/workers/_converge.py). checks/train.py's gather()
    hands the worker these numbers, and the time model (tests/perf/) multiplies them by each part's
    measured cost."""

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
