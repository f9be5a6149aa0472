"""Outliers inside one node: a GPU, pair or rank whose figure is worse than the
node's own median by more than the profile's tolerance.

An absolute floor passes a GPU 15% slower than its seven peers when the floor
sits lower than that; the node's median needs no calibration and works on a
model with no cited floor (DCGM 4.5 judges clocks and power against the node's
mean the same way). The median, not the mean: one bad GPU must not drag the
reference towards itself. Two members still tell the slower one: it sits as
far below their median as the other sits above, and only the worse side counts.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from preflight.base.findings import Finding, Measurement, Status
from preflight.base.units import fmt_value
from preflight.checkkit import figures as figs_mod
from preflight.checkkit.figures import Figure

if TYPE_CHECKING:
    from preflight.pipeline.expectations import OutlierExpect


class Band(Protocol):
    """How far from the median is odd (preflight.pipeline.profiles.OutlierBand)."""

    warn: float
    fail: float


@dataclass(frozen=True)
class Outlier:
    where: str  # "GPU 3", "GPU 0 -> GPU 5", "rank 1"
    value: float
    median: float  # of every member's figure, this one's included
    off: float  # how much worse than the median, as a fraction of it: 0.15 is 15% worse
    status: Status  # WARN past band.warn, FAIL past band.fail


def worse_by(value: float, median: float, higher_is_better: bool) -> float:
    """How much worse ``value`` is than ``median``, as a fraction of the median (negative: better)."""
    return (1 - value / median) if higher_is_better else (value / median - 1)


def find(values: dict[str, float], higher_is_better: bool, band: Band) -> list[Outlier]:
    """Every member worse than the node's median by more than ``band.warn``, worst first.
    Fewer than two members, or a median that is not positive, has no reference: none."""
    if len(values) < 2:
        return []
    median = statistics.median(values.values())
    if not median > 0:
        return []
    found = []
    for where, value in values.items():
        off = worse_by(value, median, higher_is_better)
        if off > band.fail:
            found.append(Outlier(where, value, median, off, Status.FAIL))
        elif off > band.warn:
            found.append(Outlier(where, value, median, off, Status.WARN))
    return sorted(found, key=lambda o: o.off, reverse=True)


# ---- the measuring checks' figures (preflight.checkkit.figures) against their node's median ----


def judge(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], words: dict[str, str], reasons: dict[str, str], rerun: str,
          cohort: Callable[[Figure], str | None] | None = None) -> list[Finding]:
    """Each figure named in ``keys`` (one per GPU, pair or rank) against the median of its
    peers: one finding per figure name and status, naming every member past the band,
    worst first. ``cohort`` splits a name's members into groups judged apart (P2P pairs by
    their link: NVLink pairs are not held to PCIe pairs' median); None leaves a member out.
    ``expect`` None: the profile asks for no such judgement."""
    if expect is None:
        return []
    out = []
    for key, groups in _groups(figs, keys, cohort).items():
        band = expect.band(key)
        what = words.get(key, key)
        found = [(o, g, _among(c, len(group)) if len(groups) > 1 else "") for c, group in groups for o, g in _found(group, band)]
        found.sort(key=lambda ogc: ogc[0].off, reverse=True)
        for status in (Status.FAIL, Status.WARN):
            hit = [(o, g, among) for o, g, among in found if o.status == status]
            if not hit:
                continue
            o, g, _ = hit[0]
            limit = band.fail if status == Status.FAIL else band.warn
            head = f"{g.where} {what} {_text(o, g)}"
            shown = "; ".join(f"{g.where}: {_text(o, g)}{among}{figs_mod.unsure_text(g)}" for o, g, among in hit[:8])
            more = f"; and {len(hit) - 8} more" if len(hit) > 8 else ""
            of = sum(len(group) for _, group in groups)
            cause = (f"{what} more than {limit:.0%} worse than the median of the node's own {of} figures on {len(hit)} of them "
                     f"(WARN past {band.warn:.0%}, FAIL past {band.fail:.0%}: {band.source}): {shown}{more}. "
                     "Identical parts should measure alike, so this one is held back even where it clears the absolute floor")
            reason = reasons.get(key, "see the figure in details.figures")
            if status == Status.FAIL:
                remedy = f"likely causes on that one: {reason}; drain the node until it measures like its peers, then rerun `{rerun}`"
            else:
                remedy = f"watch it: rerun `{rerun}`; if it stays behind its peers, check {reason.split(', ')[0]}"
            out.append(Finding(status, head, cause, remedy))
    return out


def measurements(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], cohort: Callable[[Figure], str | None] | None = None) -> list[Measurement]:
    """Each judged member's shortfall against its median, as a fraction (negative: better),
    with the figure's labels and the FAIL band as its ceiling:
    ``preflight_<figure>_median_shortfall_ratio > preflight_<figure>_median_shortfall_ceiling_ratio``."""
    if expect is None:
        return []
    out = []
    for key, groups in _groups(figs, keys, cohort).items():
        band = expect.band(key)
        for _, group in groups:
            if len(group) < 2:
                continue
            med = statistics.median(g.value for g in group)
            if not med > 0:
                continue
            for g in group:
                off = worse_by(g.value, med, _higher(g))
                out.append(Measurement(name=f"{g.name}_median_shortfall", unit="ratio", value=round(off, 6), labels=g.labels, ceiling=band.fail))
    return out


def _higher(g: Figure) -> bool:
    return g.unit != figs_mod.SECONDS  # a rate: more is better; a time: less is


def _groups(figs: list[Figure], keys: tuple[str, ...], cohort) -> dict[str, list[tuple[str, list[Figure]]]]:
    """Figure name -> its (cohort, members) groups, each judged against its own median."""
    by: dict[tuple[str, str], list[Figure]] = defaultdict(list)
    for g in figs:
        if g.key in keys:
            c = cohort(g) if cohort else ""
            if c is not None:
                by[(g.key, c)].append(g)
    out: dict[str, list[tuple[str, list[Figure]]]] = defaultdict(list)
    for (key, c), group in by.items():
        out[key].append((c, group))
    return out


def _found(group: list[Figure], band: Band) -> list[tuple[Outlier, Figure]]:
    """find() over the figures of one group; ``where`` keys the figure (a figure per member)."""
    by_where = {g.where: g for g in group}
    return [(o, by_where[o.where]) for o in find({g.where: g.value for g in group}, _higher(group[0]), band)]


def _among(cohort: str, n: int) -> str:
    return f" (the median of the {n} over {cohort} links)" if cohort else f" (the median of {n})"


def _text(o: Outlier, g: Figure) -> str:
    side = "under" if _higher(g) else "over"
    return f"{fmt_value(o.value, g.unit)}, {o.off:.0%} {side} the node's median {fmt_value(o.median, g.unit)}"
