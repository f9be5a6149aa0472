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
from dataclasses import dataclass
from typing import Protocol

from preflight.base.findings import Status


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
