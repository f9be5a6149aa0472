"""Figures and their floors: what every measuring check (bandwidth, train)
shares. A Figure is one judged number with where it was measured; the
judge compares each with its floor or ceiling, WARNs within the profile's
margin and FAILs beyond, naming every GPU, pair or rank that missed.

Each figure also says how sure it is: the 95% interval of the median of its
repeats (the straggler's first quartile), relative to it, and whether that is
within the profile's tolerance. The worker repeats until it is or a cap is
reached (checks/workers/_converge.py, whose interval this is, computed again
here from the raw repeats: the agent does the arithmetic). A figure that did
not converge is judged as it is, with that said in its line and cause.
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
    ci: float | None = None  # the 95% interval's far end over the median, less 1 (relative_ci)
    tolerance: float | None = None  # the profile's: within it the figure converged
    converged: bool | None = None  # None: no tolerance applies (a max, a p99, an old report)
    stopped: str | None = None  # why the worker stopped repeating: converged, max_repeats, max_seconds


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


CONFIDENCE = 0.95


def interval_ranks(n: int, q: float = 0.5, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based (l, u) with x(l) <= the q-quantile <= x(u) at least ``confidence`` of the
    time, whatever the distribution: the repeats under the quantile number Binomial(n, q),
    each tail at most (1 - confidence) / 2. None: n repeats are too few (6 for the median)."""
    tail = (1 - confidence) / 2
    lq, lp = math.log(q), math.log1p(-q)
    below, total, log_pmf = [], 0.0, n * lp  # in log space: 0.5^n underflows past n = 1074
    for k in range(n + 1):
        if k:
            log_pmf += math.log((n - k + 1) / k) + lq - lp
        total += math.exp(log_pmf)
        below.append(min(1.0, total))
    lo = next((k for k in range(n + 1) if below[k] > tail), n + 1)  # P(B <= l - 1) <= tail
    up = next((k for k in range(n + 1) if below[k] >= 1 - tail), n) + 1  # P(B >= u) <= tail
    return (lo, up) if lo >= 1 and up <= n else None


def relative_ci(xs: list[float], q: float = 0.5) -> float | None:
    """max(m / x(l), x(u) / m) - 1 for the 95% interval of the q-quantile m of ``xs``:
    it bounds the relative error of a time and of a rate (bytes / time) alike."""
    lu = interval_ranks(len(xs), q)
    if lu is None:
        return None
    s = sorted(xs)
    lo, hi, m = s[lu[0] - 1], s[lu[1] - 1], (median(s) if q == 0.5 else quantile(s, q))
    return max(m / lo, hi / m) - 1 if lo > 0 and m > 0 else None


def sureness(xs: list[float], tolerance: float | None, stopped: str | None = None, q: float = 0.5) -> dict:
    """A figure's ci, tolerance, converged and stopped, from its raw repeats (Figure's fields)."""
    ci = relative_ci(xs, q)
    converged = None if tolerance is None else ci is not None and ci <= tolerance
    return {"ci": ci, "tolerance": tolerance, "converged": converged, "stopped": stopped}


CAPS = {"max_repeats": "at its cap of repeats", "max_seconds": "at its cap of seconds"}


def unsure_text(g: Figure, short: bool = False) -> str:
    """" (not converged: ...)" for a figure whose interval is wider than its tolerance; else ""."""
    if g.converged is not False:
        return ""
    if short:
        return f" (not converged: +-{g.ci:.0%})" if g.ci is not None else " (not converged)"
    known = f"known to +-{g.ci:.1%} after {g.repeats} repeats" if g.ci is not None else f"{g.repeats} repeats give no 95% interval"
    cap = CAPS.get(g.stopped or "", "")
    return f" (not converged within +-{g.tolerance:.0%}: {known}{', ' + cap if cap else ''})"


def unsure_note(figs: list[Figure], words: dict[str, str]) -> str:
    """For a summary: the figures that did not converge, by name (at most three), each with
    its widest interval; "" where all did."""
    bad: dict[str, list[Figure]] = defaultdict(list)
    for g in figs:
        if g.converged is False:
            bad[g.key].append(g)
    if not bad:
        return ""
    shown = []
    for key, group in bad.items():
        cis = [g.ci for g in group if g.ci is not None]
        wide = f"+-{max(cis):.0%}" if len(cis) == len(group) else "no 95% interval"
        of = sum(g.key == key for g in figs)
        shown.append(f"{words.get(key, key)}{f' on {len(group)} of {of}' if of > 1 else ''} ({wide})")
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    tol = next(iter(bad.values()))[0].tolerance
    return f"; not converged within +-{tol:.0%} at the cap: " + ", ".join(shown[:3]) + more


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
            shown = "; ".join(f"{g.where}: {fmt_value(g.value, g.unit)}{unsure_text(g)}" for g in sorted(below, key=lambda g: g.value, reverse=floor.bound == "max")[:8])
            more = f"; and {len(below) - 8} more" if len(below) > 8 else ""
            cause = f"{what} {'over' if floor.bound == 'max' else 'under'} the {limit} {bound} ({floor.source}; {floor.origin}) on {len(below)} of {len(group)}: {shown}{more}"
            remedy = f"likely causes: {reasons.get(name, 'see the figure in details.figures')}; drain the node until it is fixed, then rerun `{rerun}`"
            out.append(Finding(FAIL, head, cause, remedy))
        if marginal:
            g = (max if floor.bound == "max" else min)(marginal, key=lambda m: m.value)
            cause = f"{what} within {margin:.0%} of its {limit} {bound} on {len(marginal)} of {len(group)}: " + "; ".join(f"{m.where}: {fmt_value(m.value, m.unit)}{unsure_text(m)}" for m in marginal[:8])
            out.append(Finding(WARN, f"{what} marginal on {g.where} ({fmt_value(g.value, g.unit)}, {bound} {limit})", cause,
                               f"the node is near its {bound}: watch it, and check {first_cause(reasons.get(name, 'the figure'))}"))
    return out


def first_cause(reasons: str) -> str:
    """The first of a REASONS entry's likely causes, whole: the list is split at ", " only outside
    parentheses and backquotes, so "clocks held down (power brake, thermal ...: `nvidia-smi ...`)"
    keeps its parenthesis and its command."""
    depth, quoted = 0, False
    for i, ch in enumerate(reasons):
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth = max(0, depth - 1)
        elif not quoted and not depth and reasons.startswith(", ", i):
            return reasons[:i]
    return reasons


def scale_floors(floors: dict[str, ResolvedFloor], names: tuple[str, ...], factor: float, said: str) -> dict[str, ResolvedFloor] | None:
    """``floors`` with the profile's own floors of ``names`` times ``factor`` (below 1: the node's design
    gives less than the reference's), each source saying why; None where nothing is scaled. A site's
    own floor (config, calibrate) was measured on its own nodes and is never scaled."""
    scaled = {name: f for name in names if (f := floors.get(name)) is not None and f.from_profile}
    if factor >= 1 or not scaled:
        return None
    return {**floors, **{name: f.model_copy(update={"value": f.value * factor, "source": f"{f.source}; {said}"}) for name, f in scaled.items()}}


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
        out.append(Measurement(name=g.name, unit=g.unit, value=g.value, labels=g.labels, repeats=g.repeats or None, ci=g.ci, converged=g.converged, **kw))
    return out


def lines(figs: list[Figure], floors: dict[str, ResolvedFloor], words: dict[str, str]) -> list[str]:
    """One line per figure name: the weakest, the median, how sure, the bound, the worst spread."""
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
        text += _sure_line(group)
        if floor is not None:
            text += f"  {'ceiling' if floor.bound == 'max' else 'floor'} {fmt_value(floor.value, floor.unit)}"
        else:
            text += "  no floor"
        spreads = [g.spread for g in group if g.spread is not None]
        if spreads:
            text += f"  spread {max(spreads):.1%}"
        out.append(text)
    return out


def _sure_line(group: list[Figure]) -> str:
    """How sure the group's figures are: the widest 95% interval, the repeats, and
    those that did not converge within the tolerance (at a cap)."""
    cis = [g.ci for g in group if g.ci is not None]
    reps = sorted({g.repeats for g in group if g.repeats})
    text = f"  +-{max(cis):.1%} (95%)" if cis else ""
    if reps:
        text += f" {reps[0]}{'-' + str(reps[-1]) if len(reps) > 1 else ''} repeats"
    bad = [g for g in group if g.converged is False]
    if bad:
        who = bad[0].where if len(group) > 1 else ""
        text += f"  not converged within +-{bad[0].tolerance:.0%}" + (f" on {len(bad)} of {len(group)} ({who}{', ...' if len(bad) > 1 else ''})" if who else "")
        cap = CAPS.get(bad[0].stopped or "")
        text += f", {cap}" if cap else ""
    return text
