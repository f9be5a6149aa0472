"""What the nccl check costs over the least anyone could do.

The baseline is the usual hand-rolled smoke test: torchrun, two gloo ranks,
init_process_group and one all_reduce. Against it: the smoke worker through
preflight's launcher (13 checked ops at 4 KiB and 32 MiB, per-rank reports,
the sweep), and the whole `preflight run --profile cpu --only nccl`. The
target is a ratio of about 1.3 or less: `import torch` in each rank
dominates both. Run: python tests/perf/bench_nccl.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import timing  # noqa: E402

from preflight.gpuwork import launch  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
MINIMAL = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1024)
dist.all_reduce(x)
assert x[0].item() == dist.get_world_size()
dist.destroy_process_group()
"""
ENV = {**os.environ, "PREFLIGHT_LOCK_FILE": os.path.join(tempfile.gettempdir(), "bench-nccl.lock")}


def minimal(script: Path) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(launch.free_port()), str(script)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def smoke() -> None:
    worker = launch.Worker("nccl_smoke.py", ["--backend", "gloo", "--device", "cpu"], nproc=2)
    done = launch.start(sys.executable, worker, 120).wait()
    assert done.returncode == 0 and len(done.reports) == 2, done.log_tail


def preflight_run() -> None:
    p = subprocess.run([sys.executable, "-m", "preflight", "run", "--profile", "cpu", "--only", "nccl", "--scratch"], env=ENV, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "minimal.py"
        script.write_text(MINIMAL)
        runs = {
            "torchrun + init + one all_reduce (2 gloo ranks)": lambda: minimal(script),
            "nccl_smoke via preflight's launcher": smoke,
            "preflight run --profile cpu --only nccl": preflight_run,
        }
        # Round-robin, so a noisy neighbour slows all three alike rather than one.
        times: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(N):
            for label, fn in runs.items():
                times[label].append(timing.timed(label, fn, 1))
    base, worker, whole = (statistics.median(t) for t in times.values())
    print(f"medians of {N} (s): minimal {base:.2f}, launcher + smoke {worker:.2f}, whole run {whole:.2f} ({os.cpu_count()} CPUs)")
    print(f"ratio, launcher + smoke worker / minimal: {worker / base:.2f}")
    print(f"ratio, whole preflight run / minimal:     {whole / base:.2f}")


if __name__ == "__main__":
    main()
