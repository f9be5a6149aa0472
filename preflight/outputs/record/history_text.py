"""`preflight history` for a person and for a machine: the verdict timeline and each
figure's trend, from outputs/record/history.py.

On a terminal a figure's trend is a sparkline over the runs shown (lowest to highest
of its own values, so a slide of a few percent shows), with its first, last, floor
and the run it peaked in; in JSON every value with its run.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from preflight.base.errors import UsageError
from preflight.base.units import fmt_value

from preflight.outputs.record.history import History, Series

BARS = "▁▂▃▄▅▆▇█"
_SPAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``7d``, ``24h``, ``90m`` (ago), or a date or time in ISO 8601 (UTC unless it says)."""
    now = now or datetime.now(timezone.utc)
    if m := _SPAN.match(text.strip().lower()):
        try:
            return now - timedelta(seconds=float(m.group(1)) * _SECONDS[m.group(2)])
        except OverflowError:  # before year 1: the whole history is asked for, in words a person gives
            raise UsageError(f"--since {text!r}: further back than a date can go; give a span of years at most, e.g. 3650d") from None
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since {text!r}: give a span ago (7d, 24h, 90m) or a date or time (2026-11-20, 2026-11-20T08:00)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    if high <= low:
        return BARS[3] * len(values)
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / (high - low) * len(BARS)))] for v in values)


def _name(s: Series) -> str:
    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
    return f"{s.check} {s.name}" + (f"{{{labels}}}" if labels else "")


def text(h: History, db: str, width: int = 60) -> list[str]:
    """The timeline (one line a run, oldest first) and a sparkline a figure."""
    if not h.runs:
        return [f"no runs in {db} for what was asked"]
    out = [f"{len(h.runs)} run(s) in {db}, {h.runs[0].finished_at:%Y-%m-%d %H:%M} to {h.runs[-1].finished_at:%Y-%m-%d %H:%M} UTC:"]
    for r in h.runs:
        failed = f"  failed: {', '.join(r.failed)}" if r.failed else ""
        out.append(f"  #{r.id:<5} {r.finished_at:%Y-%m-%d %H:%M:%S}  {r.verdict.upper():5}  {r.level or '-':8} {r.profile or '-':14} action {r.action or '-'}{failed}")
    if h.series:
        out.append(f"figures ({len(h.series)}), oldest to newest, each scaled to its own range:")
    for s in h.series:
        values = [v for _, v in s.points][-width:]
        bound = f", floor {fmt_value(s.floor, s.unit)}" if s.floor is not None else (f", ceiling {fmt_value(s.ceiling, s.unit)}" if s.ceiling is not None else "")
        out.append(f"  {_name(s)}")
        out.append(f"    {sparkline(values)}  {fmt_value(values[0], s.unit)} -> {fmt_value(values[-1], s.unit)} "
                   f"(min {fmt_value(min(values), s.unit)}, max {fmt_value(max(values), s.unit)}{bound}; {len(values)} run(s))")
    return out


def as_json(h: History, db: str) -> str:
    return json.dumps({
        "history": db,
        "runs": [{"id": r.id, "started_at": r.started_at.isoformat(), "finished_at": r.finished_at.isoformat(), "verdict": r.verdict,
                  "level": r.level, "profile": r.profile, "action": r.action, "domain": r.domain, "failed": r.failed, "checks": r.statuses} for r in h.runs],
        "figures": [{"check": s.check, "name": s.name, "labels": s.labels, "unit": s.unit, "floor": s.floor, "ceiling": s.ceiling,
                     "values": [{"run": run_id, "value": v} for run_id, v in s.points]} for s in h.series],
    }, indent=2) + "\n"

