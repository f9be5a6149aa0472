"""The burnin check's NVML traces (checks/burnin.py): each GPU's samples while the load ran,
summed up for the judges (``trace_summary``) and thinned for the report page (``thinned``)."""

from __future__ import annotations

import statistics

from preflight.readers.nvidia import nvml_facts
from preflight.readers.nvidia.nvml_inventory import CLOCKS_EVENTS

# The reasons that mean the GPU was held down by heat or by the power brake (nvml.h):
# a power cap (sw_power_cap) under a full GEMM load is the GPU at its limit, not a fault.
THROTTLE = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
SERIES_POINTS = 240  # per GPU in the report: a 5-minute burn sampled each second, thinned to a picture's worth


def trace_summary(t: nvml_facts.GpuTrace, started: float | None, seconds: float | None) -> dict:
    """Min and median SM clock, max temperature, median and max power, and the share of samples
    in each throttle reason, over the samples taken while the load ran."""
    # Only samples taken while the load ran: an idle GPU's low clock is not a sag. A rank with
    # no burn window (it died before its first burst) has none.
    under = [s for s in t.samples if started is not None and seconds is not None and started <= s[0] <= started + seconds]
    clocks = [s[1] for s in under if s[1] is not None]
    power = [s[2] for s in under if s[2] is not None]
    temps = [s[3] for s in under if s[3] is not None]
    reasons = [s[4] for s in under if s[4] is not None]
    share = {name: sum(1 for bits in reasons if bits & CLOCKS_EVENTS[name]) / len(reasons) for name in THROTTLE} if reasons else {}
    new_ecc = t.ecc_after - t.ecc_before if t.ecc_after is not None and t.ecc_before is not None else None
    return {"samples": len(under), "clock_min_mhz": min(clocks, default=None), "clock_median_mhz": statistics.median(clocks) if clocks else None,
            "temperature_max_c": max(temps, default=None), "power_median_w": statistics.median(power) if power else None,
            "power_max_w": max(power, default=None), "throttle_share": share, "ecc_new": new_ecc, "ecc_before": t.ecc_before,
            "clock_max_mhz": t.max_sm_clock_mhz, "nvml_unanswered": t.unanswered}


def thinned(trace: nvml_facts.GpuTrace, start: float, seconds: float) -> dict[str, list]:
    """The trace's samples from ``start`` for ``seconds`` as at most SERIES_POINTS points: seconds
    into the burn, SM clock in Hz, power in W, temperature in C; None where NVML did not say."""
    under = [s for s in trace.samples if start <= s[0] <= start + seconds]
    step = -(-len(under) // SERIES_POINTS) or 1
    # Thinned a window at a time keeping each window's worst (lowest clock, highest power and heat), so a dip survives.
    windows = [under[i:i + step] for i in range(0, len(under), step)]
    return {"t": [round(w[0][0] - start, 3) for w in windows],
            "clock_hz": [_worst(min, [s[1] for s in w], 1e6) for w in windows],
            "power_w": [_worst(max, [s[2] for s in w]) for w in windows],
            "temperature_c": [_worst(max, [s[3] for s in w]) for w in windows]}


def _worst(pick, values: list, scale: float = 1.0) -> float | None:  # noqa: ANN001
    said = [v for v in values if v is not None]
    return pick(said) * scale if said else None
