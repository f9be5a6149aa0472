"""The bandwidth check's arithmetic and judges, on recorded facts: rank reports
built by hand (the shape checks/workers/bandwidth.py writes: every timed
repeat, every latency sample), no processes."""

from __future__ import annotations

import pytest
from conftest import make_ctx, nccl_fixture_text
from preflight.checks import bandwidth
from preflight.checkkit import bandwidth_figures, bandwidth_plan
from preflight.checkkit.bandwidth_figures import BandwidthFacts, Figure, RankReport, StepResult

from preflight.gpuwork import ranks
from preflight.pipeline.check import Result
from preflight.base.findings import Status
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.expectations import NcclExpect
from preflight.pipeline.load_expectations import BandwidthExpect
from preflight.readers.nccl import nccl_log
from pathlib import Path

from preflight.base.host import Host
from preflight.pipeline import profiles
from preflight.pipeline.shape import NodeShape
from preflight.readers.nvidia.nvml import FakeNvml

FAIL, WARN = Status.FAIL, Status.WARN
BPS, SECONDS = "bytes_per_second", "seconds"
PY = "/opt/venv/bin/python"
GB, US = 1e9, 1e-6
GIB, MIB = 1 << 30, 1 << 20


def floor(value: float, unit: str = BPS, bound: str = "min", source: str = "test profile: datasheet") -> ResolvedFloor:
    return ResolvedFloor(value=value, unit=unit, source=source, bound=bound, origin="profile test")


def expect(**kw) -> BandwidthExpect:
    return BandwidthExpect(**{"sizes_source": "test profile: defaults", **kw})


def step(name: str, **kw) -> StepResult:
    return StepResult(step=name, **kw)


def report(rank: int, results: list[StepResult] = (), stage: str = "done", world: int = 2, backend: str = "nccl", **kw) -> RankReport:
    base = dict(rank=rank, local_rank=rank, world_size=world, host="node1", pid=1000 + rank, python=PY, backend=backend,
                device="cuda" if backend == "nccl" else "cpu", torch_version="2.5.1")
    if backend == "nccl":  # a healthy GPU rank is bound to its GPU's NUMA node
        base["binding"] = {"node": 0, "cpus": "0-15", "memory": "preferred node 0", "error": None}
    return RankReport(**{**base, "stage": stage, "results": list(results), **kw})


def outcome(rank: int, rep: RankReport | None, **kw) -> ranks.RankOutcome:
    kw.setdefault("gpu", f"GPU {rank}")
    kw.setdefault("last_line", f"rank {rank}: last line")
    return ranks.RankOutcome(rank=rank, report=rep, **kw)


def facts(outcomes: list[ranks.RankOutcome], **kw) -> BandwidthFacts:
    base = dict(python=PY, backend="nccl", nproc=len(outcomes), ended="exit 0", returncode=0, seconds=30.0)
    return BandwidthFacts(**{**base, "ranks": outcomes, **kw})


def per_rank(n: int, results, backend: str = "nccl", **kw) -> BandwidthFacts:
    """``n`` ranks, each reporting ``results(rank)``."""
    gpu = (lambda r: f"GPU {r}") if backend == "nccl" else (lambda r: None)
    return facts([outcome(r, report(r, results(r), world=n, backend=backend), gpu=gpu(r)) for r in range(n)], backend=backend, **kw)


def fig(name: str, value: float, where: str, unit: str = BPS, **kw) -> Figure:
    return Figure(name=name, unit=unit, value=value, where=where, **kw)


def by(figs: list[Figure], name: str, **labels: str) -> list[Figure]:
    return [g for g in figs if g.name == name and all(g.labels.get(k) == v for k, v in labels.items())]


def h2d_on_8(values: dict[int, float], default: float = 55 * GB) -> list[Figure]:
    return [fig("h2d_bandwidth", values.get(i, default), f"GPU {i}", labels={"gpu": str(i)}, rank=i) for i in range(8)]


# --- arithmetic ---------------------------------------------------------------------


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75),
    ("all_gather", 2, 0.5), ("all_gather", 8, 0.875),
    ("reduce_scatter", 2, 0.5), ("reduce_scatter", 8, 0.875),
])
def test_bus_factor_follows_nccl_tests(collective, n, factor):
    assert bandwidth_figures.bus_factor(collective, n) == pytest.approx(factor)


def test_bus_factor_of_an_unknown_collective_raises():
    with pytest.raises(ValueError, match="broadcast"):
        bandwidth_figures.bus_factor("broadcast", 8)


def test_median_of_odd_and_even_lists():
    assert bandwidth_figures.median([3.0, 1.0, 2.0]) == 2.0
    assert bandwidth_figures.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bandwidth_figures.median([7.0]) == 7.0


def test_quantile_is_nearest_rank_a_real_sample():
    assert bandwidth_figures.quantile([float(x) for x in range(200, 0, -1)], 0.99) == 198.0
    assert bandwidth_figures.quantile([float(x) for x in range(1, 101)], 0.5) == 50.0
    assert bandwidth_figures.quantile([float(x) for x in range(1, 101)], 0.99) == 99.0
    assert bandwidth_figures.quantile([5.0], 0.99) == 5.0


def test_spread_is_range_over_median():
    assert bandwidth_figures.spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert bandwidth_figures.spread([2.0, 2.0]) == 0.0
    assert bandwidth_figures.spread([]) is None
    assert bandwidth_figures.spread([0.0, 0.0, 0.0]) is None


def test_algbw_is_bytes_over_seconds():
    assert bandwidth_figures.algbw(GIB, 0.5) == 2 * GIB


# --- figures: per device ----------------------------------------------------------------


def test_a_device_figure_is_moved_bytes_over_the_median_repeat():
    f = per_rank(1, lambda r: [step("hbm_copy", bytes=GIB, moved_bytes=2 * GIB, seconds=[0.002, 0.001, 0.004])])
    (g,) = bandwidth_figures.figures(f)
    assert g.name == "hbm_copy_bandwidth" and g.unit == BPS
    assert g.value == pytest.approx(2 * GIB / 0.002)
    assert (g.where, g.bytes, g.repeats, g.rank) == ("GPU 0", GIB, 3, 0)
    assert g.spread == pytest.approx((0.004 - 0.001) / 0.002)


def test_gpu_figures_carry_dcgm_labels_with_the_uuid_by_nvidia_smi_index():
    # CUDA_VISIBLE_DEVICES=3: local rank 0 drives nvidia-smi's GPU 3.
    rep = report(0, [step("h2d", bytes=512 * MIB, moved_bytes=512 * MIB, seconds=[0.02, 0.01, 0.03])], world=1)
    f = facts([outcome(0, rep, gpu="GPU 3")], uuids={3: "GPU-3f2a", 0: "GPU-0000"})
    (g,) = bandwidth_figures.figures(f)
    assert g.labels == {"gpu": "3", "UUID": "GPU-3f2a"}
    assert g.where == "GPU 3"
    assert g.value == pytest.approx(512 * MIB / 0.02)


def test_a_gpu_without_a_known_uuid_has_only_its_index():
    f = per_rank(1, lambda r: [step("d2h", bytes=MIB, moved_bytes=MIB, seconds=[0.001])])
    assert bandwidth_figures.figures(f)[0].labels == {"gpu": "0"}


def test_gloo_figures_are_labelled_by_rank():
    f = per_rank(2, lambda r: [step("memcpy", bytes=64 * MIB, moved_bytes=128 * MIB, seconds=[0.01, 0.02, 0.01])], backend="gloo")
    figs = bandwidth_figures.figures(f)
    assert [(g.name, g.where, g.labels) for g in figs] == [("memcpy_bandwidth", "rank 0", {"rank": "0"}), ("memcpy_bandwidth", "rank 1", {"rank": "1"})]
    assert figs[1].value == pytest.approx(128 * MIB / 0.01)


def test_p2p_figure_names_both_gpus():
    f = per_rank(2, lambda r: [step("p2p", bytes=256 * MIB, moved_bytes=256 * MIB, seconds=[0.001, 0.001, 0.001], peer=1 - r, peer_access=True)],
                 uuids={0: "GPU-a", 1: "GPU-b"})
    figs = bandwidth_figures.figures(f)
    assert [g.where for g in figs] == ["GPU 0 -> GPU 1", "GPU 1 -> GPU 0"]
    assert figs[0].labels == {"gpu": "0", "UUID": "GPU-a", "peer_gpu": "1"}
    assert figs[0].name == "p2p_bandwidth"


def test_a_step_without_repeats_gives_no_figure():
    f = per_rank(1, lambda r: [step("hbm_copy", bytes=GIB, moved_bytes=2 * GIB, seconds=[]), step("h2d", bytes=GIB, moved_bytes=None, seconds=[0.1])])
    assert bandwidth_figures.figures(f) == []


def test_ranks_without_a_report_give_no_figure():
    f = facts([outcome(0, None), outcome(1, None)])
    assert bandwidth_figures.figures(f) == []


# --- figures: collectives, latency ---------------------------------------------------------

# Eight ranks' all_reduce repeats: most take 10 ms; rank 3 is slow in repeat 0, rank 7 in others.
ALL_REDUCE = {r: [0.010] * 5 for r in range(8)}
ALL_REDUCE[3] = [0.015, 0.010, 0.010, 0.010, 0.010]
ALL_REDUCE[7] = [0.012, 0.011, 0.013, 0.010, 0.020]


def test_a_collective_repeat_lasts_as_long_as_its_slowest_rank():
    f = per_rank(8, lambda r: [step("all_reduce", bytes=GIB, moved_bytes=GIB, seconds=ALL_REDUCE[r])])
    (g,) = bandwidth_figures.figures(f)
    # per repeat max: 15, 11, 13, 10, 20 ms -> median 13 ms (the median of each rank's median would say 12 ms)
    assert g.name == "allreduce_bus_bandwidth" and g.where == "8 ranks"
    assert g.value == pytest.approx(GIB / 0.013 * 2 * 7 / 8)
    assert g.labels == {"collective": "all_reduce"}
    assert (g.bytes, g.repeats) == (GIB, 5)
    assert g.spread == pytest.approx((0.020 - 0.010) / 0.013)


def test_all_gather_and_reduce_scatter_use_their_own_factor():
    f = per_rank(2, lambda r: [step("all_gather", bytes=GIB, seconds=[0.1, 0.1, 0.1]), step("reduce_scatter", bytes=GIB, seconds=[0.2, 0.2, 0.2])])
    figs = {g.name: g for g in bandwidth_figures.figures(f)}
    assert figs["allgather_bus_bandwidth"].value == pytest.approx(GIB / 0.1 * 0.5)
    assert figs["reducescatter_bus_bandwidth"].value == pytest.approx(GIB / 0.2 * 0.5)


def test_a_collective_missing_on_a_rank_that_died_gives_no_figure():
    f = per_rank(2, lambda r: [step("all_reduce", bytes=GIB, seconds=[0.01, 0.01, 0.01])] if r == 0 else [])
    assert by(bandwidth_figures.figures(f), "allreduce_bus_bandwidth") == []


def test_one_rank_gives_no_collective_figure():
    f = per_rank(1, lambda r: [step("all_reduce", bytes=GIB, seconds=[0.01, 0.01, 0.01])])
    assert bandwidth_figures.figures(f) == []


def test_latency_quantiles_are_per_rank_and_the_figure_names_the_slowest_rank():
    # rank 0: fast median, a tail of 5 slow samples in 200; rank 1: steady at 20 us
    samples = {0: [10 * US] * 195 + [1000 * US] * 5, 1: [20 * US] * 200}
    f = per_rank(2, lambda r: [step("latency", bytes=4096, samples=samples[r])])
    p50, p99 = bandwidth_figures.figures(f)
    assert (p50.name, p50.key, p50.labels, p50.unit) == ("allreduce_latency", "allreduce_latency", {"stat": "p50"}, SECONDS)
    assert p50.value == pytest.approx(20 * US) and p50.rank == 1 and p50.where == "slowest of 2 ranks: GPU 1"
    assert (p99.name, p99.key, p99.labels) == ("allreduce_latency", "allreduce_latency_p99", {"stat": "p99"})
    assert p99.value == pytest.approx(1000 * US) and p99.rank == 0 and p99.where == "slowest of 2 ranks: GPU 0"
    assert (p99.bytes, p99.repeats) == (4096, 200)


def test_graph_latency_divides_the_slowest_repeat_by_the_ops_it_holds():
    seconds = {0: [0.0002, 0.0004, 0.0002], 1: [0.0006, 0.0002, 0.0002]}
    f = per_rank(2, lambda r: [step("graph_latency", bytes=4096, ops_per_repeat=20, seconds=seconds[r])])
    (g,) = bandwidth_figures.figures(f)
    assert g.name == "allreduce_graph_latency" and g.unit == SECONDS and g.where == "2 ranks"
    assert g.value == pytest.approx(0.0004 / 20)  # repeats' max: 0.6, 0.4, 0.2 ms -> median 0.4 ms


def test_graph_latency_that_could_not_be_captured_gives_no_figure():
    f = per_rank(2, lambda r: [step("graph_latency", bytes=4096, error="RuntimeError: capture failed")])
    assert bandwidth_figures.figures(f) == []


# --- judge_floors ---------------------------------------------------------------------------


def test_below_floor_fails_naming_the_worst_gpu_and_both_figures():
    (x,) = bandwidth.judge_floors(h2d_on_8({3: 31.2 * GB, 5: 40 * GB}), {"h2d_bandwidth": floor(48 * GB)}, 0.05)
    assert x.status is FAIL
    assert x.summary == "host->device copy below floor on GPU 3 (31.2 GB/s, floor 48.0 GB/s)"
    assert "under the 48.0 GB/s floor (test profile: datasheet; profile test) on 2 of 8: GPU 3: 31.2 GB/s; GPU 5: 40.0 GB/s" in x.cause
    assert "PCIe link" in x.remedy and "preflight run --only bandwidth" in x.remedy


def test_more_than_eight_failing_pairs_are_counted():
    figs = [fig("p2p_bandwidth", (10 + i) * GB, f"GPU {i // 7} -> pair {i}") for i in range(56)]
    (x,) = bandwidth.judge_floors(figs, {"p2p_bandwidth": floor(100 * GB)}, 0.05)
    assert x.summary.startswith("GPU->GPU copy below floor on GPU 0 -> pair 0 (10.0 GB/s")
    assert "on 56 of 56" in x.cause and "; and 48 more" in x.cause
    assert "pair 7:" in x.cause and "pair 8:" not in x.cause


def test_within_the_margin_above_the_floor_warns_marginal():
    (x,) = bandwidth.judge_floors(h2d_on_8({6: 49 * GB}), {"h2d_bandwidth": floor(48 * GB)}, 0.05)
    assert x.status is WARN
    assert x.summary == "host->device copy marginal on GPU 6 (49.0 GB/s, floor 48.0 GB/s)"
    assert "within 5% of its 48.0 GB/s floor on 1 of 8: GPU 6: 49.0 GB/s" in x.cause
    assert "a PCIe link trained below its width" in x.remedy


def test_exactly_at_the_floor_is_marginal_not_a_failure():
    (x,) = bandwidth.judge_floors(h2d_on_8({0: 48 * GB}), {"h2d_bandwidth": floor(48 * GB)}, 0.05)
    assert x.status is WARN


def test_exactly_at_the_margin_passes():
    assert bandwidth.judge_floors(h2d_on_8({0: 48 * GB * 1.05}), {"h2d_bandwidth": floor(48 * GB)}, 0.05) == []


def test_a_failure_and_a_marginal_gpu_give_two_findings():
    found = bandwidth.judge_floors(h2d_on_8({1: 30 * GB, 2: 49 * GB}), {"h2d_bandwidth": floor(48 * GB)}, 0.05)
    assert [x.status for x in found] == [FAIL, WARN]
    assert "GPU 1" in found[0].summary and "GPU 2" in found[1].summary


def test_a_margin_of_zero_never_warns():
    assert bandwidth.judge_floors(h2d_on_8({0: 48 * GB}), {"h2d_bandwidth": floor(48 * GB)}, 0.0) == []


def test_latency_over_its_ceiling_fails():
    g = fig("allreduce_latency", 60 * US, "slowest of 8 ranks: GPU 2", unit=SECONDS, floor="allreduce_latency", labels={"stat": "p50"})
    (x,) = bandwidth.judge_floors([g], {"allreduce_latency": floor(50 * US, SECONDS, "max")}, 0.05)
    assert x.status is FAIL
    assert x.summary == "small all_reduce latency p50 over ceiling on slowest of 8 ranks: GPU 2 (60.0 us, ceiling 50.0 us)"
    assert "over the 50.0 us ceiling" in x.cause and "starved of CPU" in x.remedy


@pytest.mark.parametrize(("value", "status"), [(48 * US, WARN), (47 * US, None), (50 * US, WARN)])
def test_latency_within_the_margin_below_its_ceiling_warns(value, status):
    g = fig("allreduce_latency", value, "slowest of 8 ranks: GPU 2", unit=SECONDS, floor="allreduce_latency")
    found = bandwidth.judge_floors([g], {"allreduce_latency": floor(50 * US, SECONDS, "max")}, 0.05)
    assert [x.status for x in found] == ([status] if status else [])
    if status:
        assert "marginal" in found[0].summary and "ceiling 50.0 us" in found[0].summary


def test_p99_latency_is_judged_against_its_own_ceiling():
    samples = [10 * US] * 195 + [400 * US] * 5  # p50 10 us, p99 400 us
    figs = bandwidth_figures.figures(per_rank(2, lambda r: [step("latency", bytes=4096, samples=samples)]))
    assert bandwidth.judge_floors(figs, {"allreduce_latency": floor(50 * US, SECONDS, "max")}, 0.05) == []
    (x,) = bandwidth.judge_floors(figs, {"allreduce_latency": floor(50 * US, SECONDS, "max"), "allreduce_latency_p99": floor(300 * US, SECONDS, "max")}, 0.05)
    assert x.status is FAIL and x.summary.startswith("small all_reduce latency p99 over ceiling on slowest of 2 ranks")
    assert "(400.0 us, ceiling 300.0 us)" in x.summary


def test_figures_without_a_floor_are_not_judged():
    figs = h2d_on_8({3: 1 * GB}) + [fig("allreduce_graph_latency", 1.0, "8 ranks", unit=SECONDS)]
    assert bandwidth.judge_floors(figs, {"hbm_copy_bandwidth": floor(2000 * GB)}, 0.05) == []


# --- judge_peer_access ----------------------------------------------------------------------


def p2p_facts(access: dict[tuple[int, int], bool | None], n: int = 4) -> BandwidthFacts:
    def results(r: int) -> list[StepResult]:
        return [step("p2p", bytes=MIB, moved_bytes=MIB, seconds=[0.001], peer=b, peer_access=access.get((r, b), True)) for b in range(n) if b != r]
    return per_rank(n, results)


def test_no_peer_access_where_the_node_s_nvswitch_joins_every_gpu_fails_naming_the_pair():
    (x,) = bandwidth.judge_peer_access(p2p_facts({(2, 3): False}), set(), all_nvlink=True)
    assert x.status is FAIL and x.summary == "no peer access between NVLink GPUs (GPU 2 -> GPU 3)"
    assert "1 ordered pair(s) the node's NVSwitch fabric says NVLink joins: GPU 2 -> GPU 3" in x.cause
    assert "nvidia-fabricmanager" in x.remedy


def test_no_peer_access_on_a_pair_the_topology_links_by_nvlink_fails():
    (x,) = bandwidth.judge_peer_access(p2p_facts({(0, 1): False, (1, 0): False}), {frozenset({0, 1})}, all_nvlink=False)
    assert x.status is FAIL and "the topology says" in x.cause and "GPU 0 -> GPU 1, GPU 1 -> GPU 0" in x.cause


def test_no_peer_access_on_a_pcie_pair_is_nothing():
    assert bandwidth.judge_peer_access(p2p_facts({(0, 2): False}), {frozenset({0, 1})}, all_nvlink=False) == []


def test_no_peer_access_in_local_rank_0_s_report_of_every_pair_names_the_pair():
    # checks/workers/bandwidth.py: local rank 0 measures every ordered pair, each result naming its source.
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    results = [step("p2p", bytes=MIB, moved_bytes=MIB, seconds=[0.001], src=a, peer=b, peer_access=(a, b) != (2, 3)) for a, b in pairs]
    f = per_rank(4, lambda r: results if r == 0 else [])
    (x,) = bandwidth.judge_peer_access(f, set(), all_nvlink=True)
    assert x.summary == "no peer access between NVLink GPUs (GPU 2 -> GPU 3)" and "1 ordered pair(s)" in x.cause


def test_unknown_peer_access_is_nothing():
    assert bandwidth.judge_peer_access(p2p_facts({(0, 1): None}), set(), all_nvlink=True) == []


# --- judge_setup ---------------------------------------------------------------------------


def test_a_clamped_step_warns_with_what_was_clamped():
    clamp = "h2d: 16 GiB asked, 3 GiB used: 5 GiB free on cuda:1"
    f = per_rank(2, lambda r: [step("h2d", bytes=3 * GIB, moved_bytes=3 * GIB, seconds=[0.1], clamped=clamp if r == 1 else None)])
    (x,) = bandwidth.judge_setup(f)
    assert x.status is WARN and x.summary == "buffer sizes clamped to free memory"
    assert clamp in x.cause and "nvidia-smi" in x.remedy


def test_a_clamp_warns_only_where_a_floor_judges_the_figure():
    # A card of a few GiB under generic, which holds no floor of its model: the smaller copy is only reported.
    clamp = "hbm_copy: 1 GiB asked, 512 MiB used: 2 GiB free on cuda:0"
    f = per_rank(1, lambda r: [step("hbm_copy", bytes=GIB // 2, moved_bytes=GIB, seconds=[0.1], clamped=clamp)])
    assert bandwidth.judge_setup(f, {}) == []
    assert [x.summary for x in bandwidth.judge_setup(f, {"hbm_copy_bandwidth": floor(1e12)})] == ["buffer sizes clamped to free memory"]


def test_with_no_floor_the_summary_says_the_figures_are_held_to_the_node_s_own():
    figs = h2d_on_8({})
    assert "every figure within its floor" in bandwidth.summary(per_rank(1, lambda r: []), figs, {"h2d_bandwidth": floor(48 * GB)})
    assert ", no floor for these figures (reported, and held to the node's own): host->device copy 55.0 GB/s" in bandwidth.summary(per_rank(1, lambda r: []), figs, {})


def test_a_gpu_rank_without_numa_advice_warns_that_host_copies_may_read_low():
    f = per_rank(2, lambda r: [step("h2d", bytes=GIB, moved_bytes=GIB, seconds=[0.01])])
    f.ranks[1].report.binding = None
    (x,) = bandwidth.judge_setup(f)
    assert x.status is WARN and x.summary == "ranks not bound to their GPU's NUMA node"
    assert "rank 1 (GPU 1): no NUMA advice from the topology check" in x.cause and "rank 0" not in x.cause


def test_on_a_machine_of_one_numa_node_a_rank_without_advice_is_no_finding():
    # The real H200 VM: 16 CPUs on NUMA node 0, nothing a rank could be bound away from.
    f = per_rank(1, lambda r: [step("h2d", bytes=GIB, moved_bytes=GIB, seconds=[0.01])], numa_nodes=1)
    f.ranks[0].report.binding = None
    assert bandwidth.judge_setup(f) == []
    f.numa_nodes = 2
    assert [x.summary for x in bandwidth.judge_setup(f)] == ["ranks not bound to their GPU's NUMA node"]


def test_cpu_ranks_need_no_numa_binding():
    f = per_rank(2, lambda r: [step("memcpy", bytes=GIB, moved_bytes=2 * GIB, seconds=[0.2])], backend="gloo")
    assert bandwidth.judge_setup(f) == []


def test_the_same_clamp_on_every_rank_is_said_once():
    clamp = "all_reduce: 16 GiB asked, 8 GiB used: 20 GiB free on cuda:0"
    f = per_rank(4, lambda r: [step("all_reduce", bytes=8 * GIB, seconds=[0.1], clamped=clamp)])
    (x,) = bandwidth.judge_setup(f)
    assert x.cause.count(clamp) == 1


def test_a_rank_that_could_not_be_bound_warns_naming_it():
    bad = {"node": 1, "cpus": "56-111", "memory": None, "error": "sched_setaffinity(56-111): Invalid argument"}
    good = {"node": 0, "cpus": "0-55", "memory": "preferred node 0", "error": None}
    f = facts([outcome(0, report(0, binding=good)), outcome(1, report(1, binding=bad))])
    (x,) = bandwidth.judge_setup(f)
    assert x.status is WARN and x.summary == "ranks not bound to their GPU's NUMA node"
    assert "rank 1: sched_setaffinity(56-111): Invalid argument" in x.cause and "rank 0" not in x.cause


def test_an_unclamped_bound_run_has_no_setup_finding():
    f = facts([outcome(r, report(r, binding={"node": 0, "cpus": "0-55", "error": None})) for r in range(2)])
    assert bandwidth.judge_setup(f) == []


# --- judge: the run part ----------------------------------------------------------------------


def test_a_rank_killed_mid_measurement_fails_the_run_naming_it():
    dead = outcome(1, report(1, [step("hbm_copy", bytes=GIB, moved_bytes=2 * GIB, seconds=[0.001])], stage="all_reduce", step=4), exit="killed by SIGKILL")
    waiting = outcome(0, report(0, stage="all_reduce", step=4, error="RuntimeError: NCCL watchdog timeout", error_time=50.0), exit="exit 1")
    f = facts([waiting, dead], ended="exit 1", returncode=1, root_cause=1)
    parts = bandwidth.judge(f, bandwidth_figures.figures(f), {}, expect(), set(), False)
    (x,) = parts["run"]
    assert x.status is FAIL and x.summary == "rank 1 (GPU 1) died in all_reduce (step 5) (killed by SIGKILL)"
    assert "rank 0 (GPU 0) then failed in all_reduce (step 5): RuntimeError: NCCL watchdog timeout" in x.cause
    assert "--nproc-per-node 2" in x.remedy and x.remedy.endswith("bandwidth.py")


def test_a_launch_error_says_the_worker_could_not_start():
    f = facts([], nproc=2, ended=None, returncode=None, launch_error=("/opt/venv/bin/python could not be started: No such file or directory", ranks.TORCH))
    (x,) = bandwidth.judge(f, [], {}, expect(), set(), False)["run"]
    assert x.status is FAIL and x.summary == "the bandwidth worker could not start"
    assert "No such file" in x.cause


def test_a_healthy_run_has_no_finding_in_any_part():
    f = per_rank(2, lambda r: [step("h2d", bytes=GIB, moved_bytes=GIB, seconds=[0.01])])
    parts = bandwidth.judge(f, bandwidth_figures.figures(f), {"h2d_bandwidth": floor(48 * GB)}, expect(), set(), False)
    assert parts == {"run": [], "floors": [], "peer_access": [], "setup": []}


def test_by_hand_on_gloo_names_the_cpu_flags():
    f = per_rank(2, lambda r: [], backend="gloo")
    assert bandwidth.by_hand(f).endswith("bandwidth.py --backend gloo --device cpu")
    assert "--nproc-per-node 2" in bandwidth.by_hand(f)


# --- measurements --------------------------------------------------------------------------------


def full_run() -> BandwidthFacts:
    def results(r: int) -> list[StepResult]:
        return [step("h2d", bytes=GIB, moved_bytes=GIB, seconds=[0.02, 0.02, 0.02]),
                step("all_reduce", bytes=GIB, moved_bytes=GIB, seconds=[0.01, 0.01, 0.01]),
                step("latency", bytes=4096, samples=[10 * US] * 100),
                step("graph_latency", bytes=4096, ops_per_repeat=20, seconds=[0.0002] * 3)]
    return per_rank(2, results, uuids={0: "GPU-a", 1: "GPU-b"})


FLOORS = {"h2d_bandwidth": floor(48 * GB), "allreduce_bus_bandwidth": floor(40 * GB),
          "allreduce_latency": floor(50 * US, SECONDS, "max"), "allreduce_latency_p99": floor(200 * US, SECONDS, "max")}


def test_measurements_carry_the_floor_or_the_ceiling():
    ms = bandwidth.measurements(bandwidth_figures.figures(full_run()), FLOORS)
    h2d = [m for m in ms if m.name == "h2d_bandwidth"]
    assert [(m.labels, m.floor, m.ceiling, m.unit) for m in h2d] == [({"gpu": "0", "UUID": "GPU-a"}, 48 * GB, None, BPS), ({"gpu": "1", "UUID": "GPU-b"}, 48 * GB, None, BPS)]
    (ar,) = [m for m in ms if m.name == "allreduce_bus_bandwidth"]
    assert ar.floor == 40 * GB and ar.labels == {"collective": "all_reduce"}
    lat = {m.labels["stat"]: m for m in ms if m.name == "allreduce_latency"}
    assert (lat["p50"].ceiling, lat["p50"].floor, lat["p50"].unit) == (50 * US, None, SECONDS)
    assert lat["p99"].ceiling == 200 * US


def test_measurement_names_are_the_metric_names():
    ms = bandwidth.measurements(bandwidth_figures.figures(full_run()), FLOORS)
    assert sorted({m.name for m in ms}) == ["allreduce_bus_bandwidth", "allreduce_graph_latency", "allreduce_latency", "h2d_bandwidth"]
    (graph,) = [m for m in ms if m.name == "allreduce_graph_latency"]
    assert graph.floor is None and graph.ceiling is None


# --- lines and summary ------------------------------------------------------------------------------


def test_lines_show_the_weakest_of_many_with_the_floor_and_spread():
    figs = h2d_on_8({3: 31.2 * GB})
    figs[0].spread = 0.042
    (line,) = bandwidth.lines(figs, {"h2d_bandwidth": floor(48 * GB)})
    assert line.startswith("host->device copy")
    assert "31.2 GB/s (min of 8: GPU 3; median 55.0 GB/s)" in line
    assert "floor 48.0 GB/s" in line and line.endswith("spread 4.2%")


def test_lines_show_the_size_of_a_single_figure_and_no_floor():
    (line,) = bandwidth.lines([fig("allreduce_bus_bandwidth", 350 * GB, "8 ranks", bytes=GIB)], {})
    assert "350.0 GB/s (1 GiB)" in line and line.endswith("no floor")


def test_lines_judge_latency_by_its_worst_and_show_the_ceiling():
    figs = bandwidth_figures.figures(full_run())
    lines = bandwidth.lines(figs, FLOORS)
    assert len(lines) == 5  # h2d, all_reduce, p50, p99, graph
    p50 = next(x for x in lines if x.startswith("small all_reduce latency p50"))
    assert "10.0 us" in p50 and "ceiling 50.0 us" in p50
    graph = next(x for x in lines if x.startswith("small all_reduce latency in a CUDA graph"))
    assert "10.0 us" in graph and "no floor" in graph


def test_lines_of_many_latency_figures_say_worst_of():
    figs = [fig("allreduce_graph_latency", v * US, f"run {i}", unit=SECONDS) for i, v in enumerate((5, 9, 7))]
    (line,) = bandwidth.lines(figs, {})
    assert "9.0 us (worst of 3: run 1; median 7.0 us)" in line


def test_summary_names_the_weakest_of_each_figure():
    figs = h2d_on_8({3: 31.2 * GB}) + [fig("allreduce_bus_bandwidth", 350 * GB, "8 ranks")]
    f = per_rank(8, lambda r: [])
    assert bandwidth.summary(f, figs) == "8 nccl rank(s), every figure within its floor: host->device copy 31.2 GB/s, all_reduce busbw 350.0 GB/s"


def test_summary_latency_p50_is_the_p50_not_the_p99():
    samples = [10 * US] * 195 + [400 * US] * 5
    f = per_rank(2, lambda r: [step("latency", bytes=4096, samples=samples)])
    text = bandwidth.summary(f, bandwidth_figures.figures(f))
    assert text.endswith("small all_reduce latency p50 10.0 us")


def test_summary_without_figures_says_so():
    assert bandwidth.summary(per_rank(2, lambda r: [], backend="gloo"), []) == "2 gloo rank(s): no figure measured"


# --- steps_for ------------------------------------------------------------------------------------------


def test_eight_gpus_run_every_step():
    assert bandwidth_plan.steps_for(True, 8, expect()) == ["hbm_copy", "h2d", "d2h", "p2p", "all_reduce", "all_gather", "reduce_scatter", "latency", "graph_latency"]


def test_graph_latency_only_where_the_profile_asks():
    assert "graph_latency" not in bandwidth_plan.steps_for(True, 8, expect(graph=False))


def test_one_gpu_has_no_collective_or_p2p():
    assert bandwidth_plan.steps_for(True, 1, expect()) == ["hbm_copy", "h2d", "d2h"]


def test_cpu_runs_memcpy_and_the_collectives():
    assert bandwidth_plan.steps_for(False, 4, expect()) == ["memcpy", "all_reduce", "all_gather", "reduce_scatter", "latency"]
    assert bandwidth_plan.steps_for(False, 1, expect()) == ["memcpy"]


# --- binding and uuids from earlier checks ---------------------------------------------------------------


def test_binding_reads_the_topology_advice():
    ctx = make_ctx()
    advice = {"ranks": [{"local_rank": 0, "gpu": 0, "numa_node": 0, "cpus": "0-55"},
                        {"local_rank": 1, "gpu": 1, "numa_node": 1, "cpus": "56-111"},
                        {"local_rank": 2, "gpu": 2, "numa_node": None, "cpus": None}]}
    ctx.results["topology"] = Result(check="topology", status=Status.PASS, summary="ok", details={"advice": advice})
    assert bandwidth.binding(ctx) == {"0": {"node": 0, "cpus": "0-55"}, "1": {"node": 1, "cpus": "56-111"}}


def test_binding_without_topology_or_advice_is_empty():
    ctx = make_ctx()
    assert bandwidth.binding(ctx) == {}
    ctx.results["topology"] = Result(check="topology", status=Status.PASS, summary="ok", details={"advice": None})
    assert bandwidth.binding(ctx) == {}


def test_where_the_matrix_is_unreadable_the_binding_comes_from_sysfs_and_nvml(tmp_path):
    import shutil

    from preflight.base.host import Host
    from preflight.checks import topology
    from preflight.pipeline import profiles
    from topology_cases import FIXTURES, TREE, h200_vm, unreadable_smi

    def profile(name: str) -> profiles.ResolvedProfile:
        path = profiles.BUILTIN_DIR / f"{name}.toml"
        return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")

    garbage = {"PATH": str(unreadable_smi(tmp_path))}
    # The DGX H100 of tests/fixtures/topo/03, two NUMA nodes: each rank goes to its GPU's node.
    shutil.copytree(TREE, tmp_path / "hgx", symlinks=True)
    ctx = make_ctx(host=Host(tmp_path / "hgx", environ=garbage))
    ctx.profile = profile("h100-sxm")
    ctx.settings = ctx.settings.model_copy(update={"nvml_fake": FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"})
    ctx.results["topology"] = topology.Topology().run(ctx)
    assert ctx.results["topology"].details["unread"]
    assert bandwidth.binding(ctx) == {str(r): {"node": r // 4, "cpus": "0-55,112-167" if r < 4 else "56-111,168-223"} for r in range(8)}
    assert bandwidth.numa_nodes(ctx.results["topology"], ctx.host) == 2
    # The real H200 VM, one NUMA node: its rank's node and CPUs all the same, and nothing to warn of.
    ctx = make_ctx(host=Host(h200_vm(tmp_path), environ=garbage))
    ctx.profile = profile("h200-sxm")
    ctx.settings = ctx.settings.model_copy(update={"nvml_fake": FIXTURES / "nvml" / "h200-1x-vm.json"})
    ctx.results["topology"] = topology.Topology().run(ctx)
    assert bandwidth.binding(ctx) == {"0": {"node": 0, "cpus": "0-15"}}
    assert bandwidth.numa_nodes(None, ctx.host) == bandwidth.numa_nodes(ctx.results["topology"], ctx.host) == 1


def test_uuids_read_the_cuda_inventory_by_index():
    ctx = make_ctx()
    gpus = [{"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H100"}, {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H100"}]
    ctx.results["cuda"] = Result(check="cuda", status=Status.PASS, summary="ok", details={"inventory": {"gpus": gpus}})
    assert bandwidth.uuids(ctx) == {0: "GPU-aaaa", 1: "GPU-bbbb"}


def test_uuids_without_the_cuda_check_are_empty():
    ctx = make_ctx()
    assert bandwidth.uuids(ctx) == {}
    ctx.results["cuda"] = Result(check="cuda", status=Status.FAIL, summary="no driver", details={})
    assert bandwidth.uuids(ctx) == {}


# --- how sure each figure is ------------------------------------------------------------------------------

# Ten h2d repeats each: a quiet GPU (the 95% interval x(2)..x(9) within 1% of the median),
# and a noisy one that stopped at its cap of 30 repeats with the interval +-20% wide.
QUIET = [0.0100, 0.0101, 0.0099, 0.0100, 0.0100, 0.0101, 0.0100, 0.0099, 0.0100, 0.0100]
NOISY = [0.010, 0.012, 0.008, 0.011, 0.009, 0.010, 0.012, 0.008, 0.010, 0.011] * 3


def host_copies(per_gpu: dict[int, tuple[list[float], str]], tolerance: float | None = 0.02) -> BandwidthFacts:
    def results(r: int):
        seconds, stopped = per_gpu[r]
        return [step("h2d", bytes=512 * MIB, moved_bytes=512 * MIB, seconds=seconds, stopped=stopped, tolerance=tolerance)]

    return per_rank(len(per_gpu), results)


def test_a_figure_says_how_sure_it_is_and_that_it_converged():
    (g,) = bandwidth_figures.figures(host_copies({0: (QUIET, "converged")}))
    assert g.repeats == 10 and g.ci == pytest.approx(0.0100 / 0.0099 - 1) and g.converged is True and g.stopped == "converged"
    (m,) = bandwidth.measurements([g], {})
    assert (m.repeats, m.ci, m.converged) == (10, g.ci, True)


def test_a_figure_stopped_at_a_cap_wider_than_the_tolerance_did_not_converge():
    quiet, noisy = bandwidth_figures.figures(host_copies({0: (QUIET, "converged"), 1: (NOISY, "max_repeats")}))
    assert quiet.converged is True
    assert noisy.converged is False and noisy.repeats == 30 and noisy.ci == pytest.approx(0.011 / 0.010 - 1)


def test_a_report_from_a_worker_without_a_tolerance_is_not_judged_for_it():
    (g,) = bandwidth_figures.figures(host_copies({0: (NOISY, None)}, tolerance=None))
    assert g.converged is None and g.ci is not None
    assert "not converged" not in bandwidth.lines([g], {})[0]


def test_a_collective_is_as_sure_as_the_series_of_its_slowest_ranks():
    # Each rank alone is quiet, but which rank is slow changes: the per-repeat maximum is not.
    seconds = {0: [0.010, 0.013] * 5, 1: [0.013, 0.010] * 5}
    f = per_rank(2, lambda r: [step("all_reduce", bytes=GIB, moved_bytes=GIB, seconds=seconds[r], stopped="converged", tolerance=0.02)])
    (g,) = bandwidth_figures.figures(f)
    assert g.ci == 0.0 and g.converged is True


def test_latency_p50_is_judged_for_sureness_and_its_p99_is_not():
    samples = [10 * US] * 195 + [1000 * US] * 5
    f = per_rank(2, lambda r: [step("latency", bytes=4096, samples=samples, stopped="converged", tolerance=0.02)])
    p50, p99 = bandwidth_figures.figures(f)
    assert p50.converged is True and p50.repeats == 200
    assert p99.converged is None and p99.ci is None


def test_a_passing_figure_that_did_not_converge_still_passes_and_says_so():
    f = host_copies({0: (QUIET, "converged"), 1: (NOISY, "max_seconds")})
    figs = bandwidth_figures.figures(f)
    parts = bandwidth.judge(f, figs, {"h2d_bandwidth": floor(20 * GB)}, expect(), set(), False)
    assert parts["floors"] == []
    text = bandwidth.summary(f, figs)
    assert text.startswith("2 nccl rank(s), every figure within its floor: host->device copy ")
    assert text.endswith("; not converged within +-2% at the cap: host->device copy on 1 of 2 (+-10%)")
    (line,) = bandwidth.lines(figs, {"h2d_bandwidth": floor(20 * GB)})
    assert "+-10.0% (95%) 10-30 repeats  not converged within +-2% on 1 of 2 (GPU 1), at its cap of seconds  floor 20.0 GB/s" in line


def test_a_figure_below_its_floor_that_did_not_converge_fails_saying_so():
    # GPU 1 reads about 53.7 GB/s, under a 60 GB/s floor, but its median is known only to +-10%.
    f = host_copies({0: ([s / 2 for s in QUIET], "converged"), 1: (NOISY, "max_repeats")})
    (x,) = bandwidth.judge_floors(bandwidth_figures.figures(f), {"h2d_bandwidth": floor(60 * GB)}, 0.05)
    assert x.status is FAIL and x.summary.startswith("host->device copy below floor on GPU 1 (")
    assert "on 1 of 2: GPU 1: 53.7 GB/s (not converged within +-2%: known to +-10.0% after 30 repeats, at its cap of repeats)" in x.cause


def test_a_converged_figure_below_its_floor_fails_without_a_word_on_sureness():
    f = host_copies({0: (QUIET, "converged")})
    (x,) = bandwidth.judge_floors(bandwidth_figures.figures(f), {"h2d_bandwidth": floor(60 * GB)}, 0.05)
    assert x.status is FAIL and "converged" not in x.cause


def test_confirming_a_reading_that_did_not_converge_says_so_in_both_readings():
    from preflight.checkkit import confirm

    floors = {"h2d_bandwidth": floor(60 * GB)}
    first = bandwidth_figures.figures(host_copies({0: (NOISY, "max_repeats")}))
    second = bandwidth_figures.figures(host_copies({0: (QUIET, "converged")}))  # 53.7 GB/s again, now sure
    settled = confirm.settle(first, second, floors, lambda g: bandwidth.judge_floors(g, floors, 0.05), bandwidth_figures.WORDS, bandwidth.RERUN)
    (x,) = settled.findings["h2d_bandwidth"]
    assert x.status is FAIL and x.summary.endswith("(confirmed: 53.7 GB/s on GPU 0 (not converged: +-10%), then 53.7 GB/s on GPU 0)")
    assert x.cause.endswith("first reading: 53.7 GB/s on GPU 0 (not converged within +-2%: known to +-10.0% after 30 repeats, "
                            "at its cap of repeats); second reading: 53.7 GB/s on GPU 0")
    assert settled.lines == ["host->device copy: confirmed: first reading 53.7 GB/s on GPU 0 (not converged: +-10%), second 53.7 GB/s on GPU 0; floor 60.0 GB/s"]


# --- compute modes: GPUs that admit one process each ---------------------------------------------------

NVML_FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"


def cuda_result(nvml_file: str) -> Result:
    """The cuda check's result as the bandwidth check reads it: the NVML inventory in its details."""
    inv = FakeNvml(NVML_FIXTURES / nvml_file)
    return Result(check="cuda", status=Status.PASS, summary="ok", details={"inventory": inv.model_dump(mode="json")})


def test_gpus_in_exclusive_process_mode_leave_the_p2p_step_out_saying_why():
    ctx = make_ctx()
    ctx.results["cuda"] = cuda_result("h100-sxm-8x-exclusive-process.json")
    why = bandwidth_plan.exclusive_gpus(bandwidth.compute_modes(ctx))
    assert why is not None and "every GPU is in compute mode EXCLUSIVE_PROCESS" in why and "second context" in why
    assert bandwidth_plan.steps_for(True, 8, expect(), one_process=why) == ["hbm_copy", "h2d", "d2h", "all_reduce", "all_gather", "reduce_scatter", "latency", "graph_latency"]


@pytest.mark.parametrize("nvml_file", ["h100-sxm-8x-healthy.json", "h100-sxm-8x-prohibited.json"])
def test_gpus_in_default_mode_keep_the_p2p_step(nvml_file):
    # PROHIBITED fails the cuda check first (tests/checks/test_cuda.py); nothing here to leave out.
    ctx = make_ctx()
    ctx.results["cuda"] = cuda_result(nvml_file)
    assert bandwidth_plan.exclusive_gpus(bandwidth.compute_modes(ctx)) is None
    assert "p2p" in bandwidth_plan.steps_for(True, 8, expect(), one_process=None)


def test_one_gpu_in_exclusive_mode_is_named():
    assert bandwidth_plan.exclusive_gpus({0: "default", 1: "exclusive_process", 2: None}).startswith("GPU->GPU copies not measured: GPU 1 is in compute mode")


def test_without_the_cuda_check_the_compute_modes_come_from_nvml():
    ctx = make_ctx()
    ctx.settings = ctx.settings.model_copy(update={"nvml_fake": NVML_FIXTURES / "h100-sxm-8x-exclusive-process.json"})
    assert bandwidth.compute_modes(ctx) == {i: "exclusive_process" for i in range(8)}


def test_the_gather_leaves_p2p_out_on_an_exclusive_node(monkeypatch):
    seen = {}

    def collect(facts, worker, *args, **kw):
        seen["steps"] = worker.args[worker.args.index("--steps") + 1]

    monkeypatch.setattr(bandwidth.ranks, "collect", collect)
    ctx = make_ctx()
    ctx.results["cuda"] = cuda_result("h100-sxm-8x-exclusive-process.json")
    facts = bandwidth.gather(ctx, 8, expect(), "nccl")
    assert "p2p" not in seen["steps"].split(",") and facts.left_out and "EXCLUSIVE_PROCESS" in facts.left_out
    ctx.results["cuda"] = cuda_result("h100-sxm-8x-healthy.json")
    assert "p2p" in bandwidth.gather(ctx, 8, expect(), "nccl").steps and seen["steps"].split(",")[3] == "p2p"


# --- the all_reduce against the floor of the algorithm NCCL ran -------------------------------------------


def h100_ctx(env: dict[str, str]):
    path = profiles.BUILTIN_DIR / "h100-sxm.toml"
    ctx = make_ctx(host=Host(environ=env))
    ctx.profile = profiles.resolve(profiles.load(path), path, {}, "test")
    ctx.shape = NodeShape(gpus=8, gpus_from="test", fabric="nvswitch", fabric_from="test")
    return ctx


def all_reduce_at(busbw: float) -> BandwidthFacts:
    """Eight ranks' 4 GiB all_reduce, every repeat at ``busbw`` (nccl-tests' busbw = algbw x 2(n-1)/n)."""
    seconds = 4 * GIB / (busbw / (2 * 7 / 8))
    return per_rank(8, lambda r: [step("all_reduce", bytes=4 * GIB, seconds=[seconds] * 10, tolerance=0.02, stopped="converged")])


@pytest.mark.parametrize("env, busbw, status, said", [
    ({"NCCL_NVLS_ENABLE": "0"}, 368 * GB, Status.PASS, "NVLS was off (NCCL_NVLS_ENABLE=0 in the environment)"),
    ({"NCCL_NVLS_ENABLE": "0"}, 200 * GB, FAIL, "NVLink or NVSwitch"),
    ({}, 480 * GB, Status.PASS, None),
    ({}, 368 * GB, WARN, "NVLS state unknown"),
])
def test_an_h100_all_reduce_is_judged_against_the_algorithm_nccl_ran(monkeypatch, env, busbw, status, said):
    # Before: 368 GB/s with NVLS off FAILed "confirmed" against 430 GB/s, blaming NVLink or NVSwitch.
    monkeypatch.setattr(bandwidth, "gather", lambda *a, **kw: all_reduce_at(busbw))
    result = bandwidth.Bandwidth().run(h100_ctx(env))
    assert result.status == status
    told = str(result.model_dump())
    assert said is None or said in told
    if status != FAIL:
        assert "NVLink or NVSwitch port down" not in told


def test_the_stage_s_own_nccl_lines_say_whether_its_collectives_ran_nvls():
    # The lines NCCL wrote while bandwidth's large collectives set up (the launch's log cut at the
    # stage: gpuwork/world.py), here the 8x H100 all_reduce run's: 16 NVLS channels.
    from conftest import FIXTURES

    run = FIXTURES / "nccltests" / "11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt"
    log = bandwidth.stage_nccl_log({"nccl.rank0.log": run.read_text(), "rank0.log": "not NCCL's"})
    assert log is not None and log.nvls_channels == 16
    f = BandwidthFacts(python="py", backend="nccl", nproc=8, nccl=log, nccl_log=nccl_log.summary(log))
    dumped = f.model_dump(mode="json")
    assert dumped["nccl_log"]["nvls_channels"] == 16 and "nccl" not in dumped  # the summary in the details, not every channel line
    assert bandwidth.stage_nccl_log({}) is None and bandwidth.stage_nccl_log({"nccl.rank0.log": ""}) is None  # gloo: NCCL wrote nothing


def test_the_large_collectives_own_channels_are_judged_for_a_fallback_from_p2p():
    # The 2-GPU consumer box (tests/fixtures/nccl/02): both directions over SHM. On a profile that wants
    # P2P the bandwidth stage's own lines fail it, as the nccl check's smoke test's would.
    log = nccl_log.parse(nccl_fixture_text("02"))
    outcomes = [ranks.RankOutcome(rank=r, gpu=f"GPU {r}", report=RankReport(rank=r, local_rank=r, world_size=2, host="n", pid=r, python="py", stage="done",
                                                                            backend="nccl", device="cuda")) for r in (0, 1)]
    f = BandwidthFacts(python="py", backend="nccl", nproc=2, ranks=outcomes, nccl=log)
    ctx = make_ctx()
    assert bandwidth.judge_transports(f, ctx) == []  # a profile without [nccl] expects nothing
    ctx.profile = ctx.profile.model_copy(update={"nccl": NcclExpect(init_source="test", p2p="fail", p2p_source="test: GPUs joined by NVLink")})
    (x,) = bandwidth.judge_transports(f, ctx)
    assert x.status is Status.FAIL and x.summary == "GPUs fall back from P2P in the large collectives (2 pairs)", x.summary
    assert "rank 0 (GPU 0) -> rank 1 (GPU 1) via SHM/direct/direct" in x.cause
    assert bandwidth.judge_transports(BandwidthFacts(python="py", backend="gloo", nproc=2, ranks=outcomes), ctx) == []  # gloo: no NCCL lines


def stage_summary(text: str) -> nccl_log.Summary:
    return nccl_log.summary(nccl_log.parse(text))


NVLS_RAN = "nccltests/11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt"


@pytest.mark.parametrize("stage_log, busbw, status, said", [
    # NCCL's "0 nvls channels" (the 2-GPU box's lines): rings ran, 368 GB/s is theirs.
    ("02", 368 * GB, Status.PASS, "0 nvls channels (NCCL set no NVLS up for its collectives)"),
    # "16 nvls channels" (the 8x H100 all_reduce run): NVLS ran, so 368 GB/s is a degraded NVLink.
    (NVLS_RAN, 368 * GB, FAIL, "NVLink or NVSwitch"),
    (NVLS_RAN, 480 * GB, Status.PASS, None),
    # The stage's lines say only "available" (NCCL 2.18.3, no channels line): both causes, no FAIL.
    ("05", 368 * GB, WARN, "either NVLS was not used by this communicator"),
    ("05", 200 * GB, FAIL, "NVLink or NVSwitch"),
])
def test_the_bandwidth_stage_s_own_nccl_lines_say_whether_nvls_ran(monkeypatch, stage_log, busbw, status, said):
    # Before: the nccl check's "NVLS multicast support is available" held a node whose
    # communicator ran rings to the 430 GB/s NVLS floor: FAIL, blaming NVLink.
    from conftest import FIXTURES

    text = (FIXTURES / stage_log).read_text() if "/" in stage_log else nccl_fixture_text(stage_log)
    facts = all_reduce_at(busbw)
    facts.nccl_log = stage_summary(text)
    monkeypatch.setattr(bandwidth, "gather", lambda *a, **kw: facts)
    ctx = h100_ctx({})
    said_available = nccl_log.parse(nccl_fixture_text("05")).nvls
    ctx.results["nccl"] = Result(check="nccl", status=Status.PASS, summary="ok", details={"nccl_log": {"nvls": said_available}})
    result = bandwidth.Bandwidth().run(ctx)
    assert result.status == status
    told = str(result.model_dump())
    assert said is None or said in told
    if status == WARN:
        assert "NVLink/NVSwitch is degraded" in result.cause and result.summary.endswith("NVLS may not have run")


def test_the_nccl_check_s_available_line_alone_names_both_causes(monkeypatch):
    monkeypatch.setattr(bandwidth, "gather", lambda *a, **kw: all_reduce_at(368 * GB))
    ctx = h100_ctx({})
    ctx.results["nccl"] = Result(check="nccl", status=Status.PASS, summary="ok", details={"nccl_log": {"nvls": True}})
    result = bandwidth.Bandwidth().run(ctx)
    assert result.status == WARN and "either NVLS was not used by this communicator" in result.cause
    assert "NVLink or NVSwitch port down" not in str(result.model_dump())


@pytest.mark.parametrize("launch, status", [(1, Status.PASS), (2, WARN)])
def test_in_a_shared_launch_the_nccl_stage_s_channels_line_judges_the_reused_communicator(monkeypatch, launch, status):
    # The group the nccl stage made (its "0 nvls channels" line among its own) served bandwidth's
    # collectives in the same launch: rings ran and 368 GB/s passes. In a launch of its own it was not that communicator.
    facts = all_reduce_at(368 * GB)
    facts.world = {"launch": launch, "stage": 2 if launch == 1 else 1, "ended_it": False}
    monkeypatch.setattr(bandwidth, "gather", lambda *a, **kw: facts)
    ctx = h100_ctx({})
    zero = nccl_log.parse(nccl_fixture_text("02")).nvls_channels
    ctx.results["nccl"] = Result(check="nccl", status=Status.PASS, summary="ok",
                                 details={"nccl_log": {"nvls": True, "nvls_channels": zero}, "world": {"launch": 1, "stage": 1, "ended_it": False}})
    result = bandwidth.Bandwidth().run(ctx)
    assert result.status == status and zero == 0
    if status == Status.PASS:
        assert "0 nvls channels" in str(result.model_dump()) and "NVLS was off" in "\n".join(result.lines)


def test_local_rank_0_s_p2p_setup_is_said_with_the_gpus_left_holding_its_context():
    setup = {"p2p": {"by": "local rank 0", "gpus": 4, "contexts": 3, "contexts_seconds": 0.41, "buffers_seconds": 0.12, "bytes_per_gpu": GIB}}
    f = facts([outcome(r, report(r, world=4, step_seconds={"p2p": 1.3 if r == 0 else 1.31}, setup=setup if r == 0 else {}, import_seconds=2.0, init_seconds=1.0))
               for r in range(4)])
    (line,) = bandwidth_plan.time_line(f)
    assert "p2p 1.3 s (3 contexts 0.4 s, buffers 0.1 s)" in line, line
    assert bandwidth_plan.foreign_contexts(f) == {"process": "local rank 0", "gpus": ["GPU 1", "GPU 2", "GPU 3"], "per_gpu": 1}
    assert bandwidth_plan.foreign_line(f) == ["GPU->GPU copies made from local rank 0's process over every GPU: GPU 1, GPU 2, GPU 3 each hold that one context of it for the rest of the launch"]
    assert bandwidth_plan.foreign_contexts(per_rank(2, lambda r: [])) is None and bandwidth_plan.foreign_line(per_rank(2, lambda r: [])) == []


def test_a_setup_not_in_the_worker_s_shape_is_a_report_that_does_not_fit_not_a_traceback_later():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        report(0, setup={"p2p": {"contexts": "seven"}})
