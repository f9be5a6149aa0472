"""Bandwidth probe on every rank: what training speed depends on, measured
the way the reference tools measure it, timed and reported raw.

On GPUs (NCCL): HBM copy on every GPU, pinned host<->device copies one GPU
at a time (as nvbandwidth does: a PCIe switch shared by two GPUs must not
halve the figure; the buffers pinned by every rank at once, before the turns),
copy-engine GPU->GPU copies for every ordered pair, one pair at a time from
local rank 0's process over every GPU (as nvbandwidth does), large
all_reduce, all_gather and reduce_scatter, small all_reduce latency, and the
same latency inside a CUDA graph. On CPU (gloo): host memcpy, one rank at a
time so ranks do not share the memory bus, and the same collectives.

Method, for every figure: random data in [1, 2) (never zeros: A100 and
later compress zeros), buffer sets rotated so the footprint between reuses is
at least twice the last-level cache, warm-up excluded, every timed repeat
reported so the agent takes the median and the spread. A figure repeats past
--repeats until the 95% interval of its median is within --tolerance, or until
--max-repeats or --max-seconds (_converge.py); ranks that must run alike decide
together, between repeats. GPU times come from
CUDA events; a collective repeat starts after a barrier. Sizes that do not
fit the memory free now are clamped, and the report says so.

The rank writes rank{N}.json into --out after every step, and between timed
regions what it does within one ("doing": the size, the peer, "alone" while
the others wait their turn) for the agent's live line; its output goes to
rank{N}.log. The agent does the arithmetic (checks/bandwidth.py). Standard
library and torch only. By hand:

    torchrun --nproc-per-node 8 bandwidth.py
    torchrun --nproc-per-node 2 bandwidth.py --backend gloo --device cpu

The steps are Bench's, made of three sibling modules: the copies
(_bw_copies.py), the collectives and latency (_bw_collectives.py), and the
timing, turns and buffers under both (_bw_bench.py); the NUMA binding is
_bw_machine.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _bw_bench
import _bw_collectives
import _bw_copies
import _rank
from _bw_machine import bind

GPU_STEPS = ("hbm_copy", "h2d", "d2h", "p2p", "all_reduce", "all_gather", "reduce_scatter", "latency", "graph_latency")
CPU_STEPS = ("memcpy", "all_reduce", "all_gather", "reduce_scatter", "latency")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for rank{N}.json and rank{N}.log (default: print a summary per rank)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--steps", help="comma-separated steps to run (default: all for the device)")
    p.add_argument("--copy-bytes", type=int, default=1 << 30, help="HBM copy (GPU) or memcpy (CPU) buffer")
    p.add_argument("--host-bytes", type=int, default=256 << 20, help="pinned host buffer for h2d/d2h")
    p.add_argument("--p2p-bytes", type=int, default=256 << 20)
    p.add_argument("--collective-bytes", type=int, default=1 << 30, help="all_reduce buffer; all_gather output; reduce_scatter input")
    p.add_argument("--small-bytes", type=int, default=4096, help="the latency step's all_reduce")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10, help="timed repeats of each figure at least")
    p.add_argument("--latency-iters", type=int, default=200, help="timed latency iterations at least")
    p.add_argument("--tolerance", type=float, default=0.02, help="repeat until the 95%% interval of the median is within this fraction of it")
    p.add_argument("--max-repeats", type=int, default=30, help="or until this many timed repeats")
    p.add_argument("--max-latency-iters", type=int, default=1000, help="or this many latency iterations")
    p.add_argument("--max-seconds", type=float, default=2.0, help="or until a figure has taken this long (its warm-up included)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds init and each collective may take before the rank gives up")
    p.add_argument("--bind", default="{}", help='JSON {"LOCAL_RANK": {"node": N, "cpus": "0-55"}}: pin each rank to its GPU\'s NUMA node')
    p.add_argument("--reading", type=int, default=1, help="which launch this is: 2 when the check measures again to confirm a figure beyond its floor")
    args = p.parse_args(argv)

    steps = [s for s in (args.steps or "").split(",") if s] or list(GPU_STEPS if args.device == "cuda" else CPU_STEPS)
    me, report, save, fault = _rank.begin(args.out, steps[0], reading=args.reading, backend=args.backend, device=args.device, steps=steps, step=0,
                                          results=[], binding=None, step_seconds={})

    def body() -> int:
        # Before torch starts its threads, so they inherit the binding, and before any buffer is allocated.
        report["binding"] = bind(json.loads(args.bind).get(str(me.local_rank)))
        return run(args, me, steps, report, save, fault)

    return _rank.guarded(body, report, save)


def run(args, me: _rank.Rank, steps: list[str], report: dict, save, fault: _rank.Fault) -> int:
    t0 = time.perf_counter()
    started = _rank.start_torch(args.device, me.local_rank, report, save)
    if started is None:
        return 1
    torch, dist, device = started
    save()
    t = time.perf_counter()
    # No blocking wait: it polls with a sleep (1-10 ms) that would land inside every
    # timed region. Waits here spin on a CUDA event with their own deadline instead
    # (Bench._finish), inside the process group's timeout, so a rank still gives up first and says so.
    # gloo has no such wait to do: its own timeout is the rank's.
    _rank.init_group(dist, args.backend, device, args.timeout)
    report["init_seconds"] = round(time.perf_counter() - t, 4)

    def note(**facts) -> None:
        """What the rank does within its step ("doing": bytes, peer, alone while the others
        wait), for the agent's live line; never called inside a timed region."""
        report["doing"] = {**(report.get("doing") or {}), **facts} if facts else None
        save()

    def waiting(where: str | None) -> None:
        """Where the rank waits for its peers (None: it does not), so the agent tells a rank hung
        there, waiting for another, from the one it waits for."""
        report["waiting"] = where
        save()

    bench = Bench(torch, dist, device, me, args, note, waiting)
    report["cache_bytes"] = bench.cache
    for name in steps:
        report.update(stage=name, doing=None)
        save()
        bench.slow = fault.at(name) == "slow"
        bench.factor = fault.values.get(name)  # slow=F: the factor; None: plain slow
        bench.pause = fault.pauses.get(name)  # slow=Ns: seconds a repeat, whatever it took
        t = time.perf_counter()
        report["results"].extend(getattr(bench, name)())
        report["step_seconds"][name] = round(time.perf_counter() - t, 4)  # where the budget goes
        report["setup"] = bench.setup
        report["step"] += 1
        save()
    report.update(stage="done", doing=None, seconds=round(time.perf_counter() - t0, 4))
    save()
    if args.out is None:  # by hand: one line per rank, each a step's median
        line = {"rank": me.rank, **{_label(r): _median_rate(r) for r in report["results"]}}
        os.write(1, (json.dumps(line)[:3000] + "\n").encode())
    _rank.end_group(dist)
    return 0


class Bench(_bw_copies.Copies, _bw_collectives.Collectives, _bw_bench.BenchBase):
    """One method per step; each returns result dicts with every timed repeat."""


def _label(r: dict) -> str:
    if r.get("peer") is None:
        return r["step"]
    return r["step"] + (f" {r['src']}" if r.get("src") is not None else "") + f"->{r['peer']}"


def _median_rate(r: dict) -> str:
    s = sorted(r.get("seconds") or r.get("samples") or [])
    if not s:
        return r.get("error") or "none"
    mid = s[len(s) // 2]
    return f"{mid * 1e6:.1f} us" if "samples" in r or "moved_bytes" not in r else f"{r['moved_bytes'] / mid / 1e9:.2f} GB/s"


if __name__ == "__main__":
    _rank.exit_now(main())
