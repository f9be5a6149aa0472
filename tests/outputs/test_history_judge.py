"""Drift and lemons judged from recorded histories (outputs/record/history_judge.py): pure, no file."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from preflight.base.actions import Action
from preflight.outputs.record import history_judge as judge
from preflight.outputs.record.history import History, Run, Series
from preflight.pipeline.expectations import DriftExpect

T0 = datetime(2026, 11, 20, tzinfo=timezone.utc)
RULE = DriftExpect(recent=5, earlier=30, earlier_min=5, fraction=0.05, source="the test's rule")
GB = 1e9


def runs(n: int, failed: dict[int, list[str]] | None = None, hours: float = 1.0) -> list[Run]:
    return [Run(i, T0 + timedelta(hours=hours * i), T0 + timedelta(hours=hours * i), "fail" if (failed or {}).get(i) else "pass",
                "standard", "cpu", "none", (failed or {}).get(i, [])) for i in range(1, n + 1)]


def past(values: list[float], floor: float | None = 2 * GB, ceiling: float | None = None) -> History:
    s = Series("bandwidth", "memcpy_bandwidth", {"rank": "0"}, "bytes_per_second", floor, ceiling, list(enumerate(values, start=1)))
    return History(runs(len(values)), [s])


def this_run(value: float, floor: float | None = 2 * GB, ceiling: float | None = None) -> list[tuple]:
    return [("bandwidth", "memcpy_bandwidth", '{"rank":"0"}', "bytes_per_second", floor, ceiling, value)]


def result(values: list[float], now: float, rule: DriftExpect | None = RULE, floor: float | None = 2 * GB, **kw):
    return judge.judge(this_run(now, floor, kw.get("ceiling")), [], T0 + timedelta(days=30), past(values, floor, kw.get("ceiling")), rule, "cpu", 3, 7)


def test_ten_runs_sliding_step_by_step_warn_drifting_naming_the_figure_both_levels_and_the_run_it_started():
    # Five runs at 9 GB/s, then 8.5, 8, 7.5, 7 and this run's 6.5: every one above the 2 GB/s floor.
    r = result([9 * GB] * 5 + [8.5 * GB, 8 * GB, 7.5 * GB, 7 * GB], 6.5 * GB)
    assert r.status == "WARN" and r.action == Action.WATCH
    (d,) = r.details["drifting"]
    assert d["figure"] == "memcpy_bandwidth" and d["labels"] == {"rank": "0"} and d["since_run"] == 6
    assert d["recent"] == 7.5 * GB and d["earlier"] == 9 * GB
    assert r.summary.startswith("bandwidth memcpy_bandwidth{rank=0} drifting: 7.5 GB/s over the last 5 runs, 16.7% under its earlier 9 GB/s, since run 6 of 2026-11-20T06:00:00+00:00; floor 2 GB/s")
    assert "profile cpu [drift]: the test's rule" in r.cause
    ratio = next(m for m in r.measurements if m.name == "history_drift")
    assert ratio.unit == "ratio" and ratio.labels == {"rank": "0", "check": "bandwidth", "figure": "memcpy_bandwidth"}
    assert abs(ratio.value - 7.5 / 9) < 1e-9


def test_within_the_fraction_is_no_drift_and_still_gives_its_ratio():
    r = result([9 * GB] * 5 + [8.8 * GB] * 4, 8.7 * GB)
    assert r.status == "PASS" and r.details["drifting"] == [] and r.action == Action.NONE
    assert [round(m.value, 3) for m in r.measurements if m.name == "history_drift"] == [round(8.8 / 9, 3)]


def test_too_few_runs_judge_nothing():
    r = result([9 * GB] * 8, 1 * GB * 3)  # nine runs: five recent need five before them
    assert r.status == "PASS" and not [m for m in r.measurements if m.name == "history_drift"]


def test_a_figure_under_its_floor_is_the_check_s_fail_not_a_drift():
    r = result([9 * GB] * 5 + [8 * GB] * 4, 1.5 * GB)
    assert r.status == "PASS" and r.details["drifting"] == []


def test_a_figure_with_a_ceiling_or_no_floor_is_not_judged():
    assert not [m for m in result([0.001] * 9, 0.01, floor=None, ceiling=0.02).measurements if m.name == "history_drift"]
    assert not [m for m in result([9 * GB] * 9, 1 * GB, floor=None).measurements if m.name == "history_drift"]


def test_a_profile_without_a_drift_table_says_so():
    r = result([9 * GB] * 5 + [5 * GB] * 4, 5 * GB, rule=None)
    assert r.status == "PASS" and "drift not judged: the profile has no [drift] table" in r.summary


def test_noise_in_this_run_still_dates_the_drift_from_the_first_recent_run_under_the_threshold():
    # This run reads back over the earlier level; the recent median is still 10% under it.
    r = result([9 * GB] * 10 + [9 * GB, 8 * GB, 8 * GB, 8.1 * GB], 9.5 * GB)
    (d,) = r.details["drifting"]
    assert d["since_run"] == 12 and d["recent"] == 8.1 * GB


def test_three_fails_in_a_week_make_a_passing_node_s_action_service():
    week = runs(7, failed={2: ["shm"], 4: ["bandwidth"], 6: ["bandwidth"]}, hours=24)
    r = judge.judge([], [], T0 + timedelta(days=7, hours=1), History(week, []), RULE, "cpu", 3, 7)
    assert r.status == "WARN" and r.action == Action.SERVICE and r.domain == "node"
    assert r.summary == "a lemon: failed 3 times in 7 days: shm, bandwidth, bandwidth"
    assert r.action_source.startswith("a lemon: failed 3 times in 7 days: shm, bandwidth, bandwidth (lemon_fails 3, lemon_days 7)")
    assert next(m for m in r.measurements if m.name == "history_failed").value == 3


def test_fails_outside_the_window_or_too_few_are_no_lemon():
    week = runs(10, failed={1: ["shm"], 6: ["bandwidth"], 8: ["nccl"]}, hours=24)  # the first is 9 days old
    r = judge.judge([], [], T0 + timedelta(days=10), History(week, []), RULE, "cpu", 3, 7)
    assert r.status == "PASS" and r.action == Action.NONE and r.details["failures"] == 2
    # This run's own failure, after runs 9 and 10 passed, is the third.
    r = judge.judge([], ["shm", "nccl"], T0 + timedelta(days=10), History(week, []), RULE, "cpu", 3, 7)
    assert r.action == Action.SERVICE and r.summary.endswith("bandwidth, nccl, shm+nccl")


def test_one_fault_that_stays_is_one_failure_not_one_a_run():
    # The boot gate and every hourly recheck failing on the same setting: one failure, no lemon.
    stays = runs(5, failed={i: ["firmware"] for i in range(1, 6)})
    r = judge.judge([], ["firmware"], T0 + timedelta(hours=6), History(stays, []), RULE, "cpu", 3, 7)
    assert r.action == Action.NONE and r.details["failures"] == 1


def test_the_jobs_fault_and_runs_dated_after_this_one_are_not_the_nodes():
    jobs = runs(6, failed={1: ["shm"], 3: ["shm"], 5: ["shm"]})
    jobs = [r if not r.failed else Run(r.id, r.started_at, r.finished_at, r.verdict, r.level, r.profile, "fix-job", r.failed) for r in jobs]
    assert judge.judge([], [], T0 + timedelta(hours=7), History(jobs, []), RULE, "cpu", 3, 7).details["failures"] == 0
    ahead = runs(6, failed={2: ["shm"], 4: ["shm"], 6: ["shm"]})  # a clock that was a day ahead wrote them
    ahead = [Run(r.id, r.started_at + timedelta(days=1), r.finished_at + timedelta(days=1), r.verdict, r.level, r.profile, r.action, r.failed) for r in ahead]
    assert judge.judge([], [], T0 + timedelta(hours=7), History(ahead, []), RULE, "cpu", 3, 7).details["failures"] == 0


def test_this_runs_own_failure_counts_toward_a_lemon_unless_it_is_the_jobs():
    from conftest import recorded_run

    two = runs(4, failed={1: ["shm"], 3: ["bandwidth"]})
    report = recorded_run(0, failed=["shm"])
    report.finished_at = T0 + timedelta(hours=5)
    assert judge.of_report(report, History(two, []), RULE, 3, 7).action == Action.SERVICE  # the node's third failure
    shm = next(c for c in report.checks if c.check == "shm")
    shm.action, shm.domain, shm.action_source = "fix-job", "job", "in a container: its /dev/shm is what the job was started with"
    assert report.action == Action.FIX_JOB
    r = judge.of_report(report, History(two, []), RULE, 3, 7)
    assert r.action == Action.NONE and r.details["failures"] == 2  # a container's /dev/shm says nothing of the node


def test_a_software_fault_that_recurs_is_no_lemon():
    # A host /dev/shm a job keeps filling (the node's setting: drain, software) fails, passes, fails:
    # each is a drain, none sends the hardware for service.
    soft = runs(6, failed={1: ["shm"], 3: ["shm"], 5: ["shm"]})
    soft = [replace(r, action="drain", domain="software") if r.failed else r for r in soft]
    assert judge.judge([], [], T0 + timedelta(hours=7), History(soft, []), RULE, "cpu", 3, 7).details["failures"] == 0
    hard = [replace(r, domain="node") for r in soft]
    assert judge.judge([], [], T0 + timedelta(hours=7), History(hard, []), RULE, "cpu", 3, 7).action == Action.SERVICE
