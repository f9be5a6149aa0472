"""What the report page takes out of a report, on recorded reports and on
reports changed the way a real run would change them (a slow pair, an outlier)."""

from __future__ import annotations

from pathlib import Path

import pytest
from preflight.base.findings import Measurement, Status
from preflight.outputs.html import page_facts as facts
from preflight.pipeline.check import Result
from preflight.pipeline.report import Report

REPORTS = Path(__file__).parent.parent / "fixtures" / "reports"
GB = 1e9


def recorded(name: str) -> Report:
    return Report.model_validate_json((REPORTS / f"{name}.json").read_bytes())


def test_problems_come_failures_first_each_with_cause_and_fix():
    r = recorded("h100-fake-hw-slowdown")
    found = facts.problems(r)
    assert [p.check for p in found] == ["cuda", "topology"]
    assert all(p.status == "FAIL" and p.cause and p.remedy for p in found)
    assert [p.action for p in found] == ["drain (node)", "drain (node)"]  # recorded before actions: each FAIL's
    assert facts.problems(recorded("cpu-pass")) == []


def test_the_timeline_follows_the_run_and_a_carried_check_takes_none_of_its_time():
    r = recorded("cpu-pass")
    spans = facts.timeline(r)
    assert [s.check for s in spans] == ["shm", "nccl", "bandwidth", "train"]
    assert spans[1].start == pytest.approx(spans[0].seconds) and spans[3].start == pytest.approx(sum(s.seconds for s in spans[:3]))
    r.checks[2] = r.checks[2].model_copy(update={"details": {**r.checks[2].details, "carried_from": "2026-11-22T05:00:00+00:00"}})
    spans = facts.timeline(r)
    assert spans[2].seconds == 0 and spans[2].carried_from and spans[3].start == pytest.approx(spans[0].seconds + spans[1].seconds)


def test_bars_are_weakest_first_against_their_floor():
    groups = {g.name: g for g in facts.bar_groups(recorded("cpu-pass"))}
    memcpy = groups["memcpy_bandwidth"]
    assert [b.who for b in memcpy.bars] == ["rank 0", "rank 1"]  # 11.5 before 13.8 GB/s
    assert memcpy.bars[0].bound == 2e9 and memcpy.bars[0].higher_is_better and not memcpy.bars[0].past_bound
    assert set(groups) == {"memcpy_bandwidth", "gemm_throughput"}  # nothing unjudged is drawn


def test_a_figure_past_its_floor_puts_its_group_first():
    r = recorded("cpu-pass")
    train = next(c for c in r.checks if c.check == "train")
    ms = [m.model_copy(update={"value": 1e9}) if m.name == "gemm_throughput" and m.labels == {"rank": "1"} else m for m in train.measurements]
    r.checks[3] = train.model_copy(update={"measurements": ms})
    first = facts.bar_groups(r)[0]
    assert first.name == "gemm_throughput" and first.bars[0].who == "rank 1" and first.bars[0].past_bound


def test_an_outlier_is_marked_by_the_bands_the_check_recorded():
    r = recorded("cpu-pass")
    bw = next(c for c in r.checks if c.check == "bandwidth")
    shortfall = [Measurement(name="memcpy_bandwidth_median_shortfall", unit="ratio", value=v, labels={"rank": k}, ceiling=0.45)
                 for k, v in (("0", 0.33), ("1", -0.33))]
    details = {**bw.details, "outlier_bands": {"memcpy_bandwidth": {"warn": 0.25, "fail": 0.45}}}
    r.checks[2] = bw.model_copy(update={"measurements": bw.measurements + shortfall, "details": details})
    memcpy = next(g for g in facts.bar_groups(r) if g.name == "memcpy_bandwidth")
    assert {b.who: b.outlier for b in memcpy.bars} == {"rank 0": "WARN", "rank 1": None}
    # A report from before the bands were recorded: the FAIL band (the ceiling) alone.
    r.checks[2].details.pop("outlier_bands")
    memcpy = next(g for g in facts.bar_groups(r) if g.name == "memcpy_bandwidth")
    assert {b.who: b.outlier for b in memcpy.bars} == {"rank 0": None, "rank 1": None}


def p2p_report(values: dict[tuple[int, int], float], floor: float = 300 * GB) -> Report:
    r = recorded("h100-fake-hw-slowdown")
    ms = [Measurement(name="p2p_bandwidth", unit="bytes_per_second", value=v, labels={"gpu": str(a), "peer_gpu": str(b)}, floor=floor)
          for (a, b), v in values.items()]
    i = next(i for i, c in enumerate(r.checks) if c.check == "bandwidth")
    r.checks[i] = Result(check="bandwidth", status=Status.FAIL, summary="p2p", measurements=ms)
    return r


def test_the_p2p_matrix_has_every_ordered_pair_and_marks_the_slow_one():
    values = {(a, b): 380 * GB for a in range(8) for b in range(8) if a != b}
    values[(2, 5)] = 150 * GB
    m = facts.p2p(p2p_report(values))
    assert m is not None and m.gpus == 8 and len(m.cells) == 56 and m.floor == 300 * GB
    slow = [(c.src, c.dst) for c in m.cells if c.below_floor]
    assert slow == [(2, 5)]
    assert "56 of 56 ordered pairs" in m.note


def test_pairs_not_measured_are_said_and_not_drawn_as_zero():
    m = facts.p2p(recorded("h100-fake-hw-slowdown"))
    assert m is not None and len(m.cells) == 56 and all(c.value is None for c in m.cells)
    assert m.note.startswith("not measured: bandwidth SKIP")
    assert facts.p2p(recorded("cpu-pass")) is None  # no GPU: no matrix


def test_a_group_lists_every_node_and_the_missing_ones():
    rows = facts.group_rows(recorded("group-keptout-node0"))
    assert [(r.node_rank, r.state) for r in rows] == [(0, "ok"), (1, "failed")]
    assert "64 MiB" in rows[1].why
    r = recorded("group-pass-node0")
    r.group.missing = [1]
    r.group.nodes = r.group.nodes[:1]
    rows = facts.group_rows(r)
    assert [(x.node_rank, x.state) for x in rows] == [(0, "ok"), (1, "missing")]
    assert rows[0].figures["internode_allreduce_bus_bandwidth"] > 0
    assert facts.group_rows(recorded("cpu-pass")) is None


def test_a_figure_of_zero_against_its_floor_is_past_it_and_weakest():
    r = recorded("h100-fake-hw-slowdown")
    cuda = r.checks[0]
    ms = [m.model_copy(update={"value": 0.0, "floor": 18.0}) if m.name == "gpu_nvlinks_active" and m.labels["gpu"] == "5"
          else m.model_copy(update={"floor": 18.0}) if m.name == "gpu_nvlinks_active" else m for m in cuda.measurements]
    r.checks[0] = cuda.model_copy(update={"measurements": ms})
    links = next(g for g in facts.bar_groups(r) if g.name == "gpu_nvlinks_active")
    assert links.bars[0].who == "GPU 5" and links.bars[0].past_bound
    assert not any(b.past_bound for b in links.bars[1:])


def test_the_p2p_axis_widens_to_the_gpus_the_pairs_name():
    values = {(a, b): 380 * GB for a in range(4, 8) for b in range(4, 8) if a != b}  # CUDA_VISIBLE_DEVICES=4,5,6,7
    r = p2p_report(values)
    r.shape = None
    r.checks = [c for c in r.checks if c.check != "cuda"]
    m = facts.p2p(r)
    assert m is not None and m.gpus == 8 and sum(c.value is not None for c in m.cells) == 12


def test_a_result_carried_from_an_earlier_run_says_so_everywhere_it_is_drawn():
    r = recorded("cpu-pass")
    bw = r.checks[2]
    r.checks[2] = bw.model_copy(update={"status": Status.FAIL, "details": {**bw.details, "carried_from": "2026-11-22T01:00:00+00:00", "carried_level": "full"}})
    (p,) = facts.problems(r)
    assert p.carried == "the run of 2026-11-22T01:00:00, level full"
    memcpy = next(g for g in facts.bar_groups(r) if g.name == "memcpy_bandwidth")
    assert memcpy.carried == p.carried
    # A lighter look that kept a deeper run's figures: those figures, not the whole check, are the earlier run's.
    train = r.checks[3]
    kept = {"from": "2026-11-22T01:00:00+00:00", "level": "full", "names": ["gemm_throughput"]}
    r.checks[3] = train.model_copy(update={"details": {**train.details, "carried_measurements": kept}})
    assert facts.carried(r.checks[3]) is None
    gemm = next(g for g in facts.bar_groups(r) if g.name == "gemm_throughput")
    assert gemm.carried == "the run of 2026-11-22T01:00:00, level full"


def test_a_ring_follows_the_checks_verdict_after_its_second_reading():
    r = recorded("cpu-pass")
    bw = r.checks[2]
    # One reading put rank 0 past the FAIL band, the second did not: the check said WARN (transient).
    shortfall = [Measurement(name="memcpy_bandwidth_median_shortfall", unit="ratio", value=v, labels={"rank": k}, ceiling=0.45)
                 for k, v in (("0", 0.5), ("1", -0.5))]
    details = {**bw.details, "outlier_bands": {"memcpy_bandwidth": {"warn": 0.25, "fail": 0.45}},
               "outliers": [{"name": "memcpy_bandwidth", "labels": {"rank": "0"}, "status": "WARN"}]}
    r.checks[2] = bw.model_copy(update={"measurements": bw.measurements + shortfall, "details": details})
    memcpy = next(g for g in facts.bar_groups(r) if g.name == "memcpy_bandwidth")
    assert {b.who: b.outlier for b in memcpy.bars} == {"rank 0": "WARN", "rank 1": None}


def test_one_gpu_has_no_pair_and_the_page_says_so():
    from preflight.outputs.html import page

    r = recorded("h100-fake-hw-slowdown")
    r.checks[0].details["inventory"]["gpus"] = r.checks[0].details["inventory"]["gpus"][:1]
    assert facts.gpu_count(r) == 1 and facts.p2p(r) is None
    assert "one GPU: no pair to copy between" in page.render(r, "test")
    assert "no GPU in this report" in page.render(recorded("shm-64m-fail"), "test")


def test_an_interrupted_run_is_its_first_problem_and_the_page_says_interrupted_not_broken():
    from preflight.outputs.html import page
    from preflight.pipeline.report import carry_forward
    from preflight.pipeline.runner import cut_short

    before = recorded("cpu-pass")
    r = recorded("cpu-pass").model_copy(update={"interrupted_by_signal": 15, "exit_code": 143, "verdict": "error"})
    r.checks[2] = Result(check="bandwidth", status=Status.ERROR, summary="interrupted by SIGTERM while running", details=cut_short(15))
    r.checks[3] = Result(check="train", status=Status.SKIP, summary="skipped: the run was interrupted by SIGTERM", details=cut_short(15))
    assert facts.problems(r)[0].check == "bandwidth"  # nothing to carry yet: its own ERROR
    carry_forward(r, before, ["shm", "nccl", "bandwidth", "train"])
    (run,) = [p for p in [facts.interruption(r)] if p]
    assert run.check == "run" and run.status == "INTERRUPTED" and facts.problems(r) == []  # what it holds passed
    assert run.summary == "interrupted by SIGTERM while bandwidth ran: the run did not finish; bandwidth, train keep the last complete results, from an earlier run"
    html = page.render(r, "test")
    assert '<header class="banner interrupted" data-verdict="error"><h1>INTERRUPTED: ' in html and "broke" not in html
    assert "(this run: interrupted by SIGTERM while running)" in html and "(this run: skipped: the run was interrupted by SIGTERM)" in html
    # A check that failed before the signal keeps the FAIL banner, and the interruption is said beside it.
    failed = recorded("shm-64m-fail").model_copy(update={"interrupted_by_signal": 15, "exit_code": 143})
    html = page.render(failed, "test")
    assert 'class="banner fail"' in html and "a check failed: drain this node; the run was then interrupted by SIGTERM" in html
    assert facts.interruption(recorded("cpu-pass")) is None
