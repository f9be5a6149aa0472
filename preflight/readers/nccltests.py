"""Read the tables nccl-tests' *_perf binaries print, so preflight's figures
can be compared with the reference tool's on the same node
(tests/perf/bench_bandwidth.py) and its arithmetic checked against real
tables (tests/readers/test_nccltests.py).

A row: size (bytes, the whole buffer), count (elements), type, redop, root,
then time (us), algbw and busbw (GB/s = 1e9 bytes/s) and #wrong, out of
place and in place. `-c 0` prints "N/A" for #wrong.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+(.*)$")
_RANK = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid")


class Timing(BaseModel):
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None: validation off (-c 0)


class Row(BaseModel):
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Timing
    in_place: Timing | None = None


class Table(BaseModel):
    ranks: int  # "# Rank N Group G Pid ..." lines: one per GPU in the run
    rows: list[Row]
    avg_busbw_gbps: float | None = None


def parse(text: str) -> Table:
    rows, ranks, avg = [], 0, None
    for line in text.splitlines():
        if _RANK.match(line):
            ranks += 1
        elif m := re.match(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", line):
            avg = float(m[1])
        elif not line.lstrip().startswith("#") and (m := _ROW.match(line)):
            nums = m[6].split()
            timings = [_timing(nums[i : i + 4]) for i in range(0, len(nums) - 3, 4)]
            if timings:
                rows.append(Row(size=int(m[1]), count=int(m[2]), type=m[3], redop=m[4], root=int(m[5]), out_of_place=timings[0], in_place=timings[1] if len(timings) > 1 else None))
    if not rows:
        raise ValueError("no nccl-tests table rows found (size count type redop root time algbw busbw #wrong ...)")
    return Table(ranks=ranks, rows=rows, avg_busbw_gbps=avg)


def _timing(cols: list[str]) -> Timing:
    return Timing(time_us=float(cols[0]), algbw_gbps=float(cols[1]), busbw_gbps=float(cols[2]), wrong=None if cols[3] == "N/A" else int(cols[3]))
