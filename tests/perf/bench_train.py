"""What the train check and the whole cpu profile cost, against the least
anything could: a bare `python -c "import torch"` and a bare 2-rank torchrun
that only imports torch and joins a process group.

Prints: the two baselines, `preflight run --profile cpu --only train`, the
whole `preflight run --profile cpu` (shm, nccl, bandwidth, train), the
train check's own time from its report, and where the probe's time went on
its slowest rank (each part's seconds: model, data_parallel, each stage; the warm-up
steps), each a median over the runs.
Run: python tests/perf/bench_train.py [N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402

from preflight.gpuwork import launch  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
BARE_RANK = "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\ndist.destroy_process_group()\n"
ENV = {**os.environ, "PREFLIGHT_LOCK_FILE": os.path.join(tempfile.gettempdir(), "bench-train.lock")}


def main() -> None:
    own: dict[str, list[float]] = {}
    phases: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        rank = Path(tmp) / "bare_rank.py"
        rank.write_text(BARE_RANK)
        report = Path(tmp) / "r.json"

        def run(*args: str) -> None:
            p = subprocess.run([sys.executable, "-m", "preflight", "run", "--profile", "cpu", *args, "--report", str(report)], env=ENV, capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
            for c in json.loads(report.read_text())["checks"]:
                own.setdefault(c["check"], []).append(c["duration_seconds"])
                if c["check"] == "train":
                    reps = [o["report"] for o in c["details"]["ranks"] if o.get("report")]
                    slowest = max(reps, key=lambda rep: rep.get("seconds") or 0)
                    for part, secs in (slowest.get("phases") or {}).items():
                        phases.setdefault(part, []).append(secs)
                    for i, secs in enumerate(slowest.get("warmup_seconds") or []):
                        phases.setdefault(f"  warm-up step {i + 1}", []).append(secs)

        print(f"{'':<52} {'median':>10} {'min':>10} {'max':>10}   (n={N})")
        timing.timed('python -c "import torch"', lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True), N)
        timing.timed("torchrun, 2 gloo ranks: import torch + init", lambda: subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--master-port", str(launch.free_port()), "--nproc-per-node", "2", str(rank)], check=True, capture_output=True, cwd=tmp), N)
        timing.timed("preflight run --profile cpu --only train", lambda: run("--only", "train"), N)
        own.clear()
        timing.timed("preflight run --profile cpu (shm, nccl, bandwidth, train)", lambda: run(), N)
    for check, secs in own.items():
        print(f"  {check:<12} {sorted(secs)[len(secs) // 2]:6.2f} s (median of the whole run's {len(secs)})")
    print("the train probe's parts on its slowest rank (median of every run's, --only train and whole):")
    for part, secs in phases.items():
        print(f"  {part:<20} {sorted(secs)[len(secs) // 2]:6.3f} s  (min {min(secs):.3f}, max {max(secs):.3f}, n={len(secs)})")


if __name__ == "__main__":
    main()
