"""Confirm before FAIL (preflight/checkkit/confirm.py) on recorded figures: a figure
beyond its floor on both readings FAILs "confirmed", on one reading only WARNs
"transient", and one not measured again keeps its FAIL with the reason; a
hard fault is never measured again. The real runs are in
tests/checks/test_bandwidth.py and test_train.py."""

from __future__ import annotations

from preflight.checkkit import confirm
from preflight.checkkit import figures as figs_mod
from preflight.base.findings import Finding, Status
from preflight.checkkit.figures import Figure
from preflight.pipeline.profiles import ResolvedFloor

FAIL, WARN = Status.FAIL, Status.WARN
BPS, GB = "bytes_per_second", 1e9
WORDS = {"memcpy_bandwidth": "host memcpy", "allreduce_latency": "small all_reduce latency p50"}
FLOORS = {
    "memcpy_bandwidth": ResolvedFloor(value=2 * GB, unit=BPS, bound="min", source="test: a tenth of a DDR4 channel", origin="profile test"),
    "allreduce_latency": ResolvedFloor(value=0.02, unit="seconds", bound="max", source="test: 40x the CI VM's p50", origin="profile test"),
}
RERUN = "preflight run --only bandwidth"


def memcpy(*values: float) -> list[Figure]:
    return [Figure(name="memcpy_bandwidth", unit=BPS, value=v * GB, where=f"rank {r}", labels={"rank": str(r)}, rank=r) for r, v in enumerate(values)]


def latency(value: float) -> list[Figure]:
    return [Figure(name="allreduce_latency", unit="seconds", value=value, where="slowest of 2 ranks: rank 1", labels={"stat": "p50"})]


def judge(figs: list[Figure]) -> list[Finding]:
    return figs_mod.judge_floors(figs, FLOORS, 0.05, WORDS, {}, RERUN)


def settle(first, second, why=None) -> confirm.Settled:
    return confirm.settle(first, second, FLOORS, judge, WORDS, RERUN, why)


def only(settled: confirm.Settled, key: str) -> Finding:
    (f,) = settled.findings[key]
    return f


# --- which figures are measured again, and when not ------------------------------------


def test_missed_names_each_figure_beyond_its_floor_or_ceiling_once():
    assert confirm.missed(memcpy(1.1, 1.5) + latency(0.03), FLOORS) == ["memcpy_bandwidth", "allreduce_latency"]


def test_a_figure_within_the_margin_or_without_a_floor_is_not_missed():
    unjudged = Figure(name="allgather_bus_bandwidth", unit=BPS, value=1.0, where="2 ranks")
    assert confirm.missed(memcpy(2.05, 9) + latency(0.0199) + [unjudged], FLOORS) == []


def test_a_hard_fault_is_never_measured_again():
    died = Finding(FAIL, "rank 0 died in latency (step 5) (killed by SIGKILL)", "rank 0 died ...", "look at that rank")
    why = confirm.why_not([died], group=False, need=10, left=100)
    assert why == "not measured again: the run had a hard fault (rank 0 died in latency (step 5) (killed by SIGKILL)), which is never retried"


def test_a_warning_elsewhere_does_not_stop_the_second_reading():
    clamped = Finding(WARN, "buffer sizes clamped to free memory", "...", "...")
    assert confirm.why_not([clamped], group=False, need=10, left=100) is None


def test_without_the_time_for_a_second_launch_it_says_so():
    assert confirm.why_not([], group=False, need=40, left=12.4) == "no time left to measure again (12 s left before the check's deadline, about 40 s needed)"


def test_a_run_across_nodes_is_measured_once():
    assert "a run across nodes is measured once" in confirm.why_not([], group=True, need=1, left=100)


def test_the_second_launch_needs_the_first_ones_time_less_what_it_will_not_redo():
    assert confirm.need_seconds(30.0, skipped=10.0) == 20.0 * confirm.SLACK
    assert confirm.need_seconds(None) == 0.0


# --- the verdict on two readings --------------------------------------------------------


def test_beyond_the_floor_on_both_readings_fails_confirmed_with_both_figures():
    s = settle(memcpy(9.2, 1.1), memcpy(9.0, 1.3))
    f = only(s, "memcpy_bandwidth")
    assert f.status == FAIL
    assert f.summary == "host memcpy below floor on rank 1 (1.3 GB/s, floor 2 GB/s) (confirmed: 1.1 GB/s on rank 1, then 1.3 GB/s on rank 1)"
    assert f.cause.endswith("; confirmed by measuring again in the same run: first reading: 1.1 GB/s on rank 1; second reading: 1.3 GB/s on rank 1")
    (r,) = s.readings
    assert r["verdict"] == "confirmed" and [g["value"] for g in r["first"]] == [9.2e9, 1.1e9] and [g["value"] for g in r["second"]] == [9.0e9, 1.3e9]
    assert s.lines == ["host memcpy: confirmed: first reading 1.1 GB/s on rank 1, second 1.3 GB/s on rank 1; floor 2 GB/s"]


def test_beyond_the_floor_on_the_first_reading_only_warns_transient_with_both_figures():
    s = settle(memcpy(9.2, 1.1), memcpy(3.5, 3.9))
    f = only(s, "memcpy_bandwidth")
    assert f.status == WARN
    assert f.summary == "host memcpy transient on rank 1: 1.1 GB/s, then 3.9 GB/s (floor 2 GB/s)"  # rank 1 on both readings, not the weakest of the second
    assert "on the first of two readings in this run only: first reading: 1.1 GB/s on rank 1; second reading: every figure within it (the weakest 3.5 GB/s on rank 0)" in f.cause
    assert "test: a tenth of a DDR4 channel" in f.cause and "drain the node if it recurs (`preflight run --only bandwidth`)" in f.remedy
    assert s.readings[0]["verdict"] == "transient"
    assert s.lines == ["host memcpy: transient: first reading 1.1 GB/s on rank 1, second 3.5 GB/s on rank 0; floor 2 GB/s"]


def test_a_ceiling_missed_on_the_second_reading_only_is_transient_too():
    s = settle(latency(0.001), latency(0.05))
    f = only(s, "allreduce_latency")
    assert f.status == WARN and f.summary == "small all_reduce latency p50 transient on slowest of 2 ranks: rank 1: 1 ms, then 50 ms (ceiling 20 ms)"
    assert "over the 20 ms ceiling" in f.cause and "on the second of two readings" in f.cause


def test_the_verdict_and_the_measurements_rest_on_the_second_reading_for_what_was_measured_again():
    s = settle(memcpy(9.2, 1.1) + latency(0.001), memcpy(3.5, 3.9))
    assert [(g.name, g.value) for g in s.figures] == [("memcpy_bandwidth", 3.5e9), ("memcpy_bandwidth", 3.9e9), ("allreduce_latency", 0.001)]
    assert s.findings["allreduce_latency"] == []


def test_a_figure_measured_again_and_marginal_on_the_second_reading_warns_as_marginal():
    s = settle(memcpy(9, 9) + latency(0.03), memcpy(9, 9) + latency(0.0195))
    assert only(s, "allreduce_latency").status == WARN  # transient: the p50 missed once
    s = settle(memcpy(9, 1.0) + latency(0.001), memcpy(9, 1.0) + latency(0.0195))
    assert only(s, "allreduce_latency").summary.startswith("small all_reduce latency p50 marginal")  # within both times: the second judged as usual


def test_not_measured_again_the_fail_stays_and_says_why():
    why = "no time left to measure again (3 s left before the check's deadline, about 40 s needed)"
    s = settle(memcpy(9.2, 1.1), None, why)
    f = only(s, "memcpy_bandwidth")
    assert f.status == FAIL and f.summary.endswith("(not confirmed)") and f.cause.endswith(f"; not confirmed: {why}")
    assert s.readings == [{"name": "memcpy_bandwidth", "verdict": "not confirmed", "first": [g.model_dump(mode="json") for g in memcpy(9.2, 1.1)], "second": None, "why": why}]
    assert s.lines == [f"host memcpy: not confirmed ({why}): 1.1 GB/s on rank 1"]


def test_a_figure_the_second_run_did_not_give_keeps_its_fail_unconfirmed():
    s = settle(memcpy(9.2, 1.1) + latency(0.03), memcpy(3.5, 3.9))  # the second run died before its latency step
    f = only(s, "allreduce_latency")
    assert f.status == FAIL and "not confirmed: the second reading has no figure for it" in f.cause


def test_a_healthy_reading_is_judged_as_before():
    s = settle(memcpy(9.2, 2.05) + latency(0.001), None)
    assert s.findings["allreduce_latency"] == [] and only(s, "memcpy_bandwidth").summary.startswith("host memcpy marginal on rank 1")
    assert s.readings == [] and s.lines == []


# --- the check's parts after both readings ----------------------------------------------------


def test_the_second_runs_hard_faults_join_the_first_runs_parts_and_the_floors_part_is_the_settled_one():
    clamped = Finding(WARN, "buffer sizes clamped to free memory", "memcpy: ...", "find what holds the memory")
    died = Finding(FAIL, "rank 1 died in memcpy (step 1) (killed by SIGKILL)", "rank 1 died in memcpy", "look at that rank")
    first = {"run": [], "floors": judge(memcpy(9.2, 1.1)), "setup": [clamped]}
    second = {"run": [died], "floors": [], "setup": [clamped]}
    s = settle(memcpy(9.2, 1.1), [])
    parts = confirm.combine(first, second, s, ("floors",), lambda name: "floors")
    assert parts["setup"] == [clamped]  # said once
    (again,) = parts["run"]
    assert again.status == FAIL and again.summary == "measuring again: rank 1 died in memcpy (step 1) (killed by SIGKILL)" and again.cause == "on the second reading: rank 1 died in memcpy"
    (floor,) = parts["floors"]
    assert floor.status == FAIL and "not confirmed" in floor.summary


def test_details_keep_the_launches_and_both_readings():
    s = settle(memcpy(9.2, 1.1), memcpy(3.5, 3.9))
    d = confirm.details(s, 2, ["memcpy"], None)
    assert d["launches"] == 2 and d["remeasured"] == ["memcpy"] and d["why_not"] is None and d["readings"][0]["verdict"] == "transient"


def test_beyond_the_floor_on_both_readings_but_by_different_members_is_transient_not_confirmed():
    """8 host copies of a healthy node: a passing load (a storage transfer on the PCIe switch)
    pulls rank 0 under the floor on the first reading and rank 1 on the second. No member missed
    twice, so nothing is confirmed: WARN transient, as the node's median rules its outliers."""
    s = settle(memcpy(1.1, 9.2), memcpy(9.0, 1.3))
    f = only(s, "memcpy_bandwidth")
    assert f.status == WARN, f.summary
    assert f.summary == "host memcpy transient on rank 0: 1.1 GB/s, then 9 GB/s (floor 2 GB/s)"
    assert "on both readings in this run, but by no GPU, pair or rank on both: first reading: 1.1 GB/s on rank 0; second reading: 1.3 GB/s on rank 1" in f.cause
    assert s.readings[0]["verdict"] == "transient"
    # The same member under it twice is confirmed, whatever else moved.
    assert only(settle(memcpy(1.1, 1.5), memcpy(9.0, 1.3)), "memcpy_bandwidth").status == FAIL


def test_a_gpu_under_the_floor_in_other_pairs_on_each_reading_is_confirmed():
    """GPU 3's NVLink degraded, every pair of it at the floor: 3->1 and 3->2 under it on the first
    reading, 3->5 and 3->6 on the second. The same GPU missed twice, whichever its peers: FAIL."""
    floor = {"p2p_bandwidth": ResolvedFloor(value=300 * GB, unit=BPS, bound="min", source="test: NVLink P2P floor", origin="profile test")}

    def pairs(*peers: int) -> list[Figure]:
        return [Figure(name="p2p_bandwidth", unit=BPS, value=(290 if p in peers else 330) * GB, where=f"GPU 3 -> GPU {p}",
                       labels={"gpu": "3", "UUID": "GPU-3", "peer_gpu": str(p)}) for p in (0, 1, 2, 4, 5, 6, 7)]

    def judged(figs: list[Figure]) -> list[Finding]:
        return figs_mod.judge_floors(figs, floor, 0.05, {"p2p_bandwidth": "P2P copy"}, {}, RERUN)

    s = confirm.settle(pairs(1, 2), pairs(5, 6), floor, judged, {"p2p_bandwidth": "P2P copy"}, RERUN, None)
    assert [f.status for f in s.findings["p2p_bandwidth"]] == [FAIL] and s.readings[0]["verdict"] == "confirmed"
    # Two GPUs of a healthy node, each under it once, still confirm nothing.
    other = [g.model_copy(update={"labels": {**g.labels, "gpu": "6", "UUID": "GPU-6"}, "where": g.where.replace("GPU 3", "GPU 6")}) for g in pairs(5)]
    other = [g.model_copy(update={"value": 290 * GB if g.labels["peer_gpu"] == "0" else 330 * GB}) for g in other]
    assert confirm.settle(pairs(1), other, floor, judged, {"p2p_bandwidth": "P2P copy"}, RERUN, None).readings[0]["verdict"] == "transient"


def test_a_node_figure_whose_slowest_rank_moves_is_still_confirmed():
    """A latency or a collective is the node's: over its ceiling on both readings is confirmed,
    whichever rank its words name as the slowest."""
    other = [Figure(name="allreduce_latency", unit="seconds", value=0.05, where="slowest of 2 ranks: rank 0", labels={"stat": "p50"})]
    f = only(settle(latency(0.03), other), "allreduce_latency")
    assert f.status == FAIL and "(confirmed:" in f.summary


def test_one_missed_pair_on_each_reading_that_share_a_gpu_confirms_nothing():
    """A passing load on GPU 2, then on GPU 6: 2->0 under the floor on the first reading, 6->0 on the
    second. GPU 0 is in both, but in one missed pair of each: no fault of its own (with 56 pairs, one
    random miss a reading shared a GPU 46% of the time when one pair named both its GPUs)."""
    floor = {"p2p_bandwidth": ResolvedFloor(value=300 * GB, unit=BPS, bound="min", source="test: NVLink P2P floor", origin="profile test")}

    def pair(src: int, dst: int, value: float) -> Figure:
        return Figure(name="p2p_bandwidth", unit=BPS, value=value * GB, where=f"GPU {src} -> GPU {dst}",
                      labels={"gpu": str(src), "UUID": f"GPU-{src}", "peer_gpu": str(dst)})

    def judged(figs: list[Figure]) -> list[Finding]:
        return figs_mod.judge_floors(figs, floor, 0.05, {"p2p_bandwidth": "P2P copy"}, {}, RERUN)

    first, second = [pair(2, 0, 290), pair(6, 0, 330)], [pair(2, 0, 330), pair(6, 0, 290)]
    s = confirm.settle(first, second, floor, judged, {"p2p_bandwidth": "P2P copy"}, RERUN, None)
    assert s.readings[0]["verdict"] == "transient"
    # Both directions of each pair: GPU 0 is still in one missed pair a reading (2<->0, then 6<->0).
    first = [pair(2, 0, 290), pair(0, 2, 290), pair(6, 0, 330), pair(0, 6, 330)]
    second = [pair(2, 0, 330), pair(0, 2, 330), pair(6, 0, 290), pair(0, 6, 290)]
    assert confirm.settle(first, second, floor, judged, {"p2p_bandwidth": "P2P copy"}, RERUN, None).readings[0]["verdict"] == "transient"
    # One degraded link, both directions missed on both readings: that pair is confirmed.
    link = [pair(3, 5, 290), pair(5, 3, 290), pair(3, 4, 330)]
    assert confirm.settle(link, link, floor, judged, {"p2p_bandwidth": "P2P copy"}, RERUN, None).readings[0]["verdict"] == "confirmed"
