import time

import fakes
import psutil
from conftest import make_ctx

from preflight.base.findings import Status
from preflight.pipeline.runner import run_checks


def statuses(outcome):
    return [(r.check, r.status) for r in outcome.results]


def test_checks_run_in_the_given_order():
    order = []
    outcome = run_checks([fakes.Warning_(), fakes.Passing()], make_ctx(), on_start=lambda c: order.append(c.name))
    assert order == ["warning", "passing"]
    assert statuses(outcome) == [("warning", Status.WARN), ("passing", Status.PASS)]


def test_first_failure_skips_the_rest_naming_it():
    outcome = run_checks([fakes.Passing(), fakes.Failing(), fakes.Warning_()], make_ctx())
    assert statuses(outcome) == [("passing", Status.PASS), ("failing", Status.FAIL), ("warning", Status.SKIP)]
    assert outcome.results[2].summary == "skipped: failing failed"


def test_keep_going_runs_everything_after_a_failure():
    outcome = run_checks([fakes.Failing(), fakes.Warning_(), fakes.Passing()], make_ctx(), keep_going=True)
    assert statuses(outcome) == [("failing", Status.FAIL), ("warning", Status.WARN), ("passing", Status.PASS)]


def test_an_error_also_stops_the_run():
    outcome = run_checks([fakes.Raising(), fakes.Passing()], make_ctx())
    assert outcome.results[1].summary == "skipped: raising errored"


def test_requires_not_passed_skips_even_with_keep_going():
    outcome = run_checks([fakes.Failing(), fakes.NeedsFailing()], make_ctx(), keep_going=True)
    assert outcome.results[1].status is Status.SKIP
    assert outcome.results[1].summary == "skipped: requires failing, which failed"


def test_requires_a_check_that_did_not_run_in_this_run_runs():
    # `--only nccl` must still run nccl: the requirement binds only when it ran.
    outcome = run_checks([fakes.NeedsFailing()], make_ctx())
    assert statuses(outcome) == [("needsfailing", Status.PASS)]


def test_applies_reason_is_a_skip():
    outcome = run_checks([fakes.NotApplicable(), fakes.Passing()], make_ctx())
    assert statuses(outcome) == [("notapplicable", Status.SKIP), ("passing", Status.PASS)]
    assert outcome.results[0].summary == "no such hardware here"


def test_exception_becomes_error_with_traceback():
    outcome = run_checks([fakes.Raising()], make_ctx())
    r = outcome.results[0]
    assert r.status is Status.ERROR
    assert "RuntimeError: boom inside the check" in r.summary
    assert "Traceback" in r.details["traceback"] and "boom inside the check" in r.details["traceback"]


def test_wrong_return_type_is_an_error():
    r = run_checks([fakes.WrongReturn()], make_ctx()).results[0]
    assert r.status is Status.ERROR and "str instead of its own Result" in r.summary


def test_timeout_fails_and_kills_the_process_group(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    start = time.monotonic()
    outcome = run_checks([fakes.Hanging(), fakes.Passing()], make_ctx(), timeouts={"hanging": 0.5})
    elapsed = time.monotonic() - start
    hung, after = outcome.results
    assert hung.status is Status.FAIL and "did not finish within 0.5 s" in hung.summary
    assert 0.5 <= hung.duration_seconds < 10 and elapsed < 10
    sleeper = int(pid_file.read_text())
    assert sleeper in hung.details["killed_processes"]
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
    assert after.status is Status.SKIP


def test_children_left_behind_are_killed():
    r = run_checks([fakes.LeavesChild()], make_ctx()).results[0]
    assert r.status is Status.PASS
    assert r.details["killed_processes"] == [r.details["pid"]]
    assert not psutil.pid_exists(r.details["pid"]) or psutil.Process(r.details["pid"]).status() == psutil.STATUS_ZOMBIE


def test_durations_are_recorded():
    r = run_checks([fakes.Passing()], make_ctx()).results[0]
    assert 0 <= r.duration_seconds < 5


def test_sys_exit_inside_a_check_is_an_error_not_an_exit():
    r = run_checks([fakes.Exits()], make_ctx()).results[0]
    assert r.status is Status.ERROR and "SystemExit" in r.summary


def test_details_json_cannot_hold_are_an_error_not_a_lost_report():
    outcome = run_checks([fakes.BadDetails(), fakes.Passing()], make_ctx(), keep_going=True)
    assert outcome.results[0].status is Status.ERROR and "cannot be written as JSON" in outcome.results[0].summary
    assert outcome.results[1].status is Status.PASS


def test_a_grandchild_that_escaped_with_setsid_is_killed_too(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    r = run_checks([fakes.Daemonizes()], make_ctx()).results[0]
    pid = int(pid_file.read_text())
    assert pid in r.details["killed_processes"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_an_endless_plugin_timeout_is_capped():
    class Endless(fakes.Passing):
        timeout_seconds = float("inf")

    assert run_checks([Endless()], make_ctx()).results[0].status is Status.PASS


# --- progress ----------------------------------------------------------------


class _Watching(fakes.Passing):
    """Records what the Context's progress says while it runs."""

    saw: tuple = ()

    def run(self, ctx):
        self.saw = ctx.progress.now()[:2]
        return super().run(ctx)


def test_progress_names_the_running_check_and_ends_before_its_result_is_shown():
    from preflight.base.progress import Progress

    events = []
    ctx = make_ctx()
    ctx.progress = Progress(on_end=lambda: events.append("end"))
    check = _Watching()
    run_checks([check, fakes.Failing(), fakes.Passing()], ctx, on_start=lambda c: events.append(f"start {c.name}"), on_finish=lambda r: events.append(f"finish {r.check}"))
    assert check.saw == ("passing", None)
    # The live line comes down before each result; a skipped check never had one.
    assert events == ["start passing", "end", "finish passing", "start failing", "end", "finish failing", "finish passing"]
    assert ctx.progress.now() == (None, None, 0.0)


def test_progress_ends_when_a_signal_arrives_as_the_check_starts():
    from preflight.base.progress import Progress
    from preflight.base.errors import Interrupted

    ended = []
    ctx = make_ctx()
    ctx.progress = Progress(on_end=lambda: ended.append(True))

    def interrupted(_check):
        raise Interrupted(15)

    outcome = run_checks([fakes.Passing()], ctx, on_start=interrupted)
    assert outcome.interrupted_by == 15 and outcome.results[0].status is Status.ERROR
    assert ended == [True] and ctx.progress.now()[0] is None


# ---- checks that wait for the ranks (Waiting) ---------------------------------------


def _waiting_run(checks, ranks, **kw):
    told = []
    outcome = run_checks(checks, make_ctx(), on_finish=lambda r: told.append(r.check), **kw)
    return outcome, told


def test_the_checks_that_need_no_ranks_run_while_a_check_waits_for_them():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology"), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "shm", "waits: rest"]
    # What a person and the report read keeps the plan's order.
    assert statuses(outcome) == [("waits", Status.PASS), ("topology", Status.PASS), ("shm", Status.PASS)]
    assert told == ["waits", "topology", "shm"]


def test_a_waiting_check_goes_on_as_soon_as_the_ranks_are_up():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology", brings_up=True), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "waits: rest", "shm"]
    assert told == ["waits", "topology", "shm"]


def test_a_check_that_needs_ranks_or_the_waiting_check_waits_for_it():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology"), fakes.WantsRanks(ranks, "nccl"), fakes.Rankless(ranks, "shm")]
    _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "waits: rest", "nccl", "shm"]
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "reads-it", requires=("waits",)), fakes.Rankless(ranks, "shm")]
    _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "waits: rest", "reads-it", "shm"]


def test_a_waiting_check_that_fails_still_stops_what_had_not_run():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, status=Status.FAIL), fakes.Rankless(ranks, "topology"), fakes.WantsRanks(ranks, "nccl")]
    outcome, told = _waiting_run(checks, ranks)
    # topology ran while it waited: a real result, kept; nccl had not, and is skipped naming the failure.
    assert statuses(outcome) == [("waits", Status.FAIL), ("topology", Status.PASS), ("nccl", Status.SKIP)]
    assert outcome.results[2].summary == "skipped: waits failed"
    assert ranks.log == ["waits: first part", "topology", "waits: rest"]


def test_a_failure_while_a_check_waits_resumes_it_and_skips_the_rest():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology", status=Status.FAIL), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "waits: rest"]
    assert statuses(outcome) == [("waits", Status.PASS), ("topology", Status.FAIL), ("shm", Status.SKIP)]
    assert outcome.results[2].summary == "skipped: topology failed"
    # Under --keep-going everything runs, and a failure ahead in the plan is named first.
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, status=Status.FAIL), fakes.Rankless(ranks, "topology", status=Status.FAIL), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks, keep_going=True)
    assert [r.status for r in outcome.results] == [Status.FAIL, Status.FAIL, Status.PASS]


def test_the_rest_of_a_waiting_check_keeps_its_deadline_and_its_errors():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, hang=30), fakes.Rankless(ranks, "shm")]
    started = time.monotonic()
    outcome, _ = _waiting_run(checks, ranks, timeouts={"waits": 1.0})
    assert time.monotonic() - started < 20
    hung = outcome.results[0]
    assert hung.status == Status.FAIL and "did not finish within" in hung.summary
    assert hung.duration_seconds >= 1.0
    ranks = fakes.Ranks()
    outcome, _ = _waiting_run([fakes.WaitsForRanks(ranks, raises=True)], ranks)
    assert outcome.results[0].status == Status.ERROR and "boom in the rest" in outcome.results[0].summary


def test_a_signal_while_a_check_waits_ends_it_as_interrupted():
    from preflight.base.errors import Interrupted

    ranks = fakes.Ranks()

    def on_start(check):
        if check.name == "topology":
            raise Interrupted(15)

    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology"), fakes.Rankless(ranks, "shm")]
    outcome = run_checks(checks, make_ctx(), on_start=on_start)
    assert outcome.interrupted_by == 15
    waits, topology, shm = outcome.results
    # The waiting check's rest never ran: it is interrupted, marked cut short so the last report's result stands in.
    assert waits.status is Status.ERROR and "interrupted by SIGTERM while waiting for the ranks" in waits.summary
    assert waits.details == {"interrupted_by_signal": 15}
    assert topology.status is Status.ERROR and shm.status is Status.SKIP
    assert ranks.log == ["waits: first part"]


def test_a_rank_started_while_a_check_ends_is_never_swept_away_as_its_stray():
    # torchrun starts its ranks while the checks that need no ranks run: one that starts just as
    # the runner lists the launch's processes must not be killed as the check's leftover.
    ctx = make_ctx()
    ctx.worlds = launch = fakes.StartingLaunch()
    try:
        outcome = run_checks([fakes.Passing(), fakes.Passing()], ctx)
        assert [r.status for r in outcome.results] == [Status.PASS, Status.PASS]
        assert all(p.poll() is None for p in launch.ranks), "a rank of the launch was killed"
        assert not any("killed_processes" in r.details for r in outcome.results)
    finally:
        launch.close()


def test_under_fail_fast_a_held_check_behind_a_failure_is_skipped_as_in_its_turn():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, status=Status.FAIL), fakes.Rankless(ranks, "topology"),
              fakes.WaitsForRanks(ranks, name="firmware"), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "firmware: first part", "shm", "waits: rest"]
    assert statuses(outcome) == [("waits", Status.FAIL), ("topology", Status.PASS), ("firmware", Status.SKIP), ("shm", Status.PASS)]
    assert outcome.results[2].summary == "skipped: waits failed" and told == ["waits", "topology", "firmware", "shm"]
    # Under --keep-going its rest runs.
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, status=Status.FAIL), fakes.WaitsForRanks(ranks, name="firmware")]
    outcome, _ = _waiting_run(checks, ranks, keep_going=True)
    assert statuses(outcome) == [("waits", Status.FAIL), ("firmware", Status.PASS)]


def test_a_check_that_does_not_say_it_may_run_beside_the_ranks_runs_in_its_turn():
    # A site's check may start a stage of the launch: it must not run before cuda's CUDA init.
    ranks = fakes.Ranks()
    plugin = fakes.Passing()
    checks = [fakes.WaitsForRanks(ranks), fakes.Rankless(ranks, "topology"), plugin, fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert ranks.log == ["waits: first part", "topology", "waits: rest", "shm"]
    assert told == ["waits", "topology", "passing", "shm"]


def test_a_signal_while_the_runner_asks_a_held_check_ends_it_as_interrupted():
    ranks = fakes.Ranks()
    checks = [fakes.WaitsForRanks(ranks, signal_when_asked=15), fakes.Rankless(ranks, "topology"), fakes.Rankless(ranks, "shm")]
    outcome, told = _waiting_run(checks, ranks)
    assert outcome.interrupted_by == 15
    waits, topology, shm = outcome.results
    assert waits.status is Status.ERROR and waits.details == {"interrupted_by_signal": 15}
    assert topology.status is Status.SKIP and shm.status is Status.SKIP and told == ["waits", "topology", "shm"]


def test_a_signal_while_the_console_shows_a_result_keeps_every_result_and_shows_the_rest():
    from preflight.base.errors import Interrupted

    told, signalled = [], []

    def on_finish(r):
        told.append(r.check)
        if not signalled:
            signalled.append(True)
            raise Interrupted(15)

    outcome = run_checks([fakes.Passing(), fakes.Warning_(), fakes.Failing()], make_ctx(), on_finish=on_finish)
    assert outcome.interrupted_by == 15
    assert statuses(outcome) == [("passing", Status.PASS), ("warning", Status.SKIP), ("failing", Status.SKIP)]
    assert told == ["passing", "warning", "failing"]
