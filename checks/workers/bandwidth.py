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
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import platform
import sys
import time

import _converge
import _rank

GPU_STEPS = ("hbm_copy", "h2d", "d2h", "p2p", "all_reduce", "all_gather", "reduce_scatter", "latency", "graph_latency")
CPU_STEPS = ("memcpy", "all_reduce", "all_gather", "reduce_scatter", "latency")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
MAX_SETS = 8
HOST_BLOCK = 1_000_003  # values drawn at random for a host buffer, then repeated (Bench._random_elems)
FREE_SHARE = 0.7  # of the memory free now: NCCL's buffers and peers' contexts need the rest
# The slow fault sleeps this many times the repeat's own length, and at least
# SLOW_MIN seconds: a 64 MiB memcpy then reads under 1.4 GB/s on any machine.
# slow=F instead stretches each repeat to F times its length, slow=Ns sleeps N seconds (_rank.slow_seconds).
SLOW, SLOW_MIN = 3.0, 0.1


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


class Bench:
    """One method per step; each returns result dicts with every timed repeat."""

    def __init__(self, torch, dist, device, me: _rank.Rank, args, note=lambda **facts: None, waiting=lambda where: None):
        self.torch, self.dist, self.device, self.me, self.args = torch, dist, device, me, args
        self.note, self.waiting = note, waiting
        self.cuda = device.type == "cuda"
        self.slow = False
        self.factor: float | None = None  # slow=F's F
        self.pause: float | None = None  # slow=Ns's N
        self.alone = False  # measuring while the other ranks wait their turn: this rank decides its repeats alone
        self.setup: dict[str, dict] = {}  # step -> what was made before its timing, and how long it took (p2p's contexts)
        self.rule = _converge.Rule(args.tolerance, args.repeats, max(args.repeats, args.max_repeats), args.max_seconds)
        self.cache = _gpu_cache(torch, device) if self.cuda else _cpu_cache()
        self.flag = torch.ones(1, device=device)  # the barrier's all_reduce
        # Waiting out another rank's turn (every repeat of a measurement) takes longer
        # than one collective may: those barriers get a group with a turn's timeout.
        import datetime

        # A turn: warm-up and the least repeats, each within --timeout, then more repeats until
        # --max-seconds, the last of which may start just before it.
        turn = datetime.timedelta(seconds=args.timeout * (args.warmup + args.repeats + 1) + args.max_seconds)
        self.turns = dist.new_group(backend="gloo", timeout=turn)
        self.gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.scatter_fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    # -- copies within one device -----------------------------------------------

    def hbm_copy(self) -> list[dict]:
        return self._copy("hbm_copy")

    def memcpy(self) -> list[dict]:
        # One rank at a time: ranks share the memory bus. torchrun gives each rank
        # OMP_NUM_THREADS=1, so this is one core's copy bandwidth.
        return self._copy("memcpy", in_turn=True)

    def _copy(self, step: str, in_turn: bool = False) -> list[dict]:
        nbytes, clamped = self._fit(step, self.args.copy_bytes, 2)
        self.note(bytes=nbytes)
        sets = self._sets(2 * nbytes)
        # Filled and touched by every rank at once, before the turns: a host's first write
        # to a page costs more than the copy (64 MiB: 0.1 s to fill, 0.04 s of page faults,
        # 7 ms a copy on the CI VM), and only the copies need the bus to themselves.
        srcs = [self._random(nbytes) for _ in range(sets)]
        dsts = [self._empty(nbytes).zero_() for _ in range(sets)]

        def measure() -> list[dict]:
            seconds, stopped = self._timed(lambda i: dsts[i % sets].copy_(srcs[i % sets]))
            # Read once and written once: bytes moved is twice the buffer, as nvbandwidth and DCGM count a copy.
            return [self._result(step, nbytes, 2 * nbytes, seconds, sets, clamped, stopped)]

        return self._in_turn(measure) if in_turn else measure()

    # -- host <-> device ------------------------------------------------------

    def h2d(self) -> list[dict]:
        return self._host_copy("h2d")

    def d2h(self) -> list[dict]:
        return self._host_copy("d2h")

    def _host_copy(self, step: str) -> list[dict]:
        nbytes, clamped = self._fit(step, self.args.host_bytes, 1)
        self.note(bytes=nbytes)
        sets = self._sets(nbytes)
        # Made and filled by every rank at once, before the turns: pinning host memory
        # (cudaHostAlloc) took 0.3-0.6 s a rank, 8 in series when each rank pinned inside its
        # own turn; only the copies need the PCIe path to themselves.
        dev = [self._random(nbytes) for _ in range(sets)]
        host = [self.torch.empty(nbytes // 4, dtype=self.torch.float32, pin_memory=True) for _ in range(sets)]
        for h, d in zip(host, dev):
            h.copy_(d)  # random host data too, filled on the GPU (filling 1 GiB on a CPU core takes a second)

        def measure() -> list[dict]:
            if step == "h2d":
                seconds, stopped = self._timed(lambda i: dev[i % sets].copy_(host[i % sets], non_blocking=True))
            else:
                seconds, stopped = self._timed(lambda i: host[i % sets].copy_(dev[i % sets], non_blocking=True))
            return [self._result(step, nbytes, nbytes, seconds, sets, clamped, stopped)]

        out = self._in_turn(measure)
        # Back to torch's caching host allocator, which keeps them pinned: the next host step
        # (d2h after h2d, the same sizes) takes them from there instead of pinning again.
        host.clear()
        dev.clear()
        return out

    def _in_turn(self, measure) -> list[dict]:
        """Each local rank measures alone while the others wait at a barrier."""
        out: list[dict] = []
        for turn in range(self.me.local_world_size):
            self._turn_barrier()
            if turn == self.me.local_rank:
                self.note(alone=True)
                self.alone = True
                out = measure()
                self.alone = False
                self.note()
        self._turn_barrier()
        return out

    def _turn_barrier(self) -> None:
        """The barrier between turns, whose deadline is a whole turn's (longer than the check may
        have left): said while the rank is in it, a rank that waits here is told from the one it waits for."""
        self.waiting("the barrier between turns")
        self._sync(turn=True)
        self.waiting(None)



    # -- GPU -> GPU -------------------------------------------------------------

    def p2p(self) -> list[dict]:
        """Copy-engine writes between every ordered pair of GPUs, one pair at a time across the
        node, as nvbandwidth measures them (the floors cite it): a pair copying while others do
        would share NVSwitch or PCIe uplinks. As in nvbandwidth, one process drives every GPU:
        local rank 0 opens one context on each other GPU and makes every buffer before any
        timing, so no pair pays for a context (a rank per pair did: 56 contexts one after the
        other on 8 GPUs, ~0.13 s each) and each GPU keeps at most one foreign context, rank 0's,
        for the rest of the launch, not one per peer. The other ranks wait at a barrier before
        each pair, each with a turn's deadline, as they waited out each other's turns before."""
        n = min(self.me.local_world_size, self.torch.cuda.device_count())
        driver = self.me.local_rank == 0
        self._sync(turn=True)
        held = self._p2p_buffers(n) if driver and n > 1 else None
        out = []
        for src, dst in pairs(n):
            self._sync(turn=True)
            if held is not None:
                self.note(alone=True, src=src, peer=dst)
                self.alone = True
                out.append(self._p2p_pair(held, src, dst))
                self.alone = False
                self.note()
        self._sync(turn=True)
        if held is not None:
            held.clear()
            self.torch.cuda.empty_cache()  # every GPU's cached blocks: the next stages (train, memtest) need the room
        return out

    def _p2p_buffers(self, n: int) -> dict:
        """Local rank 0's context on each other GPU (a CUDA call on a device opens this
        process's context there), then a source and a destination per set on every GPU:
        each GPU is the source of n-1 pairs and the destination of n-1. Says in the report
        how long each took."""
        torch = self.torch
        t = time.perf_counter()
        free = [int(torch.cuda.mem_get_info(torch.device("cuda", i))[0]) for i in range(n)]  # opens the contexts, one after the other
        opened = time.perf_counter() - t
        # Kept until the process ends (CUDA has no way to close a primary context torch opened):
        # later stages of a shared launch (memtest) say so.
        _rank.WORLD.setdefault("contexts_elsewhere", set()).update(range(1, n))
        least = min(range(n), key=lambda i: free[i])
        # Two buffers of the size on each GPU (its source and its destination), two sets at least.
        nbytes, clamped = fit("p2p", self.args.p2p_bytes, 2, free[least], f"cuda:{least} (the least free of {n} GPUs)")
        sets = self._sets(nbytes)
        t = time.perf_counter()
        gpus = [torch.device("cuda", i) for i in range(n)]
        srcs = [[torch.empty(nbytes // 4, dtype=torch.float32, device=g).uniform_(1.0, 2.0) for _ in range(sets)] for g in gpus]
        dsts = [[torch.empty(nbytes // 4, dtype=torch.float32, device=g) for _ in range(sets)] for g in gpus]
        for g in gpus:
            torch.cuda.synchronize(g)
        self.setup["p2p"] = {"by": "local rank 0", "gpus": n, "contexts": n - 1, "contexts_seconds": round(opened, 4),
                             "buffers_seconds": round(time.perf_counter() - t, 4), "bytes_per_gpu": 2 * sets * nbytes}
        return {"srcs": srcs, "dsts": dsts, "bytes": nbytes, "sets": sets, "clamped": clamped}

    def _p2p_pair(self, held: dict, src: int, dst: int) -> dict:
        torch = self.torch
        nbytes, sets = held["bytes"], held["sets"]
        srcs, dsts = held["srcs"][src], held["dsts"][dst]
        access = bool(torch.cuda.can_device_access_peer(src, dst))
        self.note(bytes=nbytes, src=src, peer=dst)
        on = torch.device("cuda", src)
        # torch copies between GPUs on the source's current stream: its events time the copy.
        with torch.cuda.device(on):
            seconds, stopped = self._timed(lambda i: dsts[i % sets].copy_(srcs[i % sets], non_blocking=True), on=on)
        result = self._result("p2p", nbytes, nbytes, seconds, sets, held["clamped"], stopped)
        result.update(src=src, peer=dst, peer_access=access, src_pci_bus_id=_rank.pci_bus_id(torch.cuda.get_device_properties(src)),
                      peer_pci_bus_id=_rank.pci_bus_id(torch.cuda.get_device_properties(dst)))
        return result

    # -- collectives --------------------------------------------------------------

    def all_reduce(self) -> list[dict]:
        return self._collective("all_reduce", 1, lambda b: (b, None), lambda b, _: self.dist.all_reduce(b, async_op=True))

    def all_gather(self) -> list[dict]:
        w = self.me.world_size
        return self._collective("all_gather", 1 + 1 / w, lambda b: (b, self._random_elems(b.numel() // w)), lambda out, mine: self.gather_fn(out, mine, async_op=True))

    def reduce_scatter(self) -> list[dict]:
        w = self.me.world_size
        return self._collective("reduce_scatter", 1 + 1 / w, lambda b: (self._empty_elems(b.numel() // w), b), lambda out, mine: self.scatter_fn(out, mine, async_op=True))

    def _collective(self, step: str, per_byte: float, make, op) -> list[dict]:
        """``bytes`` is the whole buffer (all_gather's output, reduce_scatter's
        input), the size nccl-tests prints; every rank uses the size the tightest one can hold."""
        w = self.me.world_size
        nbytes, clamped = self._fit(step, self.args.collective_bytes, per_byte)
        nbytes = self._agree(nbytes - nbytes % (4 * w))
        self.note(bytes=nbytes)
        sets = self._sets(int(nbytes * per_byte))
        buffers = [make(self._random(nbytes)) for _ in range(sets)]

        def once(i: int) -> None:
            a, b = buffers[i % sets]
            op(a, b).wait()  # gloo: done; NCCL: the current stream now waits for NCCL's

        seconds, stopped = self._timed(once, barrier=True)
        return [self._result(step, nbytes, nbytes, seconds, sets, clamped, stopped)]

    def latency(self) -> list[dict]:
        """Blocking small all_reduce: each iteration waits for its result, as a
        training step's small gradient buckets and loss reductions do. MAX, not
        SUM: hundreds of in-place sums over 8 ranks would overflow to inf, and at
        a few KiB the reduction's arithmetic costs nothing either way. At least
        --latency-iters (the p99 needs them), then more until each rank's p50 is sure;
        every rank runs as many as the one that needs most."""
        x = self._random(self.args.small_bytes)
        self.note(bytes=x.numel() * 4)

        def once(i: int) -> float:
            t = time.perf_counter()
            self._blocking(x)
            if self.slow:
                time.sleep(_rank.slow_seconds(time.perf_counter() - t, self.factor, SLOW, SLOW_MIN, self.pause))
            return round(time.perf_counter() - t, 9)

        a = self.args
        rule = _converge.Rule(a.tolerance, a.latency_iters, max(a.latency_iters, a.max_latency_iters), a.max_seconds)
        samples, stopped = _converge.repeat(once, rule, max(10, a.warmup), agree=self._more)
        return [{"step": "latency", "bytes": x.numel() * 4, "samples": samples, "sets": 1, **self._sure(stopped)}]

    def _blocking(self, x) -> None:
        self.dist.all_reduce(x, op=self.dist.ReduceOp.MAX, async_op=True).wait()
        self._finish("the small all_reduce")

    def _sync(self, turn: bool = False) -> None:
        """A barrier with a deadline. Between turns, on a gloo group of its own whose
        timeout is a whole turn's (every other collective keeps --timeout); otherwise
        NCCL's flag all_reduce with --timeout (NCCL's own barrier syncs the device with
        none), or gloo's barrier."""
        if turn:
            self.dist.barrier(group=self.turns)
        elif self.cuda:
            self.dist.all_reduce(self.flag, op=self.dist.ReduceOp.MAX, async_op=True).wait()
            self._finish("a barrier")
        else:
            self.dist.barrier()

    def _finish(self, what: str, event=None) -> None:
        """Wait until the GPU has done what was queued (or ``event``), spinning, with
        --timeout as the deadline (_rank.wait_for_gpu); on the CPU there is nothing queued."""
        if self.cuda:
            _rank.wait_for_gpu(self.torch, self.args.timeout, what, event)

    def graph_latency(self) -> list[dict]:
        """The small all_reduce captured in a CUDA graph and replayed: launch cost
        gone, what is left is NCCL and the links. Information, not judged."""
        torch, k = self.torch, 20
        x = self._random(self.args.small_bytes)
        self.note(bytes=x.numel() * 4)
        error = None
        mx = self.dist.ReduceOp.MAX  # replays of in-place sums would overflow
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # NCCL needs eager calls on the communicator before capture
                    self.dist.all_reduce(x, op=mx)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(k):
                    self.dist.all_reduce(x, op=mx)
        except Exception as e:  # noqa: BLE001 - an old NCCL or torch cannot capture: say why, move on
            error = f"{type(e).__name__}: {e}".strip()[:300]
        # Replay only if every rank captured: a lone replay would wait forever for its peers.
        ok = torch.tensor([0.0 if error else 1.0], device=self.device)
        self.dist.all_reduce(ok, op=self.dist.ReduceOp.MIN, async_op=True).wait()
        self._finish("agreeing on the graph")
        if error or not ok.item():
            return [{"step": "graph_latency", "bytes": x.numel() * 4, "error": error or "another rank could not capture the graph", "sets": 1}]
        seconds, stopped = self._timed(lambda i: graph.replay(), barrier=True)
        return [{"step": "graph_latency", "bytes": x.numel() * 4, "ops_per_repeat": k, "seconds": seconds, "sets": 1, **self._sure(stopped)}]

    # -- timing ----------------------------------------------------------------------

    def _timed(self, fn, barrier: bool = False, on=None) -> tuple[list[float], str]:
        """Seconds of each timed repeat of ``fn(i)``, warm-up excluded, until the median
        is sure or a cap is reached; and why it stopped. ``barrier``: a collective, each
        repeat started together and judged by its slowest rank, so every rank decides alike.
        Alone in its turn a rank decides for itself; otherwise (each GPU its own copy, at
        the same time) the ranks go on while any needs to, so they leave the step together.
        ``on``: the GPU whose stream runs ``fn`` (the source of a P2P copy), else this rank's."""

        def once(i: int) -> float:
            if barrier:
                self._sync()
            return round(self._once(fn, i, on or self.device), 9)

        if barrier:
            return _converge.repeat(once, self.rule, self.args.warmup, slowest=self._max)
        return _converge.repeat(once, self.rule, self.args.warmup, agree=None if self.alone else self._more)

    def _max(self, values: list[float]) -> list[float]:
        """The element-wise maximum over every rank, between timed repeats."""
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, async_op=True).wait()
        self._finish("agreeing on more repeats")
        return t.tolist()

    def _more(self, flag: float) -> float:
        return self._max([flag])[0]

    def _once(self, fn, i: int, on) -> float:
        if self.cuda:
            start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            self.torch.cuda.synchronize(on)
            start.record()
        t = time.perf_counter()
        fn(i)
        if self.slow:
            if self.cuda:
                self.torch.cuda.synchronize(on)
            # Inside the timed region: with CUDA events too, the end is recorded after the sleep.
            time.sleep(_rank.slow_seconds(time.perf_counter() - t, self.factor, SLOW, SLOW_MIN, self.pause))
        if self.cuda:
            end.record()
            self._finish("a timed repeat", end)
            return start.elapsed_time(end) / 1e3
        return time.perf_counter() - t

    # -- buffers -----------------------------------------------------------------------

    def _random(self, nbytes: int):
        return self._random_elems(nbytes // 4)

    def _random_elems(self, n: int):
        x = self.torch.empty(n, dtype=self.torch.float32, device=self.device)
        if self.cuda or n <= HOST_BLOCK:
            return x.uniform_(1.0, 2.0)
        # A host core draws 6 ns a value (0.1 s for 64 MiB on the CI VM, half the bandwidth
        # step's time in fills): one block drawn, then copied along. Its length is a prime, so
        # no two pages of a buffer hold the same bytes for memory deduplication (KSM) to merge.
        block = self.torch.empty(HOST_BLOCK, dtype=self.torch.float32).uniform_(1.0, 2.0)
        full = n // HOST_BLOCK
        x[: full * HOST_BLOCK].view(full, HOST_BLOCK).copy_(block.expand(full, HOST_BLOCK))
        x[full * HOST_BLOCK :].copy_(block[: n - full * HOST_BLOCK])
        return x

    def _empty(self, nbytes: int):
        return self._empty_elems(nbytes // 4)

    def _empty_elems(self, n: int):
        return self.torch.empty(n, dtype=self.torch.float32, device=self.device)

    def _sets(self, footprint: int) -> int:
        """Buffer sets to rotate through, so the bytes touched between two uses of
        one set are at least twice the last-level cache."""
        return max(2, min(MAX_SETS, math.ceil(2 * self.cache / max(1, footprint))))

    def _fit(self, step: str, asked: int, per_byte: float) -> tuple[int, str | None]:
        return fit(step, asked, per_byte, self._free(), self._where())

    def _free(self) -> int | None:
        if self.cuda:
            return int(self.torch.cuda.mem_get_info(self.device)[0])
        available = _meminfo("MemAvailable")
        return available // max(1, self.me.local_world_size) if available else None

    def _where(self) -> str:
        return f"cuda:{self.device.index}" if self.cuda else "this host (per rank)"

    def _agree(self, nbytes: int) -> int:
        """The smallest size any rank can hold: a collective needs one size everywhere."""
        t = self.torch.tensor([nbytes], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN, async_op=True).wait()
        self._finish("agreeing on a size")
        return int(t.item())

    def _result(self, step: str, nbytes: int, moved: int, seconds: list[float], sets: int, clamped: str | None, stopped: str) -> dict:
        return {"step": step, "bytes": nbytes, "moved_bytes": moved, "seconds": seconds, "sets": sets, "clamped": clamped, **self._sure(stopped)}

    def _sure(self, stopped: str) -> dict:
        return {"stopped": stopped, "tolerance": self.args.tolerance}


def pairs(n: int) -> list[tuple[int, int]]:
    """Every ordered pair of n GPUs, (source, destination), in rounds: in round k each GPU
    writes to the one k after it. checks/bandwidth.py's p2p_plan counts them alike."""
    return [(src, (src + k) % n) for k in range(1, n) for src in range(n)]


def fit(step: str, asked: int, per_byte: float, free: int | None, where: str) -> tuple[int, str | None]:
    """The size to use: ``asked``, or less where ``per_byte`` x size x two sets
    do not fit in a share of the memory ``free`` now; and what was clamped, in words."""
    need = per_byte * asked * 2  # at least two sets
    nbytes = asked - asked % 4
    if free is None or need <= FREE_SHARE * free:
        return nbytes, None
    mib = 1 << 20
    fits = int(FREE_SHARE * free / (per_byte * 2)) // mib * mib
    if fits < mib:
        raise MemoryError(f"{step}: {_gib(free)} free on {where}, not enough for even 1 MiB buffers")
    return fits, f"{step}: {_gib(asked)} asked, {_gib(fits)} used: {_gib(free)} free on {where}"


# ---- the machine ----------------------------------------------------------------


def bind(spec: dict | None) -> dict | None:
    """Pin this process to the CPUs of its GPU's NUMA node and prefer that node's
    memory, as nvbandwidth and `numactl --cpunodebind=N --membind=N` do."""
    if not spec or not spec.get("cpus"):
        return None
    cpus = _cpulist(spec["cpus"])
    out = {"node": spec.get("node"), "cpus": spec["cpus"], "memory": None, "error": None}
    try:
        # Every thread of the process: in a launch shared by several stages torch's
        # threads already run, and a new thread inherits only its creator's mask.
        for tid in [int(t) for t in os.listdir("/proc/self/task")] or [0]:
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass  # a thread that has just ended
    except OSError as e:
        out["error"] = f"sched_setaffinity({spec['cpus']}): {e.strerror}"
        return out
    if spec.get("node") is not None:
        out["memory"] = _prefer_node(int(spec["node"]))
    return out


# set_mempolicy(2) numbers; MPOL_PREFERRED spills to other nodes instead of failing when one is full.
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MPOL_PREFERRED = 1


def _prefer_node(node: int) -> str:
    nr = _SET_MEMPOLICY.get(platform.machine())
    if nr is None or node >= 64:
        return f"not set: no set_mempolicy number for {platform.machine()} here"
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << node)
    if libc.syscall(nr, _MPOL_PREFERRED, ctypes.byref(mask), ctypes.c_ulong(64)) != 0:
        return f"not set: set_mempolicy: {os.strerror(ctypes.get_errno())}"
    return f"preferred node {node}"


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _gpu_cache(torch, device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20)


def _cpu_cache() -> int:
    """The largest cache of CPU 0 (the last level), from sysfs; 64 MiB where unknown."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 << 20)


def _meminfo(key: str) -> int | None:
    try:
        for line in open("/proc/meminfo"):
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


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
