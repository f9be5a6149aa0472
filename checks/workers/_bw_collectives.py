"""The bandwidth bench's collective steps, a mixin of checks/workers/bandwidth.py's
Bench: large all_reduce, all_gather and reduce_scatter (every rank at once,
each repeat after a barrier, judged by its slowest rank), the small
all_reduce's latency, and the same inside a CUDA graph. Apart from the copies
(_bw_copies.py): these are the process group's work, every rank in each
repeat, where the copies take turns; their timing and buffers are
_bw_bench.py's. Standard library and torch (passed in) only; imported as
``_bw_collectives`` from beside the workers.
"""

from __future__ import annotations

import time

import _converge
import _rank
from _bw_bench import SLOW, SLOW_MIN


class Collectives:
    """all_reduce, all_gather, reduce_scatter, latency and graph_latency: Bench's
    collective steps (the plumbing is _bw_bench.BenchBase's)."""

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
