"""A GPU, pair or rank judged against its node's own median (preflight/checkkit/outliers.py)
by the measuring checks, on recorded facts: rank reports built by hand in the shape the
workers write, no processes. The real run (slow=2 on one cpu rank) is in test_bandwidth.py."""

from __future__ import annotations

import sys

from preflight.base.findings import Measurement, Status
from preflight.checks import bandwidth, train
from preflight.checkkit import bandwidth_figures, train_figures
from preflight.checkkit.bandwidth_figures import BandwidthFacts, StepResult
from preflight.gpuwork import launch, ranks
from preflight.outputs.exporters import metrics
from preflight.pipeline.load_expectations import OutlierExpect, TrainExpect

sys.path.insert(0, str(launch.WORKERS_DIR))  # as torchrun runs the workers: _rank imports its siblings by bare name
from preflight.checks.workers import _rank  # noqa: E402

FAIL, WARN = Status.FAIL, Status.WARN
PY = "/opt/venv/bin/python"
GIB = 1 << 30
# The GPU profiles' band: WARN past 10% worse than the node's median, FAIL past 20%.
BAND = OutlierExpect(warn=0.10, fail=0.20, source="test profile: SuperBench -5% variance rule")


def rank_report(module, rank: int, world: int, **kw):
    base = dict(rank=rank, local_rank=rank, world_size=world, host="node1", pid=1000 + rank, python=PY, backend="nccl", device="cuda", torch_version="2.5.1", stage="done")
    return module.RankReport(**{**base, **kw})


def bw_facts(results) -> BandwidthFacts:
    """8 GPU ranks, each reporting ``results(rank)``."""
    outcomes = [ranks.RankOutcome(rank=r, report=rank_report(bandwidth, r, 8, results=results(r)), gpu=f"GPU {r}", last_line="") for r in range(8)]
    return BandwidthFacts(python=PY, backend="nccl", nproc=8, ended="exit 0", returncode=0, seconds=30.0, ranks=outcomes)


def hbm_copy(slow_rank: int, slower_by: float, **kw):
    """HBM copy of 1 GiB (2 GiB moved) in 1.0 ms on every GPU but ``slow_rank``, whose repeats take 1 / (1 - slower_by) as long."""
    def results(r: int) -> list[StepResult]:
        t = 1e-3 / (1 - slower_by) if r == slow_rank else 1e-3
        return [StepResult(step="hbm_copy", bytes=GIB, moved_bytes=2 * GIB, seconds=[t] * 7, **kw)]
    return results


def test_one_gpu_15_percent_slower_on_hbm_copy_warns_naming_it_and_by_how_much():
    figs = bandwidth_figures.figures(bw_facts(hbm_copy(5, 0.15)))
    (f,) = bandwidth.judge_outliers(figs, BAND, {}, all_nvlink=True)
    assert f.status == WARN
    assert f.summary.startswith("GPU 5 HBM copy 1826 GB/s, 15% under the node's median 2147 GB/s") or "15% under the node's median" in f.summary, f.summary
    assert "GPU 5" in f.summary and "on 1 of them" in f.cause and "WARN past 10%, FAIL past 20%: test profile: SuperBench" in f.cause
    assert "clocks held down" in f.remedy  # the cause of a slow HBM copy
    # It clears any floor a GPU would be held to: only the median tells it.
    assert bandwidth.judge_floors(figs, {}, 0.05) == []


def test_one_gpu_25_percent_slower_fails_and_the_healthy_ones_are_never_named():
    figs = bandwidth_figures.figures(bw_facts(hbm_copy(2, 0.25)))
    (f,) = bandwidth.judge_outliers(figs, BAND, {}, all_nvlink=True)
    assert f.status == FAIL and f.summary.startswith("GPU 2 HBM copy ") and "25% under the node's median" in f.summary
    assert "drain the node" in f.remedy and "GPU 0" not in f.cause
    assert bandwidth.judge_outliers(bandwidth_figures.figures(bw_facts(hbm_copy(2, 0.05))), BAND, {}, True) == []


def test_a_profile_without_a_band_judges_nothing_against_the_median():
    figs = bandwidth_figures.figures(bw_facts(hbm_copy(2, 0.5)))
    assert bandwidth.judge_outliers(figs, None, {}, True) == []
    assert not [m for m in bandwidth.measurements(figs, {}, None) if m.name.endswith("_median_shortfall")]


def test_a_figure_that_did_not_converge_is_still_judged_and_says_so():
    figs = bandwidth_figures.figures(bw_facts(hbm_copy(5, 0.25, tolerance=0.02, stopped="max_repeats")))
    slow = next(g for g in figs if g.where == "GPU 5")
    slow.converged, slow.ci = False, 0.09  # its repeats stopped at the cap with a wide interval
    (f,) = bandwidth.judge_outliers(figs, BAND, {}, True)
    assert f.status == FAIL and "GPU 5: " in f.cause and "(not converged within +-2%: known to +-9.0% after 7 repeats, at its cap of repeats)" in f.cause


def p2p_facts(seconds: dict[tuple[int, int], float]) -> BandwidthFacts:
    """4 GPUs, every ordered pair copying 256 MiB in ``seconds[(src, dst)]`` (10 ms by default)."""
    def results(r: int) -> list[StepResult]:
        return [StepResult(step="p2p", bytes=256 << 20, moved_bytes=256 << 20, peer=p, peer_access=True, seconds=[seconds.get((r, p), 0.01)] * 7)
                for p in range(4) if p != r]
    outcomes = [ranks.RankOutcome(rank=r, report=rank_report(bandwidth, r, 4, results=results(r)), gpu=f"GPU {r}", last_line="") for r in range(4)]
    return BandwidthFacts(python=PY, backend="nccl", nproc=4, ended="exit 0", returncode=0, seconds=30.0, ranks=outcomes)


# GPUs 0-1 and 2-3 joined by NVLink bridges, the other pairs across the CPUs (nvidia-smi topo -m).
KINDS = {frozenset((0, 1)): "NV4", frozenset((2, 3)): "NV4", **{frozenset((a, b)): "SYS" for a in (0, 1) for b in (2, 3)}}


def test_a_p2p_pair_is_judged_against_the_pairs_over_the_same_kind_of_link():
    # Cross-socket pairs run at a fifth of the NVLink pairs: that is the board, not a fault.
    sys_pairs = {(a, b): 0.05 for a in range(4) for b in range(4) if a != b and frozenset((a, b)) in KINDS and KINDS[frozenset((a, b))] == "SYS"}
    figs = bandwidth_figures.figures(p2p_facts(sys_pairs))
    assert bandwidth.judge_outliers(figs, BAND, KINDS, all_nvlink=False) == []
    # One SYS pair 30% slower than the other SYS pairs: named, with both GPUs.
    figs = bandwidth_figures.figures(p2p_facts({**sys_pairs, (1, 3): 0.05 / 0.7}))
    (f,) = bandwidth.judge_outliers(figs, BAND, KINDS, all_nvlink=False)
    assert f.status == FAIL and f.summary.startswith("GPU 1 -> GPU 3 GPU->GPU copy ") and "30% under the node's median" in f.summary
    assert "on 1 of them" in f.cause and "(the median of the 8 over SYS links)" in f.cause  # held to the 8 ordered SYS pairs only
    shortfall = {(m.labels["gpu"], m.labels["peer_gpu"]): m for m in bandwidth.measurements(figs, {}, BAND, KINDS) if m.name == "p2p_bandwidth_median_shortfall"}
    assert round(shortfall[("1", "3")].value, 2) == 0.30 and shortfall[("1", "3")].ceiling == 0.20 and len(shortfall) == 12


def test_pairs_whose_link_is_unknown_are_judged_only_on_an_nvswitch_board():
    figs = bandwidth_figures.figures(p2p_facts({(1, 3): 0.02}))  # half the speed of the others
    assert bandwidth.judge_outliers(figs, BAND, {}, all_nvlink=False) == []
    (f,) = bandwidth.judge_outliers(figs, BAND, {}, all_nvlink=True)
    assert f.status == FAIL and "GPU 1 -> GPU 3" in f.summary


def test_memcpy_shortfall_becomes_a_metric_beside_its_ceiling():
    """slow=2 on one of two cpu ranks: a third under the median (``rank 1 memcpy ..., 33% under``)."""
    def results(r: int) -> list[StepResult]:
        return [StepResult(step="memcpy", bytes=64 << 20, moved_bytes=128 << 20, seconds=[0.01 * (2 if r == 1 else 1)] * 7)]
    outcomes = [ranks.RankOutcome(rank=r, report=rank_report(bandwidth, r, 2, results=results(r), backend="gloo", device="cpu"), gpu=None, last_line="") for r in range(2)]
    f = BandwidthFacts(python=PY, backend="gloo", nproc=2, ended="exit 0", returncode=0, seconds=3.0, ranks=outcomes)
    figs = bandwidth_figures.figures(f)
    (finding,) = bandwidth.judge_outliers(figs, BAND, {}, False)
    assert finding.summary == "rank 1 host memcpy 6.71 GB/s, 33% under the node's median 10.1 GB/s"
    ms = [m for m in bandwidth.measurements(figs, {}, BAND) if m.name == "memcpy_bandwidth_median_shortfall"]
    assert {m.labels["rank"]: round(m.value, 3) for m in ms} == {"0": -0.333, "1": 0.333}
    text = "".join(f"{s.name}{s.labels} {s.value}\n" for fam in metrics.measurement_families(_report(ms)) for s in fam.samples)
    assert "preflight_memcpy_bandwidth_median_shortfall_ratio{'rank': '1'} 0.333333" in text
    assert "preflight_memcpy_bandwidth_median_shortfall_ceiling_ratio{'rank': '1'} 0.2" in text


def _report(ms: list[Measurement]):
    class C:  # what measurement_families reads of a report
        check, measurements = "bandwidth", ms

    class R:
        checks, history = [C], None  # a report's results: its checks, and the history's (none here)
    return R


def train_facts(compute: dict[int, float], gemm: dict[int, float]) -> train_figures.TrainFacts:
    """8 GPU ranks: 400 ms of own compute and 1.5 ms GEMMs unless given."""
    def rep(r: int):
        return rank_report(train_figures, r, 8, losses=[10.4, 9.8, 9.1], step_seconds=[0.5] * 3, compute_seconds=[compute.get(r, 0.40)] * 3,
                           gemm_seconds=[gemm.get(r, 0.0015)] * 3, logits_checksum="1", param_checksums=["2"] * 8)
    outcomes = [ranks.RankOutcome(rank=r, report=rep(r), gpu=f"GPU {r}", last_line="") for r in range(8)]
    return train_figures.TrainFacts(python=PY, backend="nccl", nproc=8, ended="exit 0", returncode=0, seconds=30.0, ranks=outcomes)


def test_a_rank_slower_at_its_own_compute_is_named_by_the_median_and_the_straggler_ratio_still_judges():
    ex = TrainExpect(sizes_source="t", straggler_source="t", straggler_max=1.15, gemm_n=8192)
    figs = train_figures.figures(train_facts({3: 0.52}, {6: 0.0015 / 0.85}), ex)
    found = train.judge_outliers(figs, BAND)
    assert sorted((f.status.value, f.summary) for f in found) == [
        ("FAIL", "rank 3 (GPU 3) own forward+backward time (first quartile) 520 ms, 30% over the node's median 400 ms"),
        ("WARN", "rank 6 (GPU 6) GEMM throughput 623.1 TFLOP/s, 15% under the node's median 733.0 TFLOP/s"),
    ]
    (straggler,) = train.judge_straggler(figs, ex)  # the fixed bound is kept beside the median
    assert straggler.status == FAIL and "rank 3 (GPU 3)" in straggler.summary
    compute = {m.labels["gpu"]: m for m in figs if m.name == "train_compute_duration"}
    assert len(compute) == 8 and compute["3"].value == 0.52


def test_a_warned_outlier_s_fix_line_names_its_first_cause_whole():
    # train's causes start "clocks held down (power brake, thermal or HW slowdown: `nvidia-smi -q -d PERFORMANCE,CLOCK`), ...":
    # cut at the first ", " the line read "check clocks held down (power brake".
    figs = train_figures.figures(train_facts({}, {6: 0.0015 / 0.85}), TrainExpect(sizes_source="t", straggler_source="t"))
    (warn,) = train.judge_outliers(figs, BAND)
    assert warn.status == WARN
    assert warn.remedy.endswith("if it stays behind its peers, check clocks held down (power brake, thermal or HW slowdown: "
                                "`nvidia-smi -q -d PERFORMANCE,CLOCK`)"), warn.remedy


def test_a_band_of_its_own_for_one_figure():
    wide = OutlierExpect(warn=0.10, fail=0.20, source="s", figures={"train_compute_duration": {"warn": 0.4, "fail": 0.6, "source": "noisy cores"}})
    figs = train_figures.figures(train_facts({3: 0.52}, {}), TrainExpect(sizes_source="t", straggler_source="t"))
    assert train.judge_outliers(figs, wide) == []


def test_slow_with_a_factor_stretches_each_repeat_to_that_many_times_its_length():
    assert _rank.slow_seconds(0.010, 2.0, 3.0, 0.1) == 0.010  # 10 ms -> 20 ms: half the rate, no floor
    assert abs(_rank.slow_seconds(0.010, 1.15, 3.0, 0.1) - 0.0015) < 1e-12
    assert _rank.slow_seconds(0.010, None, 3.0, 0.1) == 0.1  # plain slow: 3x its length, at least 0.1 s
    assert _rank.slow_seconds(0.5, None, 3.0, 0.1) == 1.5


def test_slow_in_seconds_sleeps_that_long_whatever_the_repeat_took():
    # A fault fixed in time: a loaded machine stretches the repeat, never the sleep after it.
    assert _rank.slow_seconds(0.010, None, 3.0, 0.1, pause=0.5) == 0.5
    assert _rank.slow_seconds(0.300, None, 3.0, 0.1, pause=0.5) == 0.5
