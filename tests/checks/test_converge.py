"""When a timed figure stops repeating (checks/workers/_converge.py), run in
this process without torch: the distribution-free interval of the median,
the stop rule, and ranks that decide together running the same number of
repeats. The agent's copy of the interval (preflight/checkkit/figures.py) is
held to the worker's here. The workers run it for real in test_bandwidth.py
and test_train.py."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
import threading

import pytest

from preflight.checkkit import figures
from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # as torchrun runs the workers: siblings import by bare name
_spec = importlib.util.spec_from_file_location("_converge_under_test", launch.WORKERS_DIR / "_converge.py")
conv = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = conv  # dataclasses look their module up there
_spec.loader.exec_module(conv)


def binom_cdf(n: int, q: float, k: int) -> float:
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))


def coverage(n: int, q: float, lo: int, up: int) -> float:
    """P(x(lo) <= the q-quantile <= x(up)) for any continuous distribution: P(lo <= B <= up - 1)."""
    return binom_cdf(n, q, up - 1) - binom_cdf(n, q, lo - 1)


# ---- the interval ------------------------------------------------------------------


def test_five_repeats_cannot_bound_the_median_at_95_percent_and_six_can():
    # min..max of 5 misses the median 2 x 0.5^5 = 6.25% of the time; of 6, 3.1%.
    assert conv.ranks(5) is None
    assert conv.ranks(6) == (1, 6)
    assert conv.ranks(10) == (2, 9)  # P(B <= 1) = 11/1024 <= 2.5% < P(B <= 2) = 56/1024


@pytest.mark.parametrize("q", [0.5, 0.25])
def test_every_interval_covers_at_least_95_percent_and_none_is_needlessly_wide(q):
    for n in range(1, 201):
        got = conv.ranks(n, q)
        if got is None:
            # Not even min..max keeps each tail within 2.5%.
            assert binom_cdf(n, q, 0) > 0.025 or 1 - binom_cdf(n, q, n - 1) > 0.025, n
            continue
        lo, up = got
        assert coverage(n, q, lo, up) >= 0.95, (n, got)
        # One order statistic tighter on either side lets that tail past 2.5%.
        assert binom_cdf(n, q, lo) > 0.025 and 1 - binom_cdf(n, q, up - 2) > 0.025, (n, got)


def test_the_first_quartile_needs_thirteen_repeats():
    # 0.75^12 = 3.2% > 2.5% >= 0.75^13: with 12 passes the fastest may still be above the quartile too often.
    assert conv.ranks(12, 0.25) is None and conv.ranks(13, 0.25) is not None
    assert conv.ranks(20, 0.25) == (2, 10)


def test_thousands_of_samples_do_not_underflow():
    lo, up = conv.ranks(100_000)
    # The normal approximation: 50,000 -+ 1.96 x sqrt(25,000) = 49,690 .. 50,310.
    assert abs(lo - 49_690) <= 2 and lo + up == 100_001


def test_the_relative_interval_of_a_median():
    assert conv.relative_ci([1.0] * 6) == 0.0
    # Ten repeats: x(2) .. x(9); one outlier at each end does not widen it.
    assert conv.relative_ci([0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0
    # 0.9 .. 1.2 around a median of 1.0: the far end is 1.2 / 1.0 (and 1.0 / 0.9 = 1.11).
    xs = [0.5, 0.9, 0.95, 1.0, 1.0, 1.0, 1.0, 1.1, 1.2, 3.0]
    assert conv.relative_ci(xs) == pytest.approx(0.2)
    assert conv.relative_ci([1.0] * 5) is None


def test_the_interval_holds_its_confidence_on_skewed_timings():
    # Timings are skewed: lognormal repeats, whose median is exp(0) = 1.
    rng = random.Random(7)
    for n in (6, 10, 30):
        lo_i, up_i = conv.ranks(n)
        hits = 0
        for _ in range(4000):
            s = sorted(rng.lognormvariate(0, 0.5) for _ in range(n))
            hits += s[lo_i - 1] <= 1.0 <= s[up_i - 1]
        assert hits / 4000 >= 0.94, (n, hits)  # >= 95% less the simulation's own error


def test_the_agent_computes_the_same_interval_as_the_worker():
    rng = random.Random(3)
    for n in list(range(1, 60)) + [100, 250, 1000]:
        for q in (0.5, 0.25):
            assert figures.interval_ranks(n, q) == conv.ranks(n, q), (n, q)
            xs = [rng.expovariate(1.0) + 0.01 for _ in range(n)]
            assert figures.relative_ci(xs, q) == conv.relative_ci(xs, q)


# ---- the rule ----------------------------------------------------------------------


RULE = conv.Rule(tolerance=0.02, min_repeats=6, max_repeats=12, max_seconds=10.0)


def test_the_least_repeats_always_run():
    assert RULE.stop([1.0] * 5, elapsed=100.0, done=5) is None


def test_a_quiet_figure_stops_at_the_least_repeats():
    assert RULE.stop([1.0, 1.01, 0.99, 1.0, 1.0, 1.005], elapsed=1.0, done=6) == conv.CONVERGED


def test_a_noisy_figure_goes_on_until_a_cap():
    noisy = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2]
    assert RULE.stop(noisy, elapsed=1.0, done=6) is None
    assert RULE.stop(noisy * 2, elapsed=1.0, done=12) == conv.MAX_REPEATS
    # 6 repeats took 9 s: a seventh would end past 10 s, so it is not started.
    assert RULE.stop(noisy, elapsed=9.0, done=6) == conv.MAX_SECONDS


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scripted(times: list[float], clock: Clock, calls: list[int]):
    def once(i: int) -> float:
        calls.append(i)
        clock.t += times[len(calls) - 1]
        return times[len(calls) - 1]

    return once


def test_warm_up_is_run_first_and_left_out():
    clock, calls = Clock(), []
    times = [5.0, 5.0] + [1.0] * 6  # two slow warm-ups, then quiet repeats
    xs, why = conv.repeat(scripted(times, clock, calls), RULE, warmup=2, clock=clock)
    assert calls == list(range(8)) and xs == [1.0] * 6 and why == conv.CONVERGED


def test_a_noisy_series_stops_at_the_repeat_cap():
    clock, calls = Clock(), []
    times = [1.0, 1.5, 0.7, 1.2, 0.8, 1.4] * 3
    xs, why = conv.repeat(scripted(times, clock, calls), conv.Rule(0.02, 6, 12, 1e9), warmup=0, clock=clock)
    assert len(xs) == 12 and why == conv.MAX_REPEATS


def test_slow_repeats_stop_at_the_seconds_cap():
    clock, calls = Clock(), []
    times = [1.0, 1.5, 0.7, 1.2, 0.8, 1.4] * 3  # 6.6 s for the least six; the eighth would end past 10 s
    xs, why = conv.repeat(scripted(times, clock, calls), conv.Rule(0.02, 6, 100, 8.0), warmup=0, clock=clock)
    assert len(xs) == 7 and why == conv.MAX_SECONDS and clock.t <= 8.0 + 1.5


def test_a_rank_whose_figure_is_sure_goes_on_while_another_needs_more():
    clock, calls = Clock(), []
    asked = []

    def agree(flag: float) -> float:  # the other rank needs two more repeats
        asked.append(flag)
        return max(flag, 1.0 if len(asked) <= 2 else 0.0)

    xs, why = conv.repeat(scripted([1.0] * 20, clock, calls), RULE, warmup=0, agree=agree, clock=clock)
    assert asked == [0.0, 0.0, 0.0] and len(xs) == 8 and why == conv.CONVERGED


class World:
    """Ranks as threads and an element-wise MAX all_reduce between them, as gloo would do it."""

    def __init__(self, n: int):
        self.n, self.barrier, self.lock, self.acc = n, threading.Barrier(n), threading.Lock(), None

    def reduce_max(self, values: list[float]) -> list[float]:
        if self.barrier.wait() == 0:
            self.acc = None
        self.barrier.wait()
        with self.lock:
            self.acc = list(values) if self.acc is None else [max(a, b) for a, b in zip(self.acc, values)]
        self.barrier.wait()
        out = list(self.acc)
        self.barrier.wait()
        return out


def timings(r: int):
    """Rank 0's repeats are quiet, rank 1's noisy: alone, they would stop at different counts."""
    rng = random.Random(r + 1)
    return lambda i: 1.0 + (0.001 if r == 0 else 0.5) * rng.random()


@pytest.mark.parametrize("mode", ["slowest", "agree"])
def test_ranks_deciding_together_run_the_same_number_of_repeats(mode):
    # In a collective the rank that went on would wait forever for the one that stopped.
    rule = conv.Rule(tolerance=0.05, min_repeats=6, max_repeats=40, max_seconds=1e9)
    alone = {r: conv.repeat(timings(r), rule, warmup=1) for r in (0, 1)}
    assert len(alone[0][0]) == 6 < len(alone[1][0])
    world, got = World(2), {}

    def rank(r: int) -> None:
        kw = {"slowest": world.reduce_max} if mode == "slowest" else {"agree": lambda flag: world.reduce_max([flag])[0]}
        got[r] = conv.repeat(timings(r), rule, warmup=1, **kw)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank hung waiting for the other"
    assert len(got[0][0]) == len(got[1][0]) >= len(alone[1][0]), got
