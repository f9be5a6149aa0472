"""What the report page shows, taken out of a Report: plain data, no HTML.

Each function reads one part of the report (problems, where the time went,
per-GPU figures against their floors, the P2P matrix, the group) and says
"nothing to show" with the reason rather than guessing; page_traces.py and
page_layout.py read the traces and the layout. outputs/html/page.py lays the parts
out and outputs/html/page_svg.py draws them; both are tested through these facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from preflight.base.errors import signal_name
from preflight.base.findings import Measurement, Status

if TYPE_CHECKING:
    from preflight.pipeline.check import Result
    from preflight.pipeline.report import Report

# Labels that name the member a figure belongs to; the rest say which figure it is.
MEMBER = ("gpu", "rank", "UUID", "peer_gpu")
SHORTFALL = "_median_shortfall"


@dataclass(frozen=True)
class Problem:
    check: str
    status: str  # FAIL, ERROR, WARN; INTERRUPTED for the run itself (interruption)
    summary: str
    cause: str | None
    remedy: str | None
    carried: str | None = None  # "the run of <time>, level <level>": measured before this run
    action: str | None = None  # "reset-gpu (node)": what the result asks be done (preflight/base/actions.py)


def carried(c: Result, name: str | None = None) -> str | None:
    """When a result (or, with ``name``, one of its figures) was measured by an earlier run
    and kept in this report (pipeline/report.py carry_forward); None: by this run."""
    if c.details.get("carried_from"):
        return f"the run of {str(c.details['carried_from'])[:19]}, level {c.details.get('carried_level') or 'standard'}"
    kept = c.details.get("carried_measurements") or {}
    if name is not None and name in (kept.get("names") or []):
        return f"the run of {str(kept.get('from'))[:19]}, level {kept.get('level') or 'standard'}"
    return None


@dataclass(frozen=True)
class Span:
    """One check on the timeline: seconds from the run's start, or carried from an earlier run."""

    check: str
    status: str
    start: float
    seconds: float
    carried_from: str | None = None


@dataclass(frozen=True)
class Bar:
    who: str  # "GPU 3", "rank 1"
    value: float
    bound: float | None  # the floor (higher is better) or ceiling (lower is better) it is held to
    higher_is_better: bool
    off_median: float | None = None  # how much worse than the node's median, as a fraction
    outlier: str | None = None  # "FAIL", "WARN": past the profile's outlier band

    @property
    def headroom(self) -> float | None:
        """Value over floor (or ceiling over value), for ordering: under 1 is past the bound."""
        if self.bound is None or self.bound <= 0:
            return None
        if self.value <= 0:
            return 0.0 if self.higher_is_better else math.inf  # every NVLink down: the weakest there is
        return self.value / self.bound if self.higher_is_better else self.bound / self.value

    @property
    def past_bound(self) -> bool:
        if self.bound is None:
            return False
        return self.value < self.bound if self.higher_is_better else self.value > self.bound


@dataclass(frozen=True)
class BarGroup:
    check: str
    name: str  # the measurement's name: "hbm_copy_bandwidth"
    unit: str
    variant: str  # the non-member labels, "" for most: "op=all_reduce"
    bars: list[Bar]  # weakest first
    carried: str | None = None  # measured by an earlier run (see ``carried``)


@dataclass(frozen=True)
class Cell:
    src: int
    dst: int
    value: float | None  # bytes per second; None: not measured
    below_floor: bool = False
    outlier: str | None = None


@dataclass(frozen=True)
class Matrix:
    gpus: int
    cells: list[Cell]  # every ordered pair, src-major
    floor: float | None
    note: str  # where the figures came from, or why there are none


@dataclass
class GroupRow:
    node_rank: int
    host: str
    addr: str
    state: str  # "ok", "failed", "missing"
    why: str
    figures: dict[str, float] = field(default_factory=dict)


def problems(report: Report) -> list[Problem]:
    """Every check that did not pass, failures first, each with its cause and fix."""
    order = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2}
    # The history's drift or lemon (Report.history) is a problem like a check's WARN.
    bad = [c for c in report.results if c.status in order]
    bad.sort(key=lambda c: order[c.status])
    return [Problem(c.check, str(c.status.value), c.summary, c.cause, c.remedy, carried(c), f"{c.action} ({c.domain})") for c in bad]


def interruption(report: Report) -> Problem | None:
    """A run a signal stopped, as the first problem: it did not finish, so it vouches
    for nothing, though every result it holds may pass (kept from the run before)."""
    if not report.interrupted_by_signal:
        return None
    sig = signal_name(report.interrupted_by_signal)
    stopped = [c.check for c in report.checks if (c.details.get("interrupted") or {}).get("status") == "ERROR"
               or (c.status == Status.ERROR and "interrupted_by_signal" in c.details)]
    kept = [c.check for c in report.checks if "interrupted" in c.details]
    summary = f"interrupted by {sig}" + (f" while {stopped[0]} ran" if stopped else "") + ": the run did not finish"
    if kept:
        summary += f"; {', '.join(kept)} keep the last complete results, from an earlier run"
    return Problem("run", "INTERRUPTED", summary,
                   f"preflight was stopped ({sig}: systemd's TimeoutStartSec, a caller's timeout, Ctrl-C) before it finished; "
                   "the node is not vouched for until a run finishes",
                   "let the run finish: raise the unit's TimeoutStartSec or the caller's timeout if its budget is too small, then run preflight again")


def timeline(report: Report) -> list[Span]:
    """Checks in the order they ran; a check carried from an earlier run took none of this run's time."""
    out, at = [], 0.0
    for c in report.checks:
        carried = c.details.get("carried_from")
        if carried:
            out.append(Span(c.check, c.status.value, at, 0.0, carried_from=str(carried)))
            continue
        out.append(Span(c.check, c.status.value, at, c.duration_seconds))
        at += c.duration_seconds
    return out


def _member(m: Measurement) -> str | None:
    if "peer_gpu" in m.labels:
        return None  # a pair: the heatmap's
    if "gpu" in m.labels:
        return f"GPU {m.labels['gpu']}"
    if "rank" in m.labels:
        return f"rank {m.labels['rank']}"
    return None


def _variant(m: Measurement) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items()) if k not in MEMBER)


def _verdicts(c: Result) -> dict[tuple[str, tuple], str] | None:
    """The status the check's outlier judge gave each member it named (details.outliers: after
    the second reading, as the verdict has it); None for a report from before it was recorded."""
    said = c.details.get("outliers")
    if not isinstance(said, list):
        return None
    return {(v["name"], tuple(sorted(v["labels"].items()))): v["status"] for v in said if isinstance(v, dict) and "labels" in v}


def _outlier(off: float | None, bands: dict | None, ceiling: float | None, verdicts: dict | None, key: tuple) -> str | None:
    """The mark a member (``key``: figure name, sorted labels) gets: the check's own verdict where
    it recorded them, else its shortfall against the recorded bands (an older report: the FAIL
    band alone, the ceiling)."""
    if verdicts is not None:
        return verdicts.get(key)
    if off is None:
        return None
    fail = (bands or {}).get("fail", ceiling)
    if fail is not None and off > fail:
        return "FAIL"
    warn = (bands or {}).get("warn")
    return "WARN" if warn is not None and off > warn else None


def bar_groups(report: Report) -> list[BarGroup]:
    """Each per-GPU (or per-rank) figure held to a floor or judged against the node's
    median, one bar per member, weakest first; groups with a member past its bound first."""
    out = []
    for c in report.checks:
        off = {(m.name.removesuffix(SHORTFALL), tuple(sorted(m.labels.items()))): m for m in c.measurements if m.name.endswith(SHORTFALL)}
        bands = c.details.get("outlier_bands") or {}
        verdicts = _verdicts(c)
        groups: dict[tuple[str, str], list[Bar]] = {}
        units: dict[tuple[str, str], str] = {}
        for m in c.measurements:
            who = _member(m)
            if who is None or m.name.endswith(SHORTFALL):
                continue
            key = tuple(sorted(m.labels.items()))
            # The burn-in judges its clock's median as burnin_sm_clock and writes it as burnin_sm_clock_median.
            judged = m.name if (m.name, key) in off else m.name.removesuffix("_median")
            short = off.get((judged, key))
            if m.floor is None and m.ceiling is None and short is None:
                continue  # a figure nothing judges (temperature at rest) is not drawn against anything
            delta = short.value if short is not None else None
            # A floor means higher is better, a ceiling lower; with neither, a time is better shorter (as outliers.py has it).
            higher = m.floor is not None or (m.ceiling is None and m.unit != "seconds")
            bar = Bar(who, m.value, m.floor if m.floor is not None else m.ceiling, higher,
                      delta, _outlier(delta, bands.get(judged), short.ceiling if short else None, verdicts, (judged, key)))
            key = (m.name, _variant(m))
            groups.setdefault(key, []).append(bar)
            units[key] = m.unit
        for (name, variant), bars in groups.items():
            bars.sort(key=_weakness)
            out.append(BarGroup(c.check, name, units[(name, variant)], variant, bars, carried(c, name)))
    out.sort(key=lambda g: not any(b.past_bound or b.outlier for b in g.bars))
    return out


def _weakness(b: Bar) -> float:
    if b.headroom is not None:
        return b.headroom
    return -(b.off_median or 0.0)


def gpu_count(report: Report) -> int:
    """How many GPUs the run had: the node's shape, else NVML's inventory."""
    if report.shape is not None and report.shape.gpus:
        return report.shape.gpus
    for c in report.checks:
        inv = c.details.get("inventory") if c.check == "cuda" else None
        if isinstance(inv, dict) and isinstance(inv.get("gpus"), list):
            return len(inv["gpus"])
    return 0


def p2p(report: Report) -> Matrix | None:
    """GPU -> GPU copy bandwidth for every ordered pair; None on a node of one GPU or none."""
    bw = next((c for c in report.checks if c.check == "bandwidth"), None)
    seen = [int(m.labels[k]) for m in (bw.measurements if bw is not None else []) if m.name == "p2p_bandwidth"
            for k in ("gpu", "peer_gpu") if m.labels.get(k, "").isdigit()]
    # The pairs measured widen the axis: an older report with no shape, or GPUs numbered past the shape's count.
    n = max(gpu_count(report), 1 + max(seen, default=-1))
    if n < 2:
        return None
    found: dict[tuple[int, int], Measurement] = {}
    short: dict[tuple[int, int], Measurement] = {}
    for m in bw.measurements if bw is not None else []:
        if m.name in ("p2p_bandwidth", "p2p_bandwidth" + SHORTFALL) and "peer_gpu" in m.labels:
            try:
                pair = (int(m.labels["gpu"]), int(m.labels["peer_gpu"]))
            except (KeyError, ValueError):
                continue
            (short if m.name.endswith(SHORTFALL) else found)[pair] = m
    bands = ((bw.details.get("outlier_bands") or {}).get("p2p_bandwidth") if bw is not None else None)
    verdicts = _verdicts(bw) if bw is not None else None
    floor = next((m.floor for m in found.values() if m.floor is not None), None)
    cells = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            m = found.get((a, b))
            s = short.get((a, b))
            cells.append(Cell(a, b, m.value if m else None, bool(m and m.floor is not None and m.value < m.floor),
                              _outlier(s.value if s else None, bands, s.ceiling if s else None, verdicts,
                                       ("p2p_bandwidth", tuple(sorted(m.labels.items())) if m else ()))))
    if found:
        note = f"{len(found)} of {n * (n - 1)} ordered pairs measured by the bandwidth check"
        if bw is not None and (when := carried(bw, "p2p_bandwidth")):
            note += f" of {when}, carried into this report"
    elif bw is None:
        note = "not measured: the bandwidth check did not run"
    else:
        note = f"not measured: bandwidth {bw.status.value}: {bw.summary}"
    return Matrix(n, cells, floor, note)


def group_rows(report: Report) -> list[GroupRow] | None:
    """A run across nodes, as node rank 0 recorded it: every node, the missing ones too."""
    g = report.group
    if g is None:
        return None
    rows = []
    for n in sorted(g.nodes, key=lambda n: n.node_rank):
        extra = n.model_extra or {}
        figures = {k: float(v) for k, v in (extra.get("figures") or {}).items() if isinstance(v, (int, float))}
        rows.append(GroupRow(n.node_rank, str(extra.get("host") or ""), str(extra.get("addr") or ""),
                             "ok" if n.ok else "failed", str(extra.get("why") or ""), figures))
    rows += [GroupRow(r, "", "", "missing", "never reached the meeting point") for r in g.missing]
    return sorted(rows, key=lambda r: r.node_rank)
