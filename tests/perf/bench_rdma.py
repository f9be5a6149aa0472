"""Seconds of the rdma check's own turn, with the counters' first read taken by the check
itself (before issue 34) and as the run began, some seconds of other checks earlier.

On the recorded HGX H100 tree (12 ports; tests/fixtures/sysfs/hgx-h100) with the h100-sxm
profile's 3 s interval and a real sleep: the check alone waits the whole interval; after
`begin`, it waits what the checks before it left of it. The run's saving is the difference:
on a GPU node the checks before rdma (cuda's ranks and CUDA init: 9.4 s on the H200 VM,
topology, pcie) take longer than the interval, so the wait goes to nothing.
Run: python tests/perf/bench_rdma.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from preflight.base.host import Host
from preflight.checks import rdma
from preflight.pipeline import profiles
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
TREE = Path(__file__).parents[1] / "fixtures" / "sysfs" / "hgx-h100"
PATH = profiles.BUILTIN_DIR / "h100-sxm.toml"
PROFILE = profiles.resolve(profiles.load(PATH), PATH, {}, "--profile h100-sxm")


def turn(before: float | None) -> float:
    """The check's own seconds; ``before``: seconds of other checks since the run began (None: no begin)."""
    shape = NodeShape(gpus=8, gpus_from="bench", fabric="nvswitch", fabric_from="bench")
    ctx = Context(profile=PROFILE, settings=Settings(), host=Host(TREE, environ={}), shape=shape, deadline=time.monotonic() + 30)
    check = rdma.Rdma()
    if before is not None:
        check.begin(ctx)
        time.sleep(before)
    start = time.perf_counter()
    r = check.run(ctx)
    took = time.perf_counter() - start
    assert r.status.value == "PASS" and r.details["interval_seconds"] >= PROFILE.rdma.interval_seconds, r.summary
    return took


def main() -> None:
    cases = {"first read at its turn (before)": None, "begin, then 0 s of checks": 0.0, "begin, then 1 s of checks": 1.0,
             "begin, then 3 s of checks": 3.0}
    took: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(N):
        for label, before in cases.items():  # interleaved
            took[label].append(turn(before))
    print(f"rdma check's own turn, 12 recorded ports, {PROFILE.rdma.interval_seconds:g} s interval, median of {N} (min-max)")
    for label, ts in took.items():
        print(f"  {label:<34} {statistics.median(ts):6.3f} s ({min(ts):.3f}-{max(ts):.3f})")


if __name__ == "__main__":
    main()
