"""Seconds of the shm check by level, on this machine's /dev/shm, and the H200 VM's projected.

The standard level writes a 64 MiB segment once the kernel's figures (free space, MemAvailable,
the memory cgroup's headroom) hold the floor; the full level writes the floor's whole size, as
the standard level did before (issue 34: 10.6 s of the H200 VM's 39.9 s). The two are run
interleaved, N times each, at FLOOR bytes (default 1 GiB, the cpu profile's floor: this machine
is shared; 16 GiB is the H100/H200 profiles'). Then the H200's figure is projected from its
report: its own write rate and its time outside the write, scaled by the pages.
Run: python tests/perf/bench_shm.py [N] [FLOOR_BYTES]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests/, for conftest's make_ctx

from conftest import make_ctx  # noqa: E402

from preflight.checks import shm  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
FLOOR = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 30
H200 = HERE.parent / "fixtures" / "node" / "h200-1x-vm" / "report-standard-keep-going.json"


def one(level: str) -> tuple[float, float, int]:
    ctx = make_ctx({"shm_min_bytes": FLOOR})
    ctx.settings.level = level
    start = time.perf_counter()
    r = shm.Shm().run(ctx)
    took = time.perf_counter() - start
    assert r.status.value in ("PASS", "WARN"), r.summary
    return took, r.details["segment_seconds"] or 0.0, r.details["segment_bytes"]


def main() -> None:
    runs: dict[str, list[tuple[float, float, int]]] = {"full": [], "standard": []}
    for _ in range(N):
        for level in runs:  # interleaved: load on this shared machine falls on both alike
            runs[level].append(one(level))
    print(f"shm check on this machine's /dev/shm, floor {FLOOR / 2**30:g} GiB, median of {N} (min-max)")
    for level, rs in runs.items():
        took = [t for t, _, _ in rs]
        outside = [t - s for t, s, _ in rs]
        print(f"  {level:<9} segment {rs[0][2] / 2**20:>6.0f} MiB  check {statistics.median(took):7.3f} s ({min(took):.3f}-{max(took):.3f})"
              f"  outside the write {statistics.median(outside):.3f} s")
    report = json.loads(H200.read_text())
    c = next(c for c in report["checks"] if c["check"] == "shm")
    d = c["details"]
    rate = d["segment_bytes"] / d["segment_seconds"]
    outside = c["duration_seconds"] - d["segment_seconds"]  # mostly freeing the 16 GiB of pages as the fd closes
    small = shm.PROOF_SEGMENT
    write = small / rate
    print(f"H200 VM (its report): {d['segment_bytes'] / 2**30:g} GiB at {rate / 1e9:.2f} GB/s = {d['segment_seconds']:.2f} s, "
          f"{outside:.2f} s outside the write, check {c['duration_seconds']:.2f} s")
    print(f"  projected standard: {small >> 20} MiB at that rate {write:.3f} s; outside the write scaled by the pages "
          f"{outside * small / d['segment_bytes']:.3f} s (at most {outside:.2f} s if none of it scales): "
          f"{write + outside * small / d['segment_bytes']:.2f}-{write + outside:.2f} s, from {c['duration_seconds']:.2f} s")


if __name__ == "__main__":
    main()
