"""Figures and their floors: what every measuring check (bandwidth, train)
shares. A Figure is one judged number with where it was measured; the
judge compares each with its floor or ceiling, WARNs within the profile's
margin and FAILs beyond, naming every GPU, pair or rank that missed.
"""

from __future__ import annotations

import math
from collections import defaultdict

from pydantic import BaseModel, Field

from preflight.base.findings import Finding, Measurement, Status
from preflight.pipeline.profiles import ResolvedFloor
from preflight.base.units import fmt_bytes, fmt_value

FAIL, WARN = Status.FAIL, Status.WARN
SECONDS = "seconds"


class Figure(BaseModel):
    """One judged number: its name is its floor's and its metric's."""

    name: str
    unit: str
    value: float
    where: str  # "GPU 3", "GPU 0 -> GPU 5", "rank 1", "8 ranks"
    floor: str = ""  # the floor it is judged against, where that is not ``name`` (the p99 latency)

    @property
    def key(self) -> str:
        return self.floor or self.name
    labels: dict[str, str] = Field(default_factory=dict)
    bytes: int = 0
    repeats: int = 0
    spread: float | None = None  # (max - min) / median of the repeats
    rank: int | None = None


def median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile: p99 of 200 samples is the 198th smallest, a real sample."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def spread(xs: list[float]) -> float | None:
    return (max(xs) - min(xs)) / median(xs) if xs and median(xs) > 0 else None


def judge_floors(figs: list[Figure], floors: dict[str, ResolvedFloor], margin: float, words: dict[str, str], reasons: dict[str, str], rerun: str) -> list[Finding]:
    """Under a floor (over a ceiling): FAIL; within ``margin`` of it: WARN. One
    finding per figure name, naming every GPU, pair or direction that missed."""
    out = []
    by_name: dict[str, list[Figure]] = defaultdict(list)
    for fig in figs:
        by_name[fig.key].append(fig)
    for name, group in by_name.items():
        floor = floors.get(name)
        if floor is None:
            continue
        below = [g for g in group if beyond(g.value, floor, 0.0)]
        marginal = [g for g in group if g not in below and beyond(g.value, floor, margin)]
        what = words.get(name, name)
        bound = "ceiling" if floor.bound == "max" else "floor"
        limit = fmt_value(floor.value, floor.unit)
        if below:
            worst_fig = max(below, key=lambda g: g.value) if floor.bound == "max" else min(below, key=lambda g: g.value)
            head = f"{what} {'over' if floor.bound == 'max' else 'below'} {bound} on {worst_fig.where} ({fmt_value(worst_fig.value, worst_fig.unit)}, {bound} {limit})"
            shown = "; ".join(f"{g.where}: {fmt_value(g.value, g.unit)}" for g in sorted(below, key=lambda g: g.value, reverse=floor.bound == "max")[:8])
            more = f"; and {len(below) - 8} more" if len(below) > 8 else ""
            cause = f"{what} {'over' if floor.bound == 'max' else 'under'} the {limit} {bound} ({floor.source}; {floor.origin}) on {len(below)} of {len(group)}: {shown}{more}"
            remedy = f"likely causes: {reasons.get(name, 'see the figure in details.figures')}; drain the node until it is fixed, then rerun `{rerun}`"
            out.append(Finding(FAIL, head, cause, remedy))
        if marginal:
            g = (max if floor.bound == "max" else min)(marginal, key=lambda m: m.value)
            cause = f"{what} within {margin:.0%} of its {limit} {bound} on {len(marginal)} of {len(group)}: " + "; ".join(f"{m.where}: {fmt_value(m.value, m.unit)}" for m in marginal[:8])
            out.append(Finding(WARN, f"{what} marginal on {g.where} ({fmt_value(g.value, g.unit)}, {bound} {limit})", cause,
                               f"the node is near its {bound}: watch it, and check {reasons.get(name, 'the figure').split(', ')[0]}"))
    return out


def beyond(value: float, floor: ResolvedFloor, margin: float) -> bool:
    """Under the floor (over the ceiling), or within ``margin`` of it."""
    if floor.bound == "max":
        return value > floor.value * (1 - margin)
    return value < floor.value * (1 + margin)


def measurements(figs: list[Figure], floors: dict[str, ResolvedFloor]) -> list[Measurement]:
    out = []
    for g in figs:
        floor = floors.get(g.key)
        kw = {}
        if floor is not None:
            kw = {"ceiling": floor.value} if floor.bound == "max" else {"floor": floor.value}
        out.append(Measurement(name=g.name, unit=g.unit, value=g.value, labels=g.labels, **kw))
    return out


def lines(figs: list[Figure], floors: dict[str, ResolvedFloor], words: dict[str, str]) -> list[str]:
    """One line per figure name: the weakest, the median, the bound, the worst spread."""
    by_name: dict[str, list[Figure]] = defaultdict(list)
    for g in figs:
        by_name[g.key].append(g)
    out = []
    for name, group in by_name.items():
        floor = floors.get(name)
        high = floor is not None and floor.bound == "max" or group[0].unit == SECONDS
        weakest = max(group, key=lambda g: g.value) if high else min(group, key=lambda g: g.value)
        text = f"{words.get(name, name):<42} {fmt_value(weakest.value, weakest.unit)}"
        if len(group) > 1:
            text += f" ({'worst' if high else 'min'} of {len(group)}: {weakest.where}; median {fmt_value(median([g.value for g in group]), weakest.unit)})"
        elif weakest.bytes:
            text += f" ({fmt_bytes(weakest.bytes)})"
        if floor is not None:
            text += f"  {'ceiling' if floor.bound == 'max' else 'floor'} {fmt_value(floor.value, floor.unit)}"
        else:
            text += "  no floor"
        spreads = [g.spread for g in group if g.spread is not None]
        if spreads:
            text += f"  spread {max(spreads):.1%}"
        out.append(text)
    return out
