"""Repeat a timed measurement until its figure is sure, or a cap is reached.

A fixed number of repeats is more than a quiet figure needs and fewer than a
noisy one does. Here each figure runs at least the profile's ``repeats``
(warm-up excluded), then repeats until the 95% confidence interval of its
statistic (the median; the straggler pass's first quartile) lies within
``tolerance`` of it, or until ``max_repeats`` repeats or ``max_seconds`` of
its time have been spent: the last case is reported as not converged, never
hidden.

The interval is distribution-free: sorted repeats x(1) <= ... <= x(n) hold the
q-quantile between x(l) and x(u) with probability at least 95% whatever the
distribution, since the count of repeats below it is Binomial(n, q) (the
classic interval for a quantile, as in Hahn & Meeker, Statistical Intervals).
Timings are skewed and heavy-tailed (a descheduled rank, a clock change), so
no normal-theory interval would be sound here. The relative width is the far
end's ratio to the statistic, max(m / x(l), x(u) / m) - 1: it bounds the
relative error of a time and of a rate (bytes / time) alike, so a bandwidth
and its time converge together.

Standard library only: workers run by path under the training environment's
interpreter, so this file beside them is importable as ``_converge``. The
agent (preflight/checkkit/figures.py) computes the same interval from the raw
repeats the worker reports; tests hold the two to each other.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

CONFIDENCE = 0.95
CONVERGED, MAX_REPEATS, MAX_SECONDS = "converged", "max_repeats", "max_seconds"


@lru_cache(maxsize=4096)
def ranks(n: int, q: float = 0.5, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based (l, u): x(l) <= the q-quantile <= x(u) with at least ``confidence``,
    each tail at most (1 - confidence) / 2; None where n repeats cannot say that
    (the median needs 6: with 5, min..max covers it only 93.75% of the time)."""
    tail = (1 - confidence) / 2
    below = _cdf(n, q)  # below[k] = P(Binomial(n, q) <= k)
    lo = 0
    while lo < n and below[lo] <= tail:  # P(B <= l - 1) <= tail: x(l) is under the quantile often enough
        lo += 1
    up = next((k for k in range(n + 1) if below[k] >= 1 - tail), n)  # P(B >= u) <= tail
    up += 1
    if lo < 1 or up > n:
        return None
    return lo, up


def _cdf(n: int, q: float) -> list[float]:
    """P(Binomial(n, q) <= k) for k = 0..n, in log space: 0.5^n underflows past n = 1074."""
    lq, lp = math.log(q), math.log1p(-q)
    out, total, log_pmf = [], 0.0, n * lp
    for k in range(n + 1):
        if k:
            log_pmf += math.log((n - k + 1) / k) + lq - lp
        total += math.exp(log_pmf)
        out.append(min(1.0, total))
    return out


def quantile(xs: list[float], q: float = 0.5) -> float:
    """The median (the mean of the middle two for an even count), else the nearest-rank quantile."""
    s = sorted(xs)
    if q == 0.5:
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    return s[max(0, math.ceil(q * len(s)) - 1)]


def relative_ci(xs: list[float], q: float = 0.5, confidence: float = CONFIDENCE) -> float | None:
    """max(m / x(l), x(u) / m) - 1 for the ``confidence`` interval of the q-quantile m;
    None where too few repeats give no interval or a time is not positive."""
    lu = ranks(len(xs), q, confidence)
    if lu is None:
        return None
    s = sorted(xs)
    lo, hi, m = s[lu[0] - 1], s[lu[1] - 1], quantile(s, q)
    if lo <= 0 or m <= 0:
        return None
    return max(m / lo, hi / m) - 1


@dataclass(frozen=True)
class Rule:
    """When to stop repeating one figure. ``min_repeats`` always run; then more
    until the interval is within ``tolerance``, or a cap: ``max_repeats``, or
    ``max_seconds`` since the figure's first warm-up repeat (a repeat that would
    end past it is not started)."""

    tolerance: float
    min_repeats: int
    max_repeats: int
    max_seconds: float
    q: float = 0.5

    def stop(self, xs: list[float], elapsed: float, done: int) -> str | None:
        """Why to stop now (CONVERGED, MAX_REPEATS, MAX_SECONDS), or None: repeat again.
        ``done``: repeats run so far, warm-up included, for the time the next one takes."""
        n = len(xs)
        if n < self.min_repeats:
            return None
        ci = relative_ci(xs, self.q)
        if ci is not None and ci <= self.tolerance:
            return CONVERGED
        if n >= self.max_repeats:
            return MAX_REPEATS
        if elapsed + elapsed / max(1, done) > self.max_seconds:
            return MAX_SECONDS
        return None


def repeat(once, rule: Rule, warmup: int, agree=None, slowest=None, clock=time.perf_counter) -> tuple[list[float], str]:
    """Call ``once(i)`` (it returns one repeat's seconds) ``warmup`` times untimed, then
    until ``rule`` stops; the timed repeats and why they stopped.

    Ranks that must run the same number of repeats (a collective hangs otherwise)
    decide together, between repeats, never inside one:
    - ``slowest(values) -> values``: the element-wise maximum over ranks. The rule
      then judges the slowest rank's time of each repeat (a collective's repeat is
      over when its slowest rank is done: the figure's own series), and every rank
      decides on the same numbers, so alike.
    - ``agree(flag) -> flag``: the maximum over ranks of "repeat again" (1.0) or "stop"
      (0.0): each rank judges its own figure, and all go on while any needs to.
    Neither: this rank decides alone (it measures while the others wait their turn).
    The rule is asked after each repeat while they are few, then as the count grows
    by a twentieth (thousands of latency samples): when depends on the count alone,
    the same on every rank."""
    start = clock()
    xs: list[float] = []
    for i in range(warmup):
        once(i)
    ask = rule.min_repeats
    while True:
        xs.append(once(warmup + len(xs)))
        if len(xs) < ask:
            continue
        ask = min(len(xs) + max(1, len(xs) // 20), rule.max_repeats)
        elapsed, done = clock() - start, warmup + len(xs)
        if slowest is not None:
            shared = slowest([elapsed, *xs])
            why = rule.stop(shared[1:], shared[0], done)
        else:
            why = rule.stop(xs, elapsed, done)
            if agree is not None and agree(0.0 if why else 1.0) > 0:
                why = None  # another rank needs more: this one goes on with it, or they would part ways
        if why:
            return xs, why
