"""The built 8 x H100 report the report page is tested on (tests/fixtures/reports/
h100-8x-built.json, made by build_h100_8x.py beside it): a valid report that gives every
picture of the page something to draw, and still what the checks' code makes of its
facts today, so it cannot drift from the checks silently."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPORTS

from preflight.outputs.html import page_facts, page_layout, page_traces
from preflight.pipeline.report import Report

FIXTURE = REPORTS / "h100-8x-built.json"


@pytest.fixture(scope="module")
def built() -> Report:
    return Report.model_validate_json(FIXTURE.read_bytes())


@pytest.fixture(scope="module")
def rebuilt() -> Report:
    spec = importlib.util.spec_from_file_location("build_h100_8x", REPORTS / "build_h100_8x.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def what_the_checks_said(r: Report) -> dict:
    """Each check's status, its measurements (name and labels) and the details it wrote: not
    the timings, which the build sets by hand."""
    return {c.check: (c.status, sorted((m.name, sorted(m.labels.items())) for m in c.measurements), sorted(c.details)) for c in r.checks}


def test_the_fixture_is_a_full_level_h100_report_that_fails_on_one_gpu_pair(built):
    assert (built.schema_version, built.profile, built.level, built.hostname) == (1, "h100-sxm", "full", "h100-node-07")
    assert built.shape.gpus == 8 and built.shape.fabric == "nvswitch" and len(built.shape.nics) == 12
    assert {c.check: c.status.value for c in built.checks} == {
        "cuda": "PASS", "topology": "PASS", "shm": "PASS", "nccl": "PASS", "bandwidth": "FAIL", "train": "PASS", "burnin": "WARN"}
    assert built.verdict.value == "fail" and built.exit_code == 1
    bw = next(c for c in built.checks if c.check == "bandwidth")
    assert bw.summary.startswith("GPU->GPU copy below floor on GPU 2 -> GPU 5") and "confirmed" in bw.summary


def test_rebuilding_it_gives_what_the_fixture_holds(built, rebuilt):
    assert what_the_checks_said(rebuilt) == what_the_checks_said(built)


def test_the_heatmap_has_every_ordered_pair_and_marks_only_gpu_2_to_gpu_5(built):
    m = page_facts.p2p(built)
    assert m.gpus == 8 and len(m.cells) == 56 and all(c.value for c in m.cells)
    assert [(c.src, c.dst, c.outlier) for c in m.cells if c.below_floor or c.outlier] == [(2, 5, "FAIL")]
    assert m.floor == 335e9


def test_gpu_6s_hbm_copy_is_the_weakest_bar_an_outlier_above_its_floor(built):
    hbm = next(g for g in page_facts.bar_groups(built) if g.name == "hbm_copy_bandwidth")
    assert len(hbm.bars) == 8
    weakest = hbm.bars[0]
    assert (weakest.who, weakest.outlier, weakest.past_bound) == ("GPU 6", "WARN", False)
    assert all(b.outlier is None for b in hbm.bars[1:])


def test_the_layout_train_and_burnin_pictures_have_their_facts(built):
    lay = page_layout.layout(built)
    assert lay.fabric == "nvswitch" and set(lay.numa) == {"0", "1"}
    gpus = {p.name: p.numa for p in lay.parts if p.kind == "gpu"}
    assert gpus == {f"GPU {i}": "0" if i < 4 else "1" for i in range(8)}
    assert sum(p.kind == "nic" for p in lay.parts) == 12
    loss, steps = page_traces.train_charts(built)
    assert len(loss.series) == 8 and all(len(s.ys) == 20 and s.ys[-1] < s.ys[0] for s in loss.series)
    charts = {c.title: c for c in page_traces.burnin_charts(built)}
    assert set(charts) == {"burn-in GEMM throughput per burst", "SM clock under load", "power draw", "GPU temperature"}
    gpu3 = next(s for s in charts["SM clock under load"].series if s.label == "GPU 3")
    late = [y for x, y in zip(gpu3.xs, gpu3.ys) if x > 30]
    assert len(gpu3.xs) == 60 and late and max(late) < 1.5e9


def test_gpu_3s_sagging_burnin_clock_is_a_ringed_bar(built):
    # The burn-in judges the clock's median as burnin_sm_clock and writes it as burnin_sm_clock_median: one bar, marked.
    clock = next(g for g in page_facts.bar_groups(built) if g.name == "burnin_sm_clock_median")
    assert clock.bars[0].who == "GPU 3" and clock.bars[0].outlier == "WARN"
    assert all(b.outlier is None for b in clock.bars[1:])
