"""Numbers for people: reports keep base units, messages use these."""

import math


def fmt_bytes(n: float) -> str:
    """1073741824 -> '1 GiB'; 67108864 -> '64 MiB'; otherwise one decimal, truncated."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            v = n / size
            # Truncate, never round up: 4 KiB short of 1 GiB must not print as "1024 MiB".
            return f"{v:.0f} {unit}" if v.is_integer() else f"{math.floor(v * 10) / 10:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_value(value: float, unit: str) -> str:
    """A measurement as a person reads it: '1 GiB', '2.1 GiB/s', '508 ms', '8 count'."""
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "bytes_per_second":
        return fmt_bytes(value) + "/s"
    if unit == "seconds":
        return fmt_seconds(value)
    return f"{value:g} {unit}"
