"""Fidelity of the bandwidth check: the same quantity measured by the check's
worker and by an independent plain loop, side by side, in one run.

CPU (always): host memcpy (a plain `dst.copy_(src)` loop, one thread, as
torchrun gives each rank OMP_NUM_THREADS=1) and gloo all_reduce bus
bandwidth (a minimal torchrun script timing back-to-back all_reduce).
GPU (when torch sees CUDA): HBM copy against a plain CUDA-event copy loop,
and all_reduce busbw against nccl-tests' all_reduce_perf when it is on PATH,
else a plain CUDA-event all_reduce loop under torchrun.

Each round prints both figures and their ratio, and how many repeats the
worker's figures took until they were sure (or capped); after 3 rounds, the
spread of the ratios. Target: every ratio within 1 +- 0.05 for large messages.
Also prints the whole check's own time (`preflight run --only bandwidth`).
Run: python tests/perf/bench_bandwidth.py [ROUNDS]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from preflight.checkkit import bandwidth_figures

from preflight.gpuwork import launch
from preflight.readers.nccl import nccltests

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
# Large messages, as the target asks: 256 MiB copies (a 512 MiB footprint,
# past any L3, so neither side is flattered by the cache) and 128 MiB gloo
# all_reduce; on GPUs the profiles' own sizes.
CPU = {"copy": 256 << 20, "collective": 128 << 20, "ranks": 2}
GPU = {"copy": 1 << 30, "collective": 4 << 30}
REPEATS = 20  # the reference loops' repeats, and the worker's least (it repeats on until its median is sure)

COPY_LOOP = """
import sys, time, torch
n, reps, cuda = int(sys.argv[1]) // 4, int(sys.argv[2]), sys.argv[3] == "cuda"
dev = "cuda" if cuda else "cpu"
src = torch.empty(n, device=dev).uniform_(1, 2); dst = torch.empty(n, device=dev)
for _ in range(3): dst.copy_(src)
if cuda:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); a.record()
    for _ in range(reps): dst.copy_(src)
    b.record(); b.synchronize(); sec = a.elapsed_time(b) / 1e3 / reps
else:
    t = time.perf_counter()
    for _ in range(reps): dst.copy_(src)
    sec = (time.perf_counter() - t) / reps
print(2 * n * 4 / sec)
"""

ALLREDUCE_LOOP = """
import os, sys, time, torch, torch.distributed as dist
n, reps, cuda = int(sys.argv[1]) // 4, int(sys.argv[2]), sys.argv[3] == "cuda"
dist.init_process_group("nccl" if cuda else "gloo")
w, r = dist.get_world_size(), dist.get_rank()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda: torch.cuda.set_device(dev)
x = torch.empty(n, device=dev).uniform_(1, 2)
for _ in range(3): dist.all_reduce(x)
dist.barrier()
if cuda: torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(reps): dist.all_reduce(x)
if cuda: torch.cuda.synchronize()
sec = (time.perf_counter() - t) / reps
if r == 0: print(n * 4 / sec * 2 * (w - 1) / w)
dist.destroy_process_group()
"""


def worker_figures(gpu: bool, nproc: int) -> dict[str, float]:
    """The check's own worker and arithmetic: the weakest copy figure and the all_reduce busbw."""
    sizes = GPU if gpu else CPU
    copy = "hbm_copy" if gpu else "memcpy"
    args = ["--backend", "nccl" if gpu else "gloo", "--device", "cuda" if gpu else "cpu", "--steps", f"{copy},all_reduce",
            "--copy-bytes", str(sizes["copy"]), "--collective-bytes", str(sizes["collective"]), "--repeats", str(REPEATS), "--warmup", "3"]  # fmt: skip
    from preflight.gpuwork import ranks

    facts = bandwidth_figures.BandwidthFacts(python=sys.executable, backend="nccl" if gpu else "gloo", nproc=nproc)
    ranks.collect(facts, launch.Worker("bandwidth.py", args, nproc=nproc), bandwidth_figures.RankReport, dict(os.environ), 300, None)
    figs = bandwidth_figures.figures(facts)
    assert figs, facts.log_tail
    # One rank's copy (they run one at a time) is the quantity the plain loop measures: the median over ranks.
    copies = [f.value for f in figs if f.name == f"{copy}_bandwidth"]
    for f in figs:
        sure = f"+-{f.ci:.1%}" if f.ci is not None else "no interval"
        print(f"  worker {f.name:<24} {f.where:<8} {f.repeats:3d} repeats  95% interval {sure}  {'converged' if f.converged else 'not converged: ' + str(f.stopped)}", flush=True)
    return {"copy": statistics.median(copies), "all_reduce": next(f.value for f in figs if f.name == "allreduce_bus_bandwidth")}


def reference(gpu: bool, nproc: int, tmp: Path) -> dict[str, float]:
    sizes = GPU if gpu else CPU
    dev = "cuda" if gpu else "cpu"
    (tmp / "ref_copy.py").write_text(COPY_LOOP)
    (tmp / "ref_allreduce.py").write_text(ALLREDUCE_LOOP)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    copy = float(subprocess.run([sys.executable, str(tmp / "ref_copy.py"), str(sizes["copy"]), str(REPEATS), dev], check=True, capture_output=True, text=True, env=env).stdout)
    tool = shutil.which("all_reduce_perf")
    if gpu and tool:
        size = str(sizes["collective"])
        out = subprocess.run([tool, "-b", size, "-e", size, "-g", str(nproc), "-w", "5", "-n", str(REPEATS)], check=True, capture_output=True, text=True).stdout
        row = nccltests.parse(out).rows[-1]
        busbw = row.out_of_place.busbw_gbps * 1e9
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--master-port", str(launch.free_port()), "--nproc-per-node", str(nproc), str(tmp / "ref_allreduce.py"), str(sizes["collective"]), str(REPEATS), dev]
        out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=tmp).stdout
        busbw = float(out.strip().splitlines()[-1])
    return {"copy": copy, "all_reduce": busbw}


def check_time(profile: str) -> tuple[float, float]:
    env = {**os.environ, "PREFLIGHT_LOCK_FILE": os.path.join(tempfile.gettempdir(), "bench-bandwidth.lock")}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "preflight", "run", "--profile", profile, "--only", "bandwidth", "--report", str(report)], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        assert report.exists(), p.stderr
        check = next(c for c in json.loads(report.read_text())["checks"] if c["check"] == "bandwidth")
        return wall, check["duration_seconds"]


def main() -> None:
    import torch

    gpu = torch.cuda.is_available()
    nproc = torch.cuda.device_count() if gpu else CPU["ranks"]
    ref_name = "nccl-tests all_reduce_perf" if gpu and shutil.which("all_reduce_perf") else "plain torch.distributed loop"
    print(f"{'GPU' if gpu else 'CPU'} path, {nproc} ranks; reference all_reduce: {ref_name}; {ROUNDS} rounds", flush=True)
    ratios: dict[str, list[float]] = {"copy": [], "all_reduce": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ROUNDS):
            ours, ref = worker_figures(gpu, nproc), reference(gpu, nproc, Path(tmp))
            for k in ratios:
                ratios[k].append(ours[k] / ref[k])
                print(f"round {i + 1} {k:<11} check {ours[k] / 1e9:9.3f} GB/s   reference {ref[k] / 1e9:9.3f} GB/s   ratio {ours[k] / ref[k]:.3f}", flush=True)
    for k, rs in ratios.items():
        ok = all(abs(r - 1) <= 0.05 for r in rs)
        print(f"{k:<11} ratio median {statistics.median(rs):.3f}  min {min(rs):.3f}  max {max(rs):.3f}  spread {max(rs) - min(rs):.3f}  within +-5%: {'yes' if ok else 'NO'}")
    wall, own = check_time("auto" if gpu else "cpu")
    print(f"preflight run --only bandwidth: {wall:.2f} s wall, the check itself {own:.2f} s")


if __name__ == "__main__":
    main()
