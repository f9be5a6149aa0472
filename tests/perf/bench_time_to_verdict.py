"""Time to a verdict, as ratios taken in one run so the machine's load falls on
both sides alike:

1. the standard level (`preflight run --profile cpu`) against a bare 2-rank
   torchrun that imports torch, initialises gloo and all-reduces once: the
   least any tool that starts ranks can take. Target: within 2.0x.
2. the quick level (`preflight run --profile cpu --level quick`) against a
   bare `python -c pass`, and whether it imported torch. Target: under 1.5 s,
   no torch.
3. where the standard run's time goes: each check's share, and the ranks'
   launch (torchrun, the torch import and the process group) inside the
   first check that needs ranks.

Rounds alternate (bare, standard, quick, python) N times; medians, min and max
are printed. Exits 1 when a target is missed. Reports and lock go to a
temporary directory; nothing under /var is touched.

Run: python tests/perf/bench_time_to_verdict.py [N]   (default 5)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
PY = sys.executable
RANKS = 2  # the cpu profile's gloo ranks
STANDARD_RATIO, QUICK_SECONDS = 2.0, 1.5

BARE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
assert x.item() == int(os.environ["WORLD_SIZE"])
dist.destroy_process_group()
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t
    if p.returncode not in (0, 1):  # 1: a check failed on a busy machine; still a verdict, still timed
        sys.exit(f"{' '.join(argv[:6])} exited {p.returncode}: {p.stderr[-2000:]}")
    return seconds


def shares(report: Path) -> tuple[list[tuple[str, float]], float, float | None]:
    """(check, seconds) of the standard run, its total, and the first launch's start-up
    (torch import and process-group init of the slowest rank in the first stage)."""
    r = json.loads(report.read_text())
    checks = [(c["check"], c["duration_seconds"]) for c in r["checks"]]
    launch = None
    for c in r["checks"]:
        world = c["details"].get("world")
        if world and world["stage"] == 1 and world["launch"] == 1:
            reps = [o["report"] for o in c["details"].get("ranks") or [] if o.get("report")]
            launch = max(((x.get("import_seconds") or 0) + (x.get("init_seconds") or 0) for x in reps), default=None)
    return checks, r["duration_seconds"], launch


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-verdict-") as tmp:
        d = Path(tmp)
        bare = d / "bare.py"
        bare.write_text(BARE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        env["PREFLIGHT_LOCK_FILE"] = str(d / "lock")
        run = [PY, "-m", "preflight", "run", "--profile", "cpu", "-q", "--report"]
        cases = {
            "bare torchrun": [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), str(bare)],
            "standard": [*run, str(d / "standard.json")],
            "quick": [*run, str(d / "quick.json"), "--level", "quick"],
            "python -c pass": [PY, "-c", "pass"],
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        share_runs = []
        for i in range(N):
            for name, argv in cases.items():
                times[name].append(timed(argv, env))
                if name == "standard":
                    share_runs.append(shares(d / "standard.json"))
            print(f"round {i + 1}/{N}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()), flush=True)
        # Whether the quick level imported torch: the same command under -X importtime.
        probe = subprocess.run([PY, "-X", "importtime", *run[1:], str(d / "probe.json"), "--level", "quick"], env=env, capture_output=True, text=True, timeout=120)
        quick_torch = any(line.rstrip().endswith("| torch") for line in probe.stderr.splitlines())

    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{'case':<16} {'median':>8} {'min':>8} {'max':>8}   (seconds, {N} interleaved rounds)")
    for name, t in times.items():
        print(f"{name:<16} {med[name]:8.2f} {min(t):8.2f} {max(t):8.2f}")
    ratio = med["standard"] / med["bare torchrun"]
    ratios = [s / b for s, b in zip(times["standard"], times["bare torchrun"])]
    print(f"\nstandard / bare torchrun: {ratio:.2f}x (per round {min(ratios):.2f}-{max(ratios):.2f}x; target {STANDARD_RATIO:.1f}x)")
    print(f"quick: {med['quick']:.2f} s, {med['quick'] / med['python -c pass']:.1f}x a bare python; torch imported: {'yes' if quick_torch else 'no'} (target under {QUICK_SECONDS} s, no torch)")

    print("\nwhere the standard run's time goes (median over rounds):")
    names = [c for c, _ in share_runs[0][0]]
    total = statistics.median(t for _, t, _ in share_runs)
    for name in names:
        sec = statistics.median(dict(c)[name] for c, _, _ in share_runs if name in dict(c))
        print(f"  {name:<10} {sec:6.2f} s  {100 * sec / total:5.1f}%")
    launches = [x for _, _, x in share_runs if x is not None]
    if launches:
        sec = statistics.median(launches)
        print(f"  (of which the ranks' launch: torch import + process group {sec:.2f} s, {100 * sec / total:.1f}%, paid once)")
    print(f"  total      {total:6.2f} s (the report's duration; the process adds its start-up)")
    missed = ratio > STANDARD_RATIO or med["quick"] > QUICK_SECONDS or quick_torch
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
