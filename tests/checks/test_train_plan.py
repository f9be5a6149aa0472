"""The train probe's plan (checkkit/train_plan.py `plan`): the counts the worker runs, which the
time model multiplies by measured costs, and the least counts the profiles give it."""

from __future__ import annotations

import pytest

from preflight.checkkit import figures, train_plan
from preflight.checks import train
from preflight.pipeline import profiles

GPU_PROFILES = ["h200-sxm", "h100-sxm", "a100-pcie", "a100-sxm4-80gb"]
# The H200's own figures (tests/fixtures/node/h200-1x-vm/report-standard-keep-going.json): the
# median synchronized step, the own pass's first quartile, one 8192^3 matmul (673.9 TFLOP/s).
STEP, COMPUTE, MATMUL = 0.0437245, 0.037892, 2 * 8192**3 / 673.9e12


def expect(name: str):
    return profiles.load(profiles.find(name, None)).train


@pytest.mark.parametrize("name", GPU_PROFILES + ["cpu"])
def test_the_gemm_starts_at_the_least_count_whose_median_has_an_interval(name):
    # Fewer bursts cannot say how sure the median is; more at least, before the rule is asked, buy nothing a quiet GPU needs.
    least = train_plan.plan(expect(name)).gemm_repeats
    assert figures.interval_ranks(least) is not None and figures.interval_ranks(least - 1) is None


def test_the_plan_is_the_profiles_counts():
    e = expect("h200-sxm")
    p = train_plan.plan(e)
    assert (p.warmup_steps, p.steps, p.max_steps) == (e.warmup_steps, e.steps, e.max_steps) == (3, 10, 30)
    assert (p.compute_warmup, p.compute_steps, p.max_compute_steps) == (1, 3, 20)
    assert (p.gemm_burst, p.gemm_repeats, p.max_gemm_repeats, p.gemm_warmup_seconds) == (50, 6, 30, 0.5)
    assert (p.max_seconds, p.tolerance) == (e.max_seconds, e.tolerance)


@pytest.mark.parametrize("name", GPU_PROFILES + ["cpu"])
def test_the_worker_is_given_every_count_of_the_plan(name):
    e = expect(name)
    p = train_plan.plan(e)
    args = train.worker_args(e, "gloo", 20.0)
    given = dict(zip(args[::2], args[1::2]))
    for field, flag in [("warmup_steps", "--warmup-steps"), ("steps", "--steps"), ("max_steps", "--max-steps"), ("compute_warmup", "--compute-warmup"),
                        ("compute_steps", "--compute-steps"), ("max_compute_steps", "--max-compute-steps"), ("gemm_burst", "--gemm-burst"),
                        ("gemm_repeats", "--gemm-repeats"), ("max_gemm_repeats", "--max-gemm-repeats")]:
        assert int(given[flag]) == getattr(p, field), flag
    assert float(given["--gemm-warmup-seconds"]) == p.gemm_warmup_seconds and float(given["--max-seconds"]) == p.max_seconds
    assert float(given["--tolerance"]) == p.tolerance


def test_a_quiet_figure_stops_where_its_statistic_first_has_an_interval():
    # The steps' least (10) is past the median's 6; the own passes' first quartile needs 13 whatever their least (3).
    assert train_plan.plan(expect("h200-sxm")).quiet() == {"steps": 10, "compute": 13, "gemm": 6}
    assert train_plan.plan(expect("cpu")).quiet() == {"steps": 8, "compute": 20, "gemm": 6}


def test_the_h200s_timed_parts_by_the_plan():
    s = train_plan.plan(expect("h200-sxm")).seconds(STEP, COMPUTE, MATMUL)
    burst = 50 * MATMUL  # 81.6 ms
    assert s["warmup"] == pytest.approx(3 * STEP)
    assert s["steps"] == pytest.approx(10 * STEP)
    assert s["compute"] == pytest.approx(14 * COMPUTE)  # one untimed pass, then 13
    assert s["gemm_warmup"] == pytest.approx(2 * MATMUL + 7 * burst)  # whole bursts until 0.5 s have passed
    assert s["gemm"] == pytest.approx(6 * burst)
    assert sum(s.values()) == pytest.approx(2.16, abs=0.01)  # 2.49 with the 10 bursts at least before


def test_a_figure_stops_at_its_time_cap_but_never_before_its_least_count():
    cpu = train_plan.plan(expect("cpu"))  # max_seconds 0.1: the least counts fill it
    s = cpu.seconds(0.02, 0.014, 0.0003)
    assert s["steps"] == pytest.approx(8 * 0.02) and s["compute"] == pytest.approx(21 * 0.014) and s["gemm"] == pytest.approx(6 * 50 * 0.0003)
    slow = train_plan.plan(expect("h200-sxm")).seconds(0.5, 0.5, 0.001)  # steps past the 3 s cap after 6: the least 10 still run
    assert slow["steps"] == pytest.approx(10 * 0.5) and slow["compute"] == pytest.approx(0.5 + 5 * 0.5)
