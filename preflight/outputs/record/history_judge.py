"""The node against its own past: drift and lemons, judged from its history.

Each run says PASS of a figure sliding 2% a week and of a node that fails on
Monday, passes on Tuesday and fails on Thursday. So a run with a history
(outputs/record/history.py) gets one more result, check ``history``, judged here from
the runs before it and this run's own figures, before its report is written:

- **Drift**: a figure whose median over the last ``recent`` runs is more than
  ``fraction`` under its median over up to ``earlier`` runs before them (at least
  ``earlier_min``), while this run still reads it at or above its floor, WARNs
  "drifting", naming the figure, both levels and the run it started in. Only
  figures with a floor (higher is better) are judged: a ceiling's figures
  (latency, shortfalls) sit near zero, where a ratio says nothing. The
  thresholds are the profile's ``[drift]`` table, cited with its source. The
  drift started with the first run of the stretch, up to this one, that read
  under the earlier level; where this run itself reads over it (noise), with the
  first recent run under the threshold.
- **Lemons**: ``fails`` runs that failed a check of their own within ``days``
  make the node's action ``service`` (a WARN: this run's own verdict stands).

The result's measurements are the metrics: ``history_failed_runs`` in the
window, and ``history_drift_ratio`` (recent over earlier level) per judged figure.
Pure: no file, no clock but the one given.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from preflight.base.actions import Action, Domain, Next, highest
from preflight.base.findings import Measurement, Status
from preflight.base.units import fmt_value as human
from preflight.outputs.record.history import CHECK, History, Run, Series, checks_action, figures_of, failed_of
from preflight.pipeline.check import Result
from preflight.pipeline.expectations import DriftExpect

THIS_RUN = 0  # this run's id among the points: it is not in the database yet


@dataclass(frozen=True)
class Drifting:
    series: Series
    recent: float  # the median of the recent runs
    earlier: float  # the median of the runs before them
    since: int  # the run id it started with (THIS_RUN: this run)

    @property
    def ratio(self) -> float:
        return self.recent / self.earlier


def figure_name(s: Series) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
    return f"{s.check} {s.name}" + (f"{{{labels}}}" if labels else "")


def drift(s: Series, expect: DriftExpect) -> tuple[float | None, Drifting | None]:
    """The ratio of ``s``'s recent level to its earlier one (None: too few runs, no floor,
    or no earlier level), and the drift where it is one."""
    if s.floor is None or s.ceiling is not None or len(s.points) < expect.recent + expect.earlier_min:
        return None, None
    values = [v for _, v in s.points]
    recent = values[-expect.recent:]
    earlier = values[-expect.recent - expect.earlier:-expect.recent]
    level, now = statistics.median(earlier), statistics.median(recent)
    if level <= 0:
        return None, None
    ratio = now / level
    if ratio >= 1 - expect.fraction or values[-1] < s.floor:
        return ratio, None  # not sliding, or under its floor: the check's own FAIL says so
    threshold = level * (1 - expect.fraction)
    start = len(values)
    while start > 0 and values[start - 1] < level:
        start -= 1
    if start == len(values):  # this run read over the earlier level: the first recent run under the threshold
        start = next(i for i in range(len(values) - expect.recent, len(values)) if values[i] < threshold)
    return ratio, Drifting(s, now, level, s.points[start][0])


def with_this_run(past: History, report_figures: list[tuple[str, str, str, str, float | None, float | None, float]]) -> list[Series]:
    """The past's series with this run's figures added as the newest points (THIS_RUN)."""
    by_key = {s.key: s for s in past.series}
    out: dict[tuple[str, str, str, str], Series] = {}
    for check, name, labels, unit, floor, ceiling, value in report_figures:
        key = (check, name, labels, unit)
        old = by_key.get(key)
        s = Series(check, name, json.loads(labels), unit, floor, ceiling, [*(old.points if old else []), (THIS_RUN, value)])
        out[key] = s
    return list(out.values())


def lemon(runs: list[Run], this_failed: list[str], finished: datetime, fails: int, days: float) -> tuple[int, str | None]:
    """How many times within ``days`` of ``finished`` the node began to fail a check of its own
    (this run included), and the lemon's words where that is ``fails`` or more.

    A failure counts where the run before it passed: a lemon fails, passes and fails again.
    One fault that stays (the gate, then every hourly recheck, failing on it) is one failure,
    not one a run, or a single bad setting would send healthy hardware to service within hours.
    Only a failure in the node's own domain counts: one that is the job's (fix-job) says
    nothing of the node, and a software one (a driver, a setting: a host /dev/shm a job filled)
    recurring is a drain each time, never hardware to send for service. Runs dated after this
    one (a clock that was ahead) are not counted."""
    since = finished - timedelta(days=days)
    ordered = sorted((r for r in runs if r.finished_at <= finished), key=lambda r: r.finished_at)
    marks = [(r.finished_at, r.failed if _the_nodes(r.action, r.domain) else []) for r in ordered]
    marks.append((finished, this_failed))
    failed, before = [], False
    for at, checks in marks:
        if checks and not before and at >= since:
            failed.append(checks)
        before = bool(checks)
    if len(failed) < fails:
        return len(failed), None
    return len(failed), f"failed {len(failed)} times in {days:g} days: " + ", ".join("+".join(f) for f in failed)


def _the_nodes(action: str | None, domain: str | None) -> bool:
    """Whether a run's failures (its checks' action and domain) say something of the hardware."""
    return action != "fix-job" and domain in (None, "node")


def judge(report_checks_figures: list[tuple[str, str, str, str, float | None, float | None, float]], this_failed: list[str],
          finished: datetime, past: History, expect: DriftExpect | None, profile: str, fails: int, days: float) -> Result:
    """The ``history`` result of a run that measured ``report_checks_figures`` and failed
    ``this_failed``, against ``past`` (the runs before it)."""
    count, lemon_words = lemon(past.runs, this_failed, finished, fails, days)
    measurements = [Measurement(name="history_failed", unit="runs", value=count, labels={"days": f"{days:g}"})]
    drifting: list[Drifting] = []
    if expect is not None:
        for s in with_this_run(past, report_checks_figures):
            ratio, d = drift(s, expect)
            if ratio is not None:
                measurements.append(Measurement(name="history_drift", unit="ratio", value=ratio,
                                                labels={**s.labels, "check": s.check, "figure": s.name}))
            if d is not None:
                drifting.append(d)
    when = {r.id: r.finished_at for r in past.runs}
    started = lambda d: "this run" if d.since == THIS_RUN else f"run {d.since} of {when[d.since].isoformat(timespec='seconds')}"  # noqa: E731
    lines = [f"{figure_name(d.series)} drifting: {human(d.recent, d.series.unit)} over the last {expect.recent} runs, "  # type: ignore[union-attr]
             f"{100 * (1 - d.ratio):.1f}% under its earlier {human(d.earlier, d.series.unit)}, since {started(d)}; "
             f"floor {human(d.series.floor or 0.0, d.series.unit)}" for d in drifting]
    nexts = [Next(Action.WATCH, Domain.NODE, f"drift past {expect.fraction:.0%}, profile {profile} [drift]: {expect.source}")] if drifting else []  # type: ignore[union-attr]
    if lemon_words:
        nexts.append(Next(Action.SERVICE, Domain.NODE, f"a lemon: {lemon_words} (lemon_fails {fails}, lemon_days {days:g})"))
    details = {"runs": len(past.runs) + 1, "failures": count, "lemon": lemon_words,
               "drift": None if expect is None else {"recent": expect.recent, "earlier": expect.earlier, "earlier_min": expect.earlier_min,
                                                     "fraction": expect.fraction, "source": f"profile {profile} [drift]: {expect.source}"},
               "drifting": [{"figure": d.series.name, "check": d.series.check, "labels": d.series.labels, "unit": d.series.unit,
                             "recent": d.recent, "earlier": d.earlier, "ratio": d.ratio, "floor": d.series.floor,
                             "since_run": d.since or None, "since": when[d.since].isoformat() if d.since else None} for d in drifting]}
    if not nexts:
        judged = "drift not judged: the profile has no [drift] table" if expect is None else \
            f"no figure drifting (the last {expect.recent} runs against up to {expect.earlier} before, {expect.fraction:.0%})"
        return Result(check=CHECK, status=Status.PASS, measurements=measurements, details=details,
                      summary=f"{len(past.runs) + 1} run(s) in the history, {count} failed in {days:g} days; {judged}")
    best = highest(nexts)
    assert best is not None
    summary = "; ".join(filter(None, [lemon_words and f"a lemon: {lemon_words}", lines[0] if lines else None]))
    cause = " ".join(filter(None, [
        lemon_words and f"The node {lemon_words} (lemon_fails {fails} within lemon_days {days:g}): a node that fails again and again between passes has a fault no single run pins down.",
        drifting and f"{len(drifting)} figure(s) slid more than {expect.fraction:.0%} under their own earlier level while still above the floor "  # type: ignore[union-attr]
                     f"(profile {profile} [drift]: {expect.source})."]))  # type: ignore[union-attr]
    remedy = " ".join(filter(None, [
        lemon_words and "Take the node out for service (hardware: replace or RMA the part its failing checks name); `preflight history` shows each run.",
        drifting and "Watch the figure (`preflight history --figure NAME`); look for what changed when it started (a driver, firmware, a cooling fault, a throttling reason)."]))
    return Result(check=CHECK, status=Status.WARN, summary=summary, cause=cause, remedy=remedy, measurements=measurements,
                  details=details, lines=lines, action=best.action, domain=best.domain, action_source=best.source)


def of_report(report, past: History, expect: DriftExpect | None, fails: int, days: float) -> Result:  # noqa: ANN001
    """``judge`` for a Report not yet written: its failures count as in ``lemon``, by what its
    checks asked."""
    asked, _ = checks_action(report)
    failed = failed_of(report) if _the_nodes(str(asked.action), str(asked.domain)) else []
    return judge(figures_of(report), failed, report.finished_at, past, expect, report.profile or "?", fails, days)
