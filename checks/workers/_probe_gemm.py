"""The train probe's GEMM stage, a mixin of checks/workers/train_probe.py's Probe:
an n x n x n matmul timed in bursts on each GPU, after untimed bursts that let
the power limiter settle the clocks. Apart from the training stages because it
needs none of the model: it measures the GPU alone against what the SKU can do
(the check's GEMM floor), with its own warm-up and its own reasons (the
docstring below); it leans on Probe's _sync, _slow and _repeat. Standard
library and torch (passed in) only; imported as ``_probe_gemm`` from beside the
workers.
"""

from __future__ import annotations

import time

import _rank


class Gemm:
    """Probe's gemm stage (the stage's plumbing is Probe's)."""

    def gemm(self, report: dict, kind: str | None, save) -> None:
        """n x n x n matmul on normal random data, bf16 on GPU (fp32 on CPU): each repeat a
        burst of back-to-back matmuls long enough (about 100 ms on an H100) that a
        power cap or power brake shows, as MAMF's loops do; the per-matmul time reported.

        Normal data, as a plain loop's torch.randn and as a job's weights and activations:
        a GEMM's power depends on the bits it multiplies (Horace He, "Strangely, matrix
        multiplications on GPUs run faster when given predictable data", 2024: an A100 at
        its cap read 15% more on zeros than on randn), so the burn-in's inputs in [1, 2)
        read higher at the same cap (the H200 in tests/fixtures/node/h200-1x-vm: 755 TFLOP/s
        there, 674 here). The untimed bursts before the first timed one run until the power
        limiter has settled the clocks: a GPU under a GEMM boosts for its first ~0.1 s (that
        H200: 741 TFLOP/s in its first burst after two warm-up matmuls, 629-678 in the
        nine after), and a statistic over both regimes mixes them (there one burst in ten;
        more with fewer repeats or a longer boost). The output is allocated once, outside
        the timed loop, as the burn-in's."""
        torch, n, burst = self.torch, self.args.gemm_n, self.args.gemm_burst
        dtype = torch.bfloat16 if self.cuda else torch.float32
        a = torch.randn(n, n, device=self.device, dtype=dtype)
        b = torch.randn(n, n, device=self.device, dtype=dtype)
        out = torch.empty_like(a)
        warm, t = 0, time.perf_counter()
        while warm < 2 or time.perf_counter() - t < self.args.gemm_warmup_seconds:
            for _ in range(burst if warm else 2):
                torch.matmul(a, b, out=out)
            warm += burst if warm else 2
            self._sync()
        report["gemm_warmup"] = {"matmuls": warm, "seconds": round(time.perf_counter() - t, 4)}

        def once(i: int) -> float:
            self._sync()
            t = time.perf_counter()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            for _ in range(burst):
                torch.matmul(a, b, out=out)
            if kind == "slow":
                self._slow(t)
            if self.cuda:
                end.record()
                _rank.spin(end.query, self.args.timeout, "a GEMM burst")
                seconds = start.elapsed_time(end) / 1e3
            else:
                seconds = time.perf_counter() - t
            return round(seconds / burst, 9)

        report["gemm_seconds"] = self._repeat(report, "gemm", once, self.args.gemm_repeats, self.args.max_gemm_repeats)
