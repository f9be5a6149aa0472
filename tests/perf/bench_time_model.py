"""The time model's costs, measured on the machine at hand, and its projection of
the standard level on 1, 2, 4 and 8 GPUs (tests/perf/time_model.py).

Measured here, on any machine (medians of --rounds runs, each a child with a
deadline, past which, and on SIGTERM or SIGINT, it is ended with every process
it started: tests/perf/timing.py):
  torch_import        `python -c "import torch"` less `python -c pass`
  torchrun_overhead   a torchrun of one rank that imports nothing (the launcher's own start and the rank's)
  agent_start         `preflight run --level quick` less its report's duration (start-up before the plan, the exit)
  shm_small           that run's shm check (the quick level's segment)
and on a GPU node (torch sees CUDA) also:
  topology, firmware  the same quick run's topology and firmware checks
  cuda_context        the first CUDA tensor of a fresh process
  pinned_alloc        the profile's host_bytes of pinned host memory
  h2d_copy, d2h_copy  a GiB's share of a pinned copy of host_bytes (median of 10)
  hbm_copy_step       the profile's copy_bytes copied on the GPU, warm-up and repeats
  nccl_init_1         a one-rank NCCL group's init and first all_reduce
What this machine cannot measure comes from the H200 run's reports (time_model.RUN, each cited);
on CPU a cost both give keeps the larger (time_model.merge).

    python tests/perf/bench_time_model.py [--rounds 3] [--profile h200-sxm] [--record PATH]

--record writes the measured costs (tests/fixtures/time_model/costs-ci-vm.json is
what docs/ARCHITECTURE.md's table is made from). Exits 1 when the 8-GPU projection
is past 45 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import time_model as tm  # noqa: E402
import timing  # noqa: E402

from preflight.gpuwork import launch  # noqa: E402

PY = sys.executable
DEADLINE = 120.0  # any one child: far past what each takes, short of a hung one

GPU_PROBE = r"""
import json, sys, time
t = time.perf_counter()
import torch
out = {"import": time.perf_counter() - t}
host, copy = int(sys.argv[1]), int(sys.argv[2])
t = time.perf_counter(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize(); out["cuda_context"] = time.perf_counter() - t
t = time.perf_counter(); h = torch.empty(host, dtype=torch.uint8, pin_memory=True); h.fill_(1); out["pinned_alloc"] = time.perf_counter() - t
d = torch.empty(host, dtype=torch.uint8, device="cuda:0")
def timed(fn, n):
    fn(); torch.cuda.synchronize(); ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / 1e3)
    return ts
gib = float(1 << 30)
out["h2d_copy"] = sorted(timed(lambda: d.copy_(h, non_blocking=True), 10))[5] * gib / host
out["d2h_copy"] = sorted(timed(lambda: h.copy_(d, non_blocking=True), 10))[5] * gib / host
t = time.perf_counter()
src = torch.empty(copy, dtype=torch.uint8, device="cuda:0").random_(); dst = torch.empty_like(src)
timed(lambda: dst.copy_(src), 13)
out["hbm_copy_step"] = time.perf_counter() - t
print(json.dumps(out))
"""

NCCL_PROBE = r"""
import json, os, time, torch, torch.distributed as dist
torch.cuda.set_device(0)
t = time.perf_counter()
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
print(json.dumps({"nccl_init_1": time.perf_counter() - t}))
dist.destroy_process_group()
"""


def run(argv: list[str], env: dict | None = None, timeout: float = DEADLINE) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of a child in its own session; on the deadline it is ended with
    every process below it (timing.run: a hung torchrun's ranks too)."""
    ran = timing.run(argv, timeout, env)
    if ran.killed:
        sys.exit(f"bench_time_model: {' '.join(argv[:6])} ran past {timeout:.0f} s and was killed")
    p = ran.done
    if p.returncode not in (0, 1):  # 1: a check failed on a busy machine: still a verdict, still timed
        sys.exit(f"bench_time_model: {' '.join(argv[:6])} exited {p.returncode}: {p.stderr[-2000:]}")
    return ran.seconds, p


def gpu_present() -> bool:
    _, p = run([PY, "-c", "import torch; print(torch.cuda.device_count())"])
    return p.stdout.strip().isdigit() and int(p.stdout.strip()) > 0


def measure(rounds: int, profile: str, gpu: bool) -> dict[str, tm.Cost]:
    where = f"tests/perf/bench_time_model.py, {os.cpu_count()} CPUs, {'a GPU' if gpu else 'no GPU'}, {time.strftime('%Y-%m-%d', time.gmtime())}: median of {rounds}"
    samples: dict[str, list[float]] = {}
    add = lambda k, v: samples.setdefault(k, []).append(v)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-time-model-") as tmp:
        d = Path(tmp)
        (d / "noop.py").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        env["PREFLIGHT_LOCK_FILE"] = str(d / "lock")
        prof = tm.profiles.load(tm.profiles.find(profile, None))
        for i in range(rounds):
            py, _ = run([PY, "-c", "pass"])
            imp, _ = run([PY, "-c", "import torch"])
            add("torch_import", imp - py)
            tr, _ = run([PY, "-m", "torch.distributed.run", "--master-port", str(launch.free_port()), "--nproc-per-node", "1", str(d / "noop.py")])
            add("torchrun_overhead", tr)
            report = d / f"quick{i}.json"
            wall, _ = run([PY, "-m", "preflight", "run", "--profile", "auto" if gpu else "cpu", "--level", "quick", "--keep-going", "-q",
                           "--report", str(report)], env)
            r = json.loads(report.read_text())
            add("agent_start", wall - r["duration_seconds"])
            took = {c["check"]: c["duration_seconds"] for c in r["checks"]}
            add("shm_small", took["shm"])
            if gpu:
                add("topology", took["topology"])
                add("firmware", took["firmware"])
                _, p = run([PY, "-c", GPU_PROBE, str(prof.bandwidth.host_bytes), str(prof.bandwidth.copy_bytes)])
                for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items():
                    if k != "import":
                        add(k, v)
                (d / "nccl.py").write_text(NCCL_PROBE)
                _, p = run([PY, "-m", "torch.distributed.run", "--master-port", str(launch.free_port()), "--nproc-per-node", "1", str(d / "nccl.py")])
                add("nccl_init_1", json.loads(p.stdout.strip().splitlines()[-1])["nccl_init_1"])
            print(f"round {i + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in samples.items()), flush=True)
    return {k: tm.Cost(round(statistics.median(v), 4), f"{where} ({', '.join(f'{x:.3f}' for x in v)} s)", "measured")
            for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", default="h200-sxm", help="the profile whose plan and floors are projected")
    ap.add_argument("--record", type=Path, help="write the measured costs here (JSON)")
    args = ap.parse_args(argv)
    timing.guard()
    gpu = gpu_present()
    measured = measure(args.rounds, args.profile, gpu)
    if args.record:
        args.record.write_text(tm.dump_measured(measured, gpu, f"{platform.node()}, {os.cpu_count()} CPUs, {'GPU' if gpu else 'no GPU'}, {time.strftime('%Y-%m-%d', time.gmtime())}"))
        print(f"recorded {args.record}")
    report = tm.reports_costs()
    costs = tm.merge(report, measured, gpu)
    profile = tm.profiles.load(tm.profiles.find(args.profile, None))
    print(f"\nthe standard level of {args.profile}, projected (seconds):\n")
    print(tm.table(costs, report, profile))
    print("\n" + tm.sources(costs))
    eight = tm.total(tm.project(8, costs, profile))
    print(f"\n8 GPUs: {eight:.1f} s (goal {tm.GOAL_8_GPUS:.0f} s)")
    return 0 if eight <= tm.GOAL_8_GPUS else 1


if __name__ == "__main__":
    sys.exit(main())
