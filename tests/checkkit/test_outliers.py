"""The node's own median as the reference (preflight/checkkit/outliers.py)."""

from __future__ import annotations

import pytest

from preflight.base.findings import Status
from preflight.checkkit import outliers
from preflight.checkkit.figures import Figure
from preflight.pipeline.load_expectations import OutlierBand, OutlierExpect

BAND = OutlierBand(warn=0.10, fail=0.20, source="test")


def test_one_gpu_15_percent_slower_than_seven_peers_is_named_with_a_warning():
    copy = {f"GPU {i}": 2.0e12 for i in range(8)} | {"GPU 5": 1.7e12}
    (o,) = outliers.find(copy, True, BAND)
    assert (o.where, o.median, o.status) == ("GPU 5", 2.0e12, Status.WARN)
    assert o.off == pytest.approx(0.15)


def test_past_the_fail_band_it_fails_and_the_worst_comes_first():
    steps = {"rank 0": 0.10, "rank 1": 0.10, "rank 2": 0.13, "rank 3": 0.10, "rank 4": 0.115}
    found = outliers.find(steps, False, BAND)
    assert [(o.where, o.status) for o in found] == [("rank 2", Status.FAIL), ("rank 4", Status.WARN)]


def test_two_members_name_the_slower_one_only():
    # slow=2 on rank 1: 1 - 0.5 / 0.75 = a third worse than the median; rank 0 is as much better.
    found = outliers.find({"rank 0": 18e9, "rank 1": 9e9}, True, BAND)
    assert [(o.where, o.status) for o in found] == [("rank 1", Status.FAIL)]
    assert found[0].off == pytest.approx(1 / 3)


def test_better_than_the_median_is_never_an_outlier_and_one_member_has_no_reference():
    assert outliers.find({"GPU 0": 1.0, "GPU 1": 1.0, "GPU 2": 3.0}, True, BAND) == []
    assert outliers.find({"GPU 0": 1.0, "GPU 1": 1.0, "GPU 2": 0.3}, False, BAND) == []
    assert outliers.find({"GPU 0": 1.0}, True, BAND) == []
    assert outliers.find({"GPU 0": 0.0, "GPU 1": 0.0}, True, BAND) == []


def test_a_figure_may_have_a_band_of_its_own_and_warn_must_sit_below_fail():
    expect = OutlierExpect(warn=0.1, fail=0.2, source="s", figures={"step_time": {"warn": 0.3, "fail": 0.5, "source": "noisy"}})
    assert expect.band("step_time").warn == 0.3 and expect.band("memcpy_bandwidth") is expect
    with pytest.raises(ValueError, match="warn 0.3 must be below fail 0.2"):
        OutlierBand(warn=0.3, fail=0.2, source="s")


def test_the_bands_each_figure_is_judged_by_are_recorded_for_the_reports_readers():
    expect = OutlierExpect(warn=0.1, fail=0.2, source="s", figures={"step_time": {"warn": 0.3, "fail": 0.5, "source": "noisy"}})
    assert outliers.bands(expect, ("step_time", "memcpy_bandwidth")) == {"step_time": {"warn": 0.3, "fail": 0.5}, "memcpy_bandwidth": {"warn": 0.1, "fail": 0.2}}
    assert outliers.bands(None, ("step_time",)) == {}


# ---- confirm before FAIL: the outlier judge on two readings -------------------------------------

EXPECT = OutlierExpect(warn=0.10, fail=0.20, source="test band")
WORDS, REASONS = {"memcpy_bandwidth": "HBM copy"}, {"memcpy_bandwidth": "clocks, HBM temperature"}


def copies(*gbs: float) -> list[Figure]:
    return [Figure(name="memcpy_bandwidth", unit="bytes_per_second", value=v * 1e9, where=f"GPU {i}", labels={"gpu": str(i)}) for i, v in enumerate(gbs)]


def judged(second, first=None, why=None):
    return outliers.judge(second, EXPECT, ("memcpy_bandwidth",), WORDS, REASONS, "preflight run --only bandwidth", first=first, why=why)


def test_a_gpu_past_the_fail_band_is_measured_again_before_it_fails():
    slow = copies(2000, 2000, 2000, 1500)
    assert outliers.failing(slow, EXPECT, ("memcpy_bandwidth",)) == ["memcpy_bandwidth"]
    assert outliers.failing(copies(2000, 2000, 2000, 1900), EXPECT, ("memcpy_bandwidth",)) == []  # a WARN is not measured again
    (f,) = judged(copies(2000, 2000, 2000, 1450), first=slow)
    assert f.status == Status.FAIL and f.summary.startswith("GPU 3 HBM copy") and f.summary.endswith("(confirmed on a second reading)")
    assert "the first reading 25% off the median" in f.cause and "past the FAIL band both times" in f.cause


def test_past_the_fail_band_on_one_reading_only_warns_transient():
    # The first reading's slow GPU 3 measures like its peers the second time: a passing load, not the GPU.
    (f,) = judged(copies(2000, 2000, 2000, 1990), first=copies(2000, 2000, 2000, 1500))
    assert f.status == Status.WARN and f.summary == "GPU 3 HBM copy 1.99 TB/s, 1% under the node's median 2.00 TB/s (past the FAIL band on one reading of two: transient)"
    assert "the first reading 25% off the median, within the band on the second" in f.cause
    assert "or past the FAIL band on one of two readings," in f.cause
    # ... and the other way round: fine on the first, past the FAIL band on the second only.
    (f,) = judged(copies(2000, 2000, 2000, 1500), first=copies(2000, 2000, 2000, 1990))
    assert f.status == Status.WARN and "past the FAIL band on the second reading only" in f.cause and f.summary.endswith("transient)")


def test_a_fail_not_measured_again_keeps_its_fail_and_says_why():
    (f,) = judged(copies(2000, 2000, 2000, 1500), why="no time left to measure again (3 s left)")
    assert f.status == Status.FAIL and f.summary.endswith("(not confirmed)") and "Not confirmed: no time left" in f.cause
