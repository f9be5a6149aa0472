"""Seconds of the rdma check's own turn, with the counters' first read taken by the check
itself (before issue 34) and as the run began, some seconds of other checks earlier.

On the recorded HGX H100 tree (12 ports; tests/fixtures/sysfs/hgx-h100) with the h100-sxm
profile's 3 s interval and a real sleep: the check alone waits the whole interval; after
`begin`, it waits what the checks before it left of it. The run's saving is the difference:
on a GPU node the checks before rdma (cuda's ranks and CUDA init: 9.4 s on the H200 VM,
topology, pcie) take longer than the interval, so the wait goes to nothing. The last case is
a node still settling: a port INIT as the run began and ACTIVE by the check's turn drops the
early read, so the check waits the whole interval again (nothing measured over less).
Run: python tests/perf/bench_rdma.py [N]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
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


def turn(before: float | None, came_up: Path | None = None) -> float:
    """The check's own seconds; ``before``: seconds of other checks since the run began (None: no begin);
    ``came_up``: a copy of the tree whose mlx5_6 port is INIT as the run begins and ACTIVE after ``before``."""
    shape = NodeShape(gpus=8, gpus_from="bench", fabric="nvswitch", fabric_from="bench")
    state = came_up / "sys/class/infiniband/mlx5_6/ports/1/state" if came_up else None
    if state:
        state.write_text("2: INIT\n")
    ctx = Context(profile=PROFILE, settings=Settings(), host=Host(came_up or TREE, environ={}), shape=shape, deadline=time.monotonic() + 30)
    check = rdma.Rdma()
    if before is not None:
        check.begin(ctx)
        time.sleep(before)
    if state:
        state.write_text("4: ACTIVE\n")
    start = time.perf_counter()
    r = check.run(ctx)
    took = time.perf_counter() - start
    assert r.status.value == "PASS" and r.details["interval_seconds"] >= PROFILE.rdma.interval_seconds, r.summary
    return took


def main() -> None:
    cases = {"first read at its turn (before)": None, "begin, then 0 s of checks": 0.0, "begin, then 1 s of checks": 1.0,
             "begin, then 3 s of checks": 3.0}
    settling = "begin, a port came up, 3 s of checks"
    took: dict[str, list[float]] = {k: [] for k in [*cases, settling]}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(TREE, copy, symlinks=True)
        for _ in range(N):
            for label, before in cases.items():  # interleaved
                took[label].append(turn(before))
            took[settling].append(turn(3.0, copy))
    print(f"rdma check's own turn, 12 recorded ports, {PROFILE.rdma.interval_seconds:g} s interval, median of {N} (min-max)")
    for label, ts in took.items():
        print(f"  {label:<38} {statistics.median(ts):6.3f} s ({min(ts):.3f}-{max(ts):.3f})")


if __name__ == "__main__":
    main()
