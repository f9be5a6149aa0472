"""Numbers for people: reports keep base units, messages use these."""

import math
import re


def fmt_bytes(n: float) -> str:
    """1073741824 -> '1 GiB'; 67108864 -> '64 MiB'; otherwise one decimal, truncated."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            v = n / size
            # Truncate, never round up: 4 KiB short of 1 GiB must not print as "1024 MiB".
            return f"{v:.0f} {unit}" if v.is_integer() else f"{math.floor(v * 10) / 10:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_second: float) -> str:
    """Bandwidth the way nccl-tests, nvbandwidth and datasheets print it: decimal GB/s (1e9), TB/s past 1000."""
    if bytes_per_second >= 1e12:
        return f"{bytes_per_second / 1e12:.2f} TB/s"
    return f"{bytes_per_second / 1e9:.3g} GB/s" if bytes_per_second < 1e10 else f"{bytes_per_second / 1e9:.1f} GB/s"


def fmt_seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_value(value: float, unit: str) -> str:
    """A measurement as a person reads it: '1 GiB', '48.0 GB/s', '508 ms', '35.2 us', '8 count'."""
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "bytes_per_second":
        return fmt_rate(value)
    if unit == "seconds":
        return fmt_seconds(value) if value >= 1e-3 or value == 0 else f"{value * 1e6:.1f} us"
    if unit == "flops_per_second":
        return f"{value / 1e12:.1f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.1f} GFLOP/s"
    if unit == "tokens_per_second":
        return f"{value:,.0f} tokens/s"
    if unit == "ratio":
        return f"{value:.3g}"
    if unit == "hertz":
        return f"{value / 1e6:.0f} MHz"
    if unit == "celsius":
        return f"{value:.0f} C"
    if unit == "watts":
        return f"{value:.0f} W"
    return f"{value:g} {unit}"


MAX_CPUS = 1 << 16  # the kernel's NR_CPUS tops out at 8192; a larger number is damage


def parse_cpulist(text: str) -> list[int]:
    """``0-23,48-71`` (the kernel's and nvidia-smi's CPU-list format) -> sorted numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", part)
        if not m or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ValueError(f"{text.strip()!r} is not a CPU list like 0-23,48-71")
        if int(m[2] or m[1]) >= MAX_CPUS:
            raise ValueError(f"{text.strip()!r} names CPU {m[2] or m[1]}, beyond any kernel's {MAX_CPUS}")
        cpus.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return sorted(cpus)


def format_cpulist(cpus: "list[int] | set[int]") -> str:
    """The inverse of parse_cpulist: [0, 1, 2, 5] -> ``0-2,5``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
