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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from preflight.base.findings import Finding, Measurement, Status
from preflight.base.units import fmt_value
from preflight.checkkit import figures as figs_mod
from preflight.checkkit.figures import Figure

if TYPE_CHECKING:
    from preflight.pipeline.load_expectations import OutlierExpect


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


def failing(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], cohort: Callable[[Figure], str | None] | None = None) -> list[str]:
    """The figure names with a member past the FAIL band: measured again before they FAIL
    (checkkit/confirm.py), as a figure beyond its floor is."""
    if expect is None:
        return []
    return [key for key, parts in _groups(figs, keys, cohort, expect).items()
            if any(o.status == Status.FAIL for part in parts for o, *_ in _found_in(part, expect.band(key)))]


def judge(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], words: dict[str, str], reasons: dict[str, str], rerun: str,
          cohort: Callable[[Figure], str | None] | None = None, first: list[Figure] | None = None, why: str | None = None) -> list[Finding]:
    """Each figure named in ``keys`` (one per GPU, pair or rank) against the median of its
    peers: one finding per figure name and status, naming every member past the band,
    worst first. ``cohort`` splits a name's members into groups judged apart (P2P pairs by
    their link: NVLink pairs are not held to PCIe pairs' median); None leaves a member out.
    ``expect`` None: the profile asks for no such judgement.

    Confirm before FAIL: ``first`` holds the first reading's figures of the names measured
    again (``figs`` then holds the second's). A member FAILs only past the FAIL band on both
    readings; past it on one reading only it WARNs. A name past the FAIL band that was not
    measured again keeps its FAIL, saying ``why``."""
    if expect is None:
        return []
    out = []
    again = _fails(first, expect, keys, cohort) if first is not None else {}
    for key, (parts, found, once) in _judged(figs, expect, keys, cohort, again).items():
        band = expect.band(key)
        what = words.get(key, key)
        for status in (Status.FAIL, Status.WARN):
            hit = [(o, g, among) for o, g, among in found if o.status == status]
            if not hit:
                continue
            o, g, _ = hit[0]
            limit = band.fail if status == Status.FAIL else band.warn
            head = f"{g.where} {what} {_text(o, g)}" + (" (past the FAIL band on one reading of two: transient)" if g.where in once else "")
            shown = "; ".join(f"{g.where}: {_text(o, g)}{among}{figs_mod.unsure_text(g)}" for o, g, among in hit[:8])
            more = f"; and {len(hit) - 8} more" if len(hit) > 8 else ""
            of = sum(len(part.members) for part in parts)
            once = ", or past the FAIL band on one of two readings," if status == Status.WARN and key in again else ""
            cause = (f"{what} more than {limit:.0%} worse than the median of the node's own {of} figures{once} on {len(hit)} of them "
                     f"(WARN past {band.warn:.0%}, FAIL past {band.fail:.0%}: {band.source}): {shown}{more}. "
                     "Identical parts should measure alike, so this one is held back even where it clears the absolute floor")
            if status == Status.FAIL:
                head, cause = _said(head, cause, key, again, why)
            reason = reasons.get(key, "see the figure in details.figures")
            if status == Status.FAIL:
                remedy = f"likely causes on that one: {reason}; drain the node until it measures like its peers, then rerun `{rerun}`"
            else:
                remedy = f"watch it: rerun `{rerun}`; if it stays behind its peers, check {figs_mod.first_cause(reason)}"
            out.append(Finding(status, head, cause, remedy))
    return out


def _judged(figs: list[Figure], expect: OutlierExpect, keys: tuple[str, ...], cohort, again: dict[str, dict[str, Outlier]]) -> dict:
    """Name -> (its parts, its outliers worst first as (Outlier, Figure, words), the members past
    the FAIL band on one reading only): what ``judge`` words and ``statuses`` records."""
    out = {}
    for key, parts in _groups(figs, keys, cohort, expect).items():
        band = expect.band(key)
        found = [(o, g, _among(name, n) if len(parts) > 1 else "") for part in parts for o, g, name, n in _found_in(part, band)]
        once: set[str] = set()
        if key in again:
            medians = {g.where: statistics.median(m.value for m in part.members) for part in parts for g in part.members}
            found, once = _confirmed(found, again[key], key, figs, medians)
        found.sort(key=lambda ogc: ogc[0].off, reverse=True)
        out[key] = (parts, found, once)
    return out


def statuses(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], cohort: Callable[[Figure], str | None] | None = None,
             first: list[Figure] | None = None) -> list[dict]:
    """Each member ``judge`` names and the status it gives it (after the second reading, as
    judge confirms), for the report's readers: the page rings a bar by the verdict, not by
    one reading. ``[{"name", "labels", "status"}]``, worst first per name."""
    if expect is None:
        return []
    again = _fails(first, expect, keys, cohort) if first is not None else {}
    return [{"name": g.name, "labels": g.labels, "status": o.status.value}
            for _, found, _ in _judged(figs, expect, keys, cohort, again).values() for o, g, _ in found]


def measurements(figs: list[Figure], expect: OutlierExpect | None, keys: tuple[str, ...], cohort: Callable[[Figure], str | None] | None = None) -> list[Measurement]:
    """Each judged member's shortfall against its median, as a fraction (negative: better),
    with the figure's labels and the FAIL band as its ceiling:
    ``preflight_<figure>_median_shortfall_ratio > preflight_<figure>_median_shortfall_ceiling_ratio``."""
    if expect is None:
        return []
    out = []
    for key, parts in _groups(figs, keys, cohort, expect).items():
        band = expect.band(key)
        for part in parts:
            group = part.members
            if len(group) < 2:
                continue
            med = statistics.median(g.value for g in group)
            if not med > 0:
                continue
            whole = statistics.median(g.value for g in part.whole) if part.split else None
            for g in group:
                off = worse_by(g.value, med, _higher(g))
                if whole is not None and whole > 0 and not part.past_every_part(g):
                    off = min(off, worse_by(g.value, whole, _higher(g)))  # as _found_in reads it
                out.append(Measurement(name=f"{g.name}_median_shortfall", unit="ratio", value=round(off, 6), labels=g.labels, ceiling=band.fail))
    return out


def bands(expect: OutlierExpect | None, keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Each figure's WARN and FAIL bands, for the report's readers (the page marks
    an outlier by them): the metrics carry only the FAIL band, as a ceiling."""
    if expect is None:
        return {}
    return {key: {"warn": expect.band(key).warn, "fail": expect.band(key).fail} for key in keys}


# ---- confirm before FAIL -------------------------------------------------------------------


def _fails(figs: list[Figure], expect: OutlierExpect, keys: tuple[str, ...], cohort) -> dict[str, dict[str, Outlier]]:
    """Name -> member -> its outlier past the FAIL band, on one reading; every name judged is a key."""
    out: dict[str, dict[str, Outlier]] = {}
    for key, parts in _groups(figs, keys, cohort, expect).items():
        out[key] = {o.where: o for part in parts for o, *_ in _found_in(part, expect.band(key)) if o.status == Status.FAIL}
    return out


def _confirmed(found: list, first: dict[str, Outlier], key: str, figs: list[Figure], medians: dict[str, float]) -> tuple[list, set[str]]:
    """The second reading's outliers, a FAIL kept only where the first reading failed the
    member too; a member past the FAIL band on one reading only WARNs, also where the second
    reading puts it within the band (then it gets an outlier of its own). Returns them and
    the members past the FAIL band on one reading only. ``medians``: member -> its group's
    median on the second reading."""
    out, seen, once = [], set(), set()
    for o, g, among in found:
        seen.add(o.where)
        if o.status == Status.FAIL and o.where not in first:
            o = replace(o, status=Status.WARN)
            among += f"; past the FAIL band on the second reading only, {_first_text(None)}"
            once.add(o.where)
        elif o.where in first:
            among += f"; {_first_text(first[o.where])}"
            if o.status != Status.FAIL:
                once.add(o.where)
        out.append((o, g, among))
    for where, o1 in first.items():
        g = next((g for g in figs if g.key == key and g.where == where), None)
        if where not in seen and g is not None and where in medians:
            now = Outlier(where, g.value, medians[where], worse_by(g.value, medians[where], _higher(g)), Status.WARN)
            out.append((now, g, f"; {_first_text(o1)}, within the band on the second"))
            once.add(where)
    return out, once


def _first_text(o: Outlier | None) -> str:
    return "the first reading within it" if o is None else f"the first reading {o.off:.0%} off the median"


def _said(head: str, cause: str, key: str, again: dict[str, dict[str, Outlier]], why: str | None) -> tuple[str, str]:
    """A FAIL's words: confirmed by a second reading, or why there was none."""
    if key in again:
        return head + " (confirmed on a second reading)", cause + ". Measured again in the same run, it was past the FAIL band both times"
    if why:
        return head + " (not confirmed)", cause + f". Not confirmed: {why}"
    return head, cause


def _higher(g: Figure) -> bool:
    return g.unit != figs_mod.SECONDS  # a rate: more is better; a time: less is


@dataclass(frozen=True)
class Part:
    """Members judged against their own median. ``name``: what the median is over ("NV18
    links"; "" where a name has one group). A part split from a larger group by the figures'
    own shape (``whole``, named ``whole_name``; ``members`` itself where not split) only clears
    the whole's findings, but for a member worse than ``slowest``, the worst median of the
    whole's parts: ``_found_in``."""

    name: str
    members: list[Figure]
    whole: list[Figure]
    whole_name: str
    slowest: float | None = None

    @property
    def split(self) -> bool:
        return self.whole is not self.members

    def past_every_part(self, g: Figure) -> bool:
        """Worse than the median of every part of the whole (a near pair slower than the far ones)."""
        return self.slowest is not None and worse_by(g.value, self.slowest, _higher(g)) > 0


def _groups(figs: list[Figure], keys: tuple[str, ...], cohort, expect: OutlierExpect) -> dict[str, list[Part]]:
    """Figure name -> its parts, each judged against its own median. A cohort with a ``split``
    (p2p_cohorts.PairCohort) parts a group further where it needs the whole group to tell
    (near and far pairs where the link kind cannot), given the name's WARN band: a list of Part."""
    split = getattr(cohort, "split", None)
    by: dict[tuple[str, str], list[Figure]] = defaultdict(list)
    for g in figs:
        if g.key in keys:
            c = cohort(g) if cohort else ""
            if c is not None:
                by[(g.key, c)].append(g)
    out: dict[str, list[Part]] = defaultdict(list)
    for (key, c), group in by.items():
        out[key].extend(split(c, group, expect.band(key).warn) if split else [Part(c, group, group, c)])
    return out


def _found_in(part: Part, band: Band) -> list[tuple[Outlier, Figure, str, int]]:
    """``part``'s outliers, each with the name and size of the group its median is of. A part split
    from a larger group adds no finding the whole's median does not make, and takes the milder of
    the two readings (a split spares far pairs the near ones' median; it must not hold near pairs
    of two speeds to one median of their own); but a member worse than every part's median, a near
    pair slower than the far ones, is read against its own part."""
    found = _found(part.members, band)
    if not part.split:
        return [(o, g, part.name, len(part.members)) for o, g in found]
    whole = {o.where: o for o, _ in _found(part.whole, band)}
    out = []
    for o, g in found:
        w = whole.get(o.where)
        if part.past_every_part(g):  # slower than even the far pairs: its own part's reading
            out.append((o, g, part.name, len(part.members)))
        elif w is not None:  # the milder reading
            out.append((o, g, part.name, len(part.members)) if o.off <= w.off else (w, g, part.whole_name, len(part.whole)))
    return out


def _found(group: list[Figure], band: Band) -> list[tuple[Outlier, Figure]]:
    """find() over the figures of one group; ``where`` keys the figure (a figure per member)."""
    by_where = {g.where: g for g in group}
    return [(o, by_where[o.where]) for o in find({g.where: g.value for g in group}, _higher(group[0]), band)]


def _among(cohort: str, n: int) -> str:
    return f" (the median of the {n} over {cohort})" if cohort else f" (the median of {n})"


def _text(o: Outlier, g: Figure) -> str:
    side = "under" if _higher(g) else "over"
    return f"{fmt_value(o.value, g.unit)}, {o.off:.0%} {side} the node's median {fmt_value(o.median, g.unit)}"
