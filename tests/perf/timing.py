"""The one timing loop the perf scripts share: median, min and max of N runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(label: str, fn: Callable[[], object], n: int, width: int = 52) -> float:
    """Prints median, min and max in ms; returns the median in seconds."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    print(f"{label:<{width}} {statistics.median(times) * 1000:>8.1f}ms {min(times) * 1000:>8.1f}ms {max(times) * 1000:>8.1f}ms", flush=True)
    return statistics.median(times)
