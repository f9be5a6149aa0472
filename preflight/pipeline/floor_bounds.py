"""How far a floor may go before it stops judging anything.

A floor of 0 passes every node: the shm check with ``shm_min_bytes = 0`` writes
no segment and says PASS in milliseconds, and TOML's ``0x10`` is 16 bytes, as
useless. So every floor must be above 0 (a ceiling of 0 would fail every node,
as nonsensical), and a check may say, per floor, the least value that still
judges something (``Check.floor_sane``): far below any real hardware, so no
site's honest floor is refused, yet above what would pass a node that cannot do
the work at all. The built-in checks take theirs from ``BY_UNIT``; how each bound
was chosen is said beside it, and in every message that refuses a floor.
"""

from __future__ import annotations

from typing import NamedTuple

from preflight.base.units import fmt_value


class Sane(NamedTuple):
    """The range a floor may sensibly take: at least ``least``; a ceiling (bound "max") at most ``most``."""

    least: float
    most: float
    why: str


# Absurdly below any working hardware, not merely below a fast node: the lowest floor a shipped
# profile sets in each unit is far above these (cpu.toml: 1 GiB of /dev/shm, 5 MB/s loopback
# all_reduce, 10 GFLOP/s GEMM, a 20 ms latency ceiling).
BY_UNIT = {
    "bytes": Sane(1 << 20, float("inf"), "less than one NCCL buffer (NCCL_BUFFSIZE, 4 MiB by default), and a 64th of "
                  "Docker's 64 MiB /dev/shm, in which NCCL already fails"),
    "bytes_per_second": Sane(1e3, float("inf"), "slower than a 9600-baud modem: no link preflight measures is that slow and "
                             "still works (a site that judges by comparison alone, as `pairwise` does, sets its floors this loose)"),
    "flops_per_second": Sane(1e6, float("inf"), "what a 1990 486 did; the cpu profile's one-core floor is 10 GFLOP/s and a GPU does 1e14 and more"),
    "tokens_per_second": Sane(1.0, float("inf"), "one token a second"),
    "ratio": Sane(0.01, float("inf"), "1%: a vCPU for every hundred GPUs, or a model FLOPs utilization no working GPU reads"),
    "seconds": Sane(1e-6, 3600.0, "a ceiling runs from 1 us (under any collective's latency: a 4 KiB NVLink all_reduce "
                    "takes about 10 us) to an hour (longer than a check runs: it could never be crossed)"),
}


def by_unit(floors: dict[str, tuple[str, str]]) -> dict[str, Sane]:
    """``Check.floor_sane`` for floors declared as name -> (unit, bound) in ``Check.floor_units``."""
    return {name: BY_UNIT[unit] for name, (unit, _) in floors.items() if unit in BY_UNIT}


def problem(value: float, unit: str, bound: str, sane: Sane | None) -> str | None:
    """Why a floor (``bound`` "min") or ceiling ("max") of ``value`` judges nothing, and a value
    that would judge; None where it judges."""
    if value <= 0:
        what = "passes every node" if bound == "min" else "fails every node"
        give = f"give at least {_shown(sane.least, unit)}" if sane else "give the least a healthy node reaches"
        return f"= {_shown(value, unit)} {what}, so its check would judge nothing; {give}"
    if sane is None:
        return None
    if value < sane.least:
        return f"= {_shown(value, unit)} judges nothing: under {fmt_value(sane.least, unit)}, {sane.why}; give at least {_shown(sane.least, unit)}"
    if bound == "max" and value > sane.most:
        return f"= {_shown(value, unit)} judges nothing: over {fmt_value(sane.most, unit)}, {sane.why}; give at most {_shown(sane.most, unit)}"
    return None


def _shown(value: float, unit: str) -> str:
    """``16 bytes (16 B)``: the number as the file writes it, then as a person reads it."""
    number = f"{value:.0f}" if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"
    return f"{number} {unit} ({fmt_value(value, unit)})"
