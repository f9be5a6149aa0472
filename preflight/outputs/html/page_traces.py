"""The report page's traces, taken out of a Report: the train probe's loss and
step time per rank, the burn-in's GEMM rate per burst and its NVML samples
(clock, power, temperature) per GPU. Numbers that cannot be drawn (a diverged
loss) are left out, and long series are thinned keeping each stretch's worst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from preflight.pipeline.check import Result
    from preflight.pipeline.report import Report

POINTS = 600  # per line: a 5-minute burn keeps thousands of bursts a GPU; a picture needs a few hundred


@dataclass(frozen=True)
class Series:
    label: str  # "rank 0", "GPU 3"
    xs: list[float]
    ys: list[float]

    @staticmethod
    def thinned(label: str, pts: list[tuple[float, float]], worst=min) -> Series:  # noqa: ANN001
        """At most POINTS points, keeping each stretch's worst (a clock's lowest, a temperature's
        highest): the moment that went wrong is what a person looks for."""
        step = -(-len(pts) // POINTS)
        if step > 1:
            pts = [worst(pts[i:i + step], key=lambda p: p[1]) for i in range(0, len(pts), step)]
        return Series(label, [p[0] for p in pts], [p[1] for p in pts])


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    unit: str  # fmt_value's unit for the y axis
    series: list[Series]


def _rank_reports(c: Result | None) -> list[tuple[str, dict]]:
    out = []
    for r in (c.details.get("ranks") or []) if c is not None else []:
        rep = r.get("report") if isinstance(r, dict) else None
        if isinstance(rep, dict):
            out.append((r.get("gpu") or f"rank {r.get('rank')}", rep))
    return out


def _finite(v: object) -> float | None:
    """A number that can be drawn; the worker writes a diverged loss as "nan" or "inf"."""
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _steps(who: str, values: list | None) -> Series | None:
    """One value a step, the ones that cannot be drawn left out (the check's own line says where the loss went non-finite)."""
    pts = [(float(i), f) for i, v in enumerate(values or []) if (f := _finite(v)) is not None]
    return Series(who, [p[0] for p in pts], [p[1] for p in pts]) if pts else None


def train_charts(report: Report) -> list[Chart]:
    """The probe's loss and step time at each step, one line per rank."""
    rows = _rank_reports(next((c for c in report.checks if c.check == "train"), None))
    loss = [s for who, r in rows if (s := _steps(who, r.get("losses")))]
    steps = [s for who, r in rows if (s := _steps(who, r.get("step_seconds")))]
    out = []
    if loss:
        out.append(Chart("training loss", "step", "", loss))
    if steps:
        out.append(Chart("training step time", "step", "seconds", steps))
    return out


def burnin_charts(report: Report) -> list[Chart]:
    """The burn-in's GEMM rate per burst (every profile) and its NVML samples (GPUs)."""
    c = next((c for c in report.checks if c.check == "burnin"), None)
    out = []
    rate = []
    for who, r in _rank_reports(c):
        at, secs, n, k = r.get("burst_at") or [], r.get("gemm_seconds") or [], r.get("gemm_n") or 0, r.get("gemms") or 1
        pts = [(t, 2.0 * n**3 * k / s) for t, s in zip(at, secs) if s and s > 0]
        if pts and n:
            rate.append(Series.thinned(who, pts))
    if rate:
        out.append(Chart("burn-in GEMM throughput per burst", "seconds into the burn", "flops_per_second", rate))
    series = (c.details.get("series") or {}) if c is not None else {}
    for key, title, unit, worst in (("clock_hz", "SM clock under load", "hertz", min), ("power_w", "power draw", "watts", max),
                                    ("temperature_c", "GPU temperature", "celsius", max)):
        lines = []
        for who, s in sorted(series.items()):
            pts = [(float(t), float(v)) for t, v in zip(s.get("t") or [], s.get(key) or []) if v is not None] if isinstance(s, dict) else []
            if pts:
                lines.append(Series.thinned(who, pts, worst))
        if lines:
            out.append(Chart(title, "seconds into the burn", unit, lines))
    return out
