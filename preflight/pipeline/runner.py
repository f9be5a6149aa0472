"""Ordered, fail-fast execution of checks.

Rules, in the order they apply to each check:
1. after the first FAIL or ERROR the rest are SKIPped, unless keep_going;
2. a check whose required check ran in this run and did not pass is SKIPped;
3. ``applies()`` may give a reason to SKIP;
4. ``run()`` has the check's timeout: past it the result is FAIL and every
   process the check started is killed; an exception is ERROR with the
   traceback in details. Nothing a check starts outlives it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from preflight.pipeline.check import Check, Context, Result, Status, Waiting
from preflight.base.errors import Interrupted, signal_name
from preflight.base.host import become_subreaper, descendant_processes, kill_processes


MAX_TIMEOUT = 86400.0  # a plugin's own timeout_seconds is capped like a profile's


@dataclass
class Outcome:
    results: list[Result] = field(default_factory=list)
    interrupted_by: int | None = None  # the signal that stopped the run


CUT_SHORT = "interrupted_by_signal"


def cut_short(signum: int) -> dict[str, int]:
    """The mark (in details) of a result the interruption made: the check it stopped, and
    those it skipped. The report keeps the previous run's result in its place (report.carry_forward)."""
    return {CUT_SHORT: signum}


Hook = Callable[[Check], None]
FinishHook = Callable[[Result], None]


def _noop(*_: object) -> None:
    pass


def _unmet_requirement(check: Check, done: dict[str, Result]) -> str | None:
    for req in check.requires:
        r = done.get(req)
        if r is not None and r.status not in (Status.PASS, Status.WARN):
            verb = {Status.SKIP: "was skipped", Status.ERROR: "errored"}.get(r.status, "failed")
            return f"requires {req}, which {verb}"
    return None


def _timed_run(check: Check, ctx: Context, timeout: float, body: Callable[[], Result | Waiting] | None = None, whole: float | None = None) -> Result | Waiting:
    """run() (or ``body``, a waiting check's rest, with what is left of the ``whole`` timeout) in a
    worker thread so a hung check cannot hang the agent."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            if body is not None:
                box["result"] = body()
                return
            reason = check.applies(ctx)
            box["result"] = check.result(Status.SKIP, reason) if reason else check.run(ctx)
        except BaseException as e:  # SystemExit from a plugin too: only this thread ends
            box["error"] = e
            box["traceback"] = traceback.format_exc()

    thread = threading.Thread(target=target, name=f"check-{check.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        timeout = whole or timeout
        return check.result(
            Status.FAIL,
            f"did not finish within {timeout:g} s",
            cause=f"the {check.name} check hung past its {timeout:g} s deadline; on a GPU node this is "
            "usually a wedged driver or a hung collective",
            remedy="look at dmesg for Xid errors and at the processes the check started; "
            "raise the timeout in the profile only if the node is known to be slow to answer",
        )
    if "error" in box:
        err = box["error"]
        return check.result(
            Status.ERROR,
            f"the check raised {type(err).__name__}: {err}",
            cause="a bug or an unexpected machine state inside the check, not a verdict on the node",
            remedy="report it with the traceback in this report's details",
            details={"traceback": box["traceback"]},
        )
    result = box.get("result")
    if isinstance(result, Waiting) and body is None:
        return result
    if not isinstance(result, Result) or result.check != check.name:
        return check.result(
            Status.ERROR,
            f"the check returned {type(result).__name__} instead of its own Result",
            cause="a bug in the check",
        )
    try:
        result.model_dump_json()  # one bad value must not cost the whole report
    except ValueError as e:
        return check.result(
            Status.ERROR,
            f"the check's result cannot be written as JSON: {str(e).splitlines()[0]}",
            cause="a bug in the check",
            remedy="report it; the check's own summary was: " + result.summary,
        )
    return result


def run_check(check: Check, ctx: Context, timeout: float, body: Callable[[], Result | Waiting] | None = None, whole: float | None = None) -> Result | Waiting:
    before = descendant_processes()
    started = time.monotonic()
    ctx.deadline = started + timeout
    try:
        result = _timed_run(check, ctx, timeout, body, whole)
    finally:
        # Runs on interrupt too: whatever the check started dies with it, but for the run's
        # launch of ranks waiting for the next check's stage (one still busy in a stage dies).
        # The processes are listed before the launch's: a rank torchrun starts in between (it
        # starts them while the checks that need no ranks run) is in neither, never a stray.
        now = descendant_processes()
        spare = ctx.worlds.after_check() if ctx.worlds is not None else set()
        strays = kill_processes(p for p in now - before if p.pid not in spare)  # the processes seen: never a pid reused since
    if isinstance(result, Waiting):
        return result
    if strays:
        result.details["killed_processes"] = strays
    result.duration_seconds = round(time.monotonic() - started, 6)
    return result


@dataclass
class _Held:
    """A check that returned ``Waiting``: where it stands in the plan, and what it has spent."""

    index: int
    check: Check
    waiting: Waiting
    timeout: float  # the check's whole timeout
    seconds: float  # spent in its first part


def _before(before: Callable[[Check], Result | None], check: Check, outcome: Outcome) -> Result | None:
    started = time.monotonic()
    try:
        result = before(check)
    except Interrupted as sig:
        outcome.interrupted_by = sig.signum
        result = check.result(Status.ERROR, f"interrupted by {signal_name(sig.signum)} while meeting the group", cause="preflight was stopped (SIGTERM or Ctrl-C)",
                              details=cut_short(sig.signum))
    if result is not None:
        result.duration_seconds = round(time.monotonic() - started, 6)
    return result


def _beside(check: Check, ctx: Context, held: list[_Held]) -> bool:
    """Whether ``check`` may run while ``held`` wait for the ranks: it says it may (``beside_ranks``:
    it needs no ranks and starts no stage), and it needs none of them."""
    return check.beside_ranks and not set(check.requires) & {h.check.name for h in held}


def _ready(h: _Held) -> bool:
    try:
        return bool(h.waiting.ready())
    except Exception:  # the rest runs now and meets whatever broke there, under its deadline
        return True


def _interrupted(check: Check, signum: int, what: str, seconds: float) -> Result:
    return check.result(
        Status.ERROR,
        f"interrupted by {signal_name(signum)} while {what}",
        cause="preflight was stopped (SIGTERM from systemd's TimeoutStartSec, or Ctrl-C)",
        remedy="let the run finish; raise TimeoutStartSec if the unit's budget is too small",
        duration_seconds=round(seconds, 6),
        details=cut_short(signum),
    )


def run_checks(
    checks: list[Check],
    ctx: Context,
    *,
    keep_going: bool = False,
    timeouts: dict[str, float] | None = None,
    on_start: Hook = _noop,
    on_finish: FinishHook = _noop,
    before: Callable[[Check], Result | None] = lambda _: None,
    interrupted_by: int | None = None,
) -> Outcome:
    """``before`` runs ahead of each check, outside its timeout (a group check's
    meeting with its peers); a Result it returns stands for the check's own.
    ``interrupted_by``: a signal that stopped the run before its first check (every check
    is then skipped, cut short, so the last report's results stand in).

    Every check's ``begin`` runs first (its early reading). A check whose rest waits for the
    ranks (it returned ``Waiting``) is held, and the checks behind it that say they may run
    beside the ranks (``beside_ranks``) and do not require it run while the ranks import
    torch; it goes on as soon as it is ready, before the first check that cannot run beside
    it, once a check has failed (so what is skipped names the first failure in the plan's
    order), or at the end; under fail-fast a held check behind a failure is skipped, as it
    would have been in its turn. A check that ran meanwhile keeps its result even where the
    held one then fails: it was measured on this node. Results keep the plan's order, and
    reach ``on_finish`` in it. A signal between checks ends every held check as interrupted."""
    become_subreaper()
    outcome = Outcome(interrupted_by=interrupted_by)
    results: list[Result | None] = [None] * len(checks)
    held: list[_Held] = []
    told = 0

    def settle(i: int, result: Result) -> None:
        results[i] = result
        ctx.results[checks[i].name] = result
        tell()

    def tell() -> None:
        """Give on_finish every result it has not had, in the plan's order, up to the first not yet known."""
        nonlocal told
        while told < len(checks) and results[told] is not None:
            told += 1
            on_finish(results[told - 1])  # type: ignore[arg-type]

    def first_failure() -> tuple[int, Result] | None:
        return next(((k, r) for k, r in enumerate(results) if r is not None and r.status in (Status.FAIL, Status.ERROR)), None)

    def resume(h: _Held) -> None:
        started = time.monotonic()
        if outcome.interrupted_by is not None:
            settle(h.index, _interrupted(h.check, outcome.interrupted_by, h.waiting.doing, h.seconds))
            return
        failed = first_failure()
        if failed is not None and failed[0] < h.index and not keep_going:
            # Fail-fast, as if it had run in its turn: a check before it failed, so its rest never runs.
            verb = "errored" if failed[1].status is Status.ERROR else "failed"
            settle(h.index, h.check.result(Status.SKIP, f"skipped: {failed[1].check} {verb}", duration_seconds=round(h.seconds, 6)))
            return
        try:
            ctx.progress.begin(h.check.name)
            on_start(h.check)
            ctx.progress.stage(h.waiting.doing)
            result = run_check(h.check, ctx, max(1.0, h.timeout - h.seconds), body=h.waiting.rest, whole=h.timeout)
            assert isinstance(result, Result)  # _timed_run turns a second Waiting into an ERROR
        except Interrupted as sig:
            outcome.interrupted_by = sig.signum
            result = _interrupted(h.check, sig.signum, "running", 0.0)
        finally:
            ctx.progress.end()
        result.duration_seconds = round(h.seconds + time.monotonic() - started, 6)
        settle(h.index, result)

    def go_on(everyone: bool) -> None:
        """Resume the held checks that can go on (all of them, with ``everyone``), in the plan's
        order. A signal anywhere here leaves each one either settled or still held."""
        for h in list(held):
            if results[h.index] is None and (everyone or _ready(h)):
                resume(h)
            if results[h.index] is not None:
                held.remove(h)

    for check in checks if interrupted_by is None else []:  # first readings, taken as the run begins (rdma's counters)
        try:
            check.begin(ctx)
        except Interrupted as sig:
            outcome.interrupted_by = sig.signum
            break
        except Exception:  # no early reading: the check reads at its turn, as it would without one
            ctx.readings.pop(check.name, None)

    for i, check in enumerate(checks):
        try:
            if held:
                go_on(everyone=outcome.interrupted_by is not None or first_failure() is not None or not _beside(check, ctx, held))
        except Interrupted as sig:  # between checks: every held one ends as interrupted below
            outcome.interrupted_by = sig.signum
        failed = first_failure()
        if outcome.interrupted_by is not None:
            result = check.result(Status.SKIP, f"skipped: the run was interrupted by {signal_name(outcome.interrupted_by)}", details=cut_short(outcome.interrupted_by))
        elif failed is not None and not keep_going:
            verb = "errored" if failed[1].status is Status.ERROR else "failed"
            result = check.result(Status.SKIP, f"skipped: {failed[1].check} {verb}")
        elif reason := _unmet_requirement(check, ctx.results):
            result = check.result(Status.SKIP, f"skipped: {reason}")
        elif (met := _before(before, check, outcome)) is not None:
            result = met
        else:
            timeout = min((timeouts or {}).get(check.name, check.timeout_seconds), MAX_TIMEOUT)
            started = time.monotonic()
            ctx.progress.begin(check.name)
            try:
                on_start(check)
                ran = run_check(check, ctx, timeout)
            except Interrupted as sig:
                outcome.interrupted_by = sig.signum
                ran = _interrupted(check, sig.signum, "running", time.monotonic() - started)
            finally:
                # On every way out (an exception too): the live line is taken down before anything else is printed.
                ctx.progress.end()
            if isinstance(ran, Waiting):
                held.append(_Held(i, check, ran, timeout, time.monotonic() - started))
                continue
            result = ran
        try:
            settle(i, result)
        except Interrupted as sig:  # while the console showed it: the result stands, the rest is skipped
            outcome.interrupted_by = sig.signum
    while held or (told < len(checks) and results[told] is not None):
        try:
            go_on(everyone=True)
            tell()
        except Interrupted as sig:
            outcome.interrupted_by = sig.signum
    outcome.results = [r for r in results if r is not None]
    return outcome
