"""A short real training run on every rank: a small GPT-style decoder, data
parallel, proving speed, correctness and agreement together.

What isolated probes miss and this catches: a GPU that computes wrong
answers (every rank runs the same seeded forward pass and compares the exact
bits of its logits), ranks whose parameters drift apart after the gradient
all-reduce (a checksum of every parameter's bits, gathered), a loss that is
not finite or does not fall, a rank that is slower than its peers (each rank
times its own forward+backward without the gradient sync, so a straggler
cannot hide behind the others waiting for it), and a GEMM on each GPU that is
slower than the SKU can do.

Plain torch: embedding, causal attention with scaled_dot_product_attention,
MLP, RMSNorm, a head tied to the embedding; bf16 autocast on GPU, fp32 on
CPU; synthetic tokens from a fixed seed (each rank its own fixed batch, the
same every step, so the loss must fall); data parallel as
DistributedDataParallel does it, gradients all-reduced in buckets during
backward (NCCL, or gloo on CPU), and AdamW's foreach update (_dataparallel.py:
torch's own classes import torch._dynamo, seconds a launch). Each timed
figure (the steps, the compute passes, the GEMM) runs its least count, then
more until the 95% interval of its statistic is within --tolerance or a cap
is reached (_converge.py); every rank runs as
many as the rank that needs most, decided between repeats: a rank that stopped
early would leave its peers waiting in the gradient all-reduce. The rank
writes rank{N}.json after every stage. By hand:

    torchrun --nproc-per-node 8 train_probe.py
    torchrun --nproc-per-node 2 train_probe.py --backend gloo --device cpu --layers 2 --d-model 64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import _converge
import _dataparallel
import _rank

STAGES = ("agreement", "warmup", "steps", "compute", "checksum", "gemm")
SLOW = 3.0  # the slow fault makes each of its compute passes last this many times longer (slow=F: F times as long)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for rank{N}.json and rank{N}.log (default: print a line per rank)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed training steps at least")
    p.add_argument("--compute-steps", type=int, default=3, help="forward+backward passes timed without the gradient sync, at least")
    p.add_argument("--compute-warmup", type=int, default=1, help="untimed forward+backward passes before them")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gemm-n", type=int, default=8192)
    p.add_argument("--gemm-repeats", type=int, default=6, help="timed GEMM bursts at least")
    p.add_argument("--tolerance", type=float, default=0.02, help="repeat until the 95%% interval of each figure's statistic is within this fraction of it")
    p.add_argument("--max-steps", type=int, default=30, help="or until this many timed steps")
    p.add_argument("--max-compute-steps", type=int, default=9, help="or this many compute passes")
    p.add_argument("--max-gemm-repeats", type=int, default=30, help="or this many GEMM bursts")
    p.add_argument("--max-seconds", type=float, default=5.0, help="or until a figure has taken this long")
    p.add_argument("--gemm-burst", type=int, default=50, help="matmuls back to back in each timed repeat")
    p.add_argument("--gemm-warmup-seconds", type=float, default=0.5, help="untimed matmul bursts for at least this long before the first timed one")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reading", type=int, default=1, help="which launch this is: 2 when the check measures again to confirm a figure beyond its floor")
    args = p.parse_args(argv)

    me, report, save, fault = _rank.begin(args.out, "steps", reading=args.reading, backend=args.backend, device=args.device, losses=[],
                                          step_seconds=[], compute_seconds=[], gemm_seconds=[], params=None, logits_checksum=None,
                                          logits_checksums=None, param_checksums=None, nonfinite_step=None, shrunk=None, tokens_per_step=None,
                                          warmup_seconds=[], phases={}, dynamo_imported=None)
    return _rank.guarded(lambda: run(args, me, report, save, fault), report, save)


def run(args, me: _rank.Rank, report: dict, save, fault: _rank.Fault) -> int:
    t0 = time.perf_counter()
    started = _rank.start_torch(args.device, me.local_rank, report, save)
    if started is None:
        return 1
    torch, dist, device = started
    F = torch.nn.functional
    save()
    t = time.perf_counter()
    # Every wait below has --timeout as its deadline (_wait, _collective), so a rank whose peer
    # hangs says where it stopped, before NCCL's watchdog would end it without a word.
    _rank.init_group(dist, args.backend, device, args.timeout)
    report["init_seconds"] = round(time.perf_counter() - t, 4)

    report["stage"] = "build"  # memory fit, model, rank 0's parameters broadcast: seconds on a big model
    save()
    # Each part's seconds on this rank, the build split in two (the model, then the data-parallel
    # setup: rank 0's parameters broadcast, the buckets, AdamW's state): what the check's time is made of.
    phases = report["phases"]
    probe = Probe(torch, dist, F, device, me, args, phases)
    report.update(params=probe.params, tokens_per_step=probe.batch * args.seq * me.world_size, shrunk=probe.shrunk,
                  model={"layers": probe.layers, "d_model": args.d_model, "heads": args.heads, "seq": args.seq, "batch": probe.batch, "vocab": args.vocab})
    for stage in STAGES:
        report["stage"] = stage
        save()
        kind = fault.at(stage)
        probe.factor = fault.values.get(stage)  # slow=F: the factor; None: plain slow
        probe.pause = fault.pauses.get(stage)  # slow=Ns: seconds a pass, whatever it took
        t = time.perf_counter()
        getattr(probe, stage)(report, kind, save)
        phases[stage] = round(time.perf_counter() - t, 4)
        save()
    # Nothing here should import torch._dynamo (seconds a launch: _dataparallel.py); a torch that
    # starts doing so on its own path shows here, and in the phase that paid it.
    report.update(stage="done", seconds=round(time.perf_counter() - t0, 4), dynamo_imported="torch._dynamo" in sys.modules)
    save()
    if args.out is None:
        s = sorted(report["step_seconds"])
        line = {"rank": me.rank, "loss": [report["losses"][0], report["losses"][-1]], "step_p50_ms": round(s[len(s) // 2] * 1e3, 2) if s else None,
                "gemm_tflops": round(2 * args.gemm_n**3 / sorted(report["gemm_seconds"])[len(report["gemm_seconds"]) // 2] / 1e12, 2)}
        os.write(1, (json.dumps(line) + "\n").encode())
    _rank.end_group(dist)
    return 0


class Probe:
    def __init__(self, torch, dist, F, device, me: _rank.Rank, args, phases: dict):
        self.torch, self.dist, self.F, self.device, self.me, self.args = torch, dist, F, device, me, args
        t = time.perf_counter()
        self.cuda = device.type == "cuda"
        self.factor: float | None = None  # slow=F's F at the stage running
        self.pause: float | None = None  # slow=Ns's N at the stage running
        self.layers, self.batch, self.shrunk = args.layers, args.batch, None
        if self.cuda:
            self._fit_memory()
        torch.manual_seed(args.seed)  # every rank builds the same model (rank 0's is broadcast anyway)
        # Built where it runs (torch >= 2.0): a few hundred million parameters built on the CPU cost seconds.
        with device if hasattr(device, "__enter__") else contextlib.nullcontext():
            self.model = _gpt(torch, args.vocab, args.d_model, args.heads, self.layers, args.seq).to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        g = torch.Generator().manual_seed(args.seed + 1 + me.rank)  # each rank its own fixed batch
        self.tokens = torch.randint(0, args.vocab, (self.batch, args.seq + 1), generator=g).to(device)
        phases["model"] = round(time.perf_counter() - t, 4)
        t = time.perf_counter()
        finish = lambda work, what: _rank.finish(torch, work, args.timeout, what, self.cuda)  # noqa: E731
        self.grads = _dataparallel.GradSync(torch, dist, list(self.model.parameters()), me.world_size, finish)
        self.grads.broadcast()
        self.opt = _dataparallel.AdamW(torch, self.model.parameters(), lr=args.lr)
        phases["data_parallel"] = round(time.perf_counter() - t, 4)

    def _fit_memory(self) -> None:
        """Fewer sequences per step (then fewer layers) until the probe fits in half
        the memory free now, agreed by every rank, with a note: a probe that OOMs proves nothing."""
        free = int(self.torch.cuda.mem_get_info(self.device)[0])
        a = self.args
        batch, layers = fit_model(free, a.batch, a.layers, a.d_model, a.seq, a.vocab)
        # Every rank must build the same model and batch (the gradients are all-reduced): the smallest any rank can hold.
        agreed = self.torch.tensor([batch, layers], dtype=self.torch.int64, device=self.device)
        self._collective(lambda: self.dist.all_reduce(agreed, op=self.dist.ReduceOp.MIN, async_op=True), "agreeing on the model's size")
        self.batch, self.layers = int(agreed[0]), int(agreed[1])
        if (self.batch, self.layers) != (a.batch, a.layers):
            self.shrunk = f"{a.batch} x {a.layers} layers asked, {self.batch} x {self.layers} layers used: {free / 2**30:.1f} GiB free on cuda:{self.device.index}"

    def _loss(self, model, tokens):
        x, y = tokens[:, :-1], tokens[:, 1:]
        with self.torch.autocast(device_type=self.device.type, dtype=self.torch.bfloat16, enabled=self.cuda):
            logits = model(x)
        return self.F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    def _sync(self, what: str = "the queued GPU work") -> None:
        """Until the GPU has done what is queued, within --timeout: the gradient all-reduce
        the step queued is in it, so a peer that stopped surfaces here as a TimeoutError."""
        if self.cuda:
            _rank.wait_for_gpu(self.torch, self.args.timeout, what)

    def _collective(self, start, what: str) -> None:
        """A collective ``start()`` launched with async_op=True, waited for within --timeout."""
        _rank.finish(self.torch, start(), self.args.timeout, what, self.cuda)

    # -- stages ----------------------------------------------------------------------

    def agreement(self, report: dict, kind: str | None, save) -> None:
        """The same seeded input on every rank, eval mode, no sync: the exact bits of the logits."""
        torch = self.torch
        g = torch.Generator().manual_seed(self.args.seed + 999)
        x = torch.randint(0, self.args.vocab, (1, self.args.seq), generator=g).to(self.device)
        self.model.eval()
        with torch.no_grad():
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
                logits = self.model(x).float()
        self.model.train()
        if kind == "wrong":
            logits[0, 0, 0] += 1.0  # one value off: what silent data corruption looks like
        mine = _bits_checksum(torch, [logits], lambda: self._sync("the logits' checksum"))
        report["logits_checksum"] = str(mine)
        report["logits_checksums"] = [str(c) for c in self._gather(mine)]

    def warmup(self, report: dict, kind: str | None, save) -> None:
        for _ in range(self.args.warmup_steps):
            value = self._step(report, kind, timed=False)
            if report.get("initial_loss") is None:
                # Before any update: the reference the last loss must beat (near ln(vocab)); the
                # first timed step comes after Adam's early, not monotone, updates.
                report["initial_loss"] = value if math.isfinite(value) else str(value)

    def steps(self, report: dict, kind: str | None, save) -> None:
        def once(i: int) -> float:
            self._step(report, kind, timed=True)
            save()
            return report["step_seconds"][-1]

        a = self.args
        self._repeat(report, "steps", once, a.steps, a.max_steps)

    def _step(self, report: dict, kind: str | None, timed: bool) -> float:
        self._sync()
        t = time.perf_counter()
        self.grads.zero()
        loss = self._loss(self.model, self.tokens)
        if kind == "nan" and timed:
            loss = loss * float("nan")  # the fault: one rank's loss, and through the all-reduce every gradient
        loss.backward()
        self.grads.wait()
        if kind == "slow":
            self._slow(t)
        self.opt.step()
        # Waits for the step, as a job's host loop does with loss.item(), but with a deadline:
        # item() would wait on the gradient all-reduce for ever.
        self._sync(f"training step {report.get('step', 0) + 1} (its gradient all-reduce)")
        value = float(loss.item())
        seconds = time.perf_counter() - t
        if not math.isfinite(value) and report["nonfinite_step"] is None:
            report["nonfinite_step"] = len(report["losses"])
        report["step"] = report.get("step", 0) + 1  # progress the agent sees while a stage runs
        if timed:
            report["losses"].append(value if math.isfinite(value) else str(value))
            report["step_seconds"].append(round(seconds, 6))
        else:
            report["warmup_seconds"].append(round(seconds, 6))  # the first pays what a process pays once (kernels loaded)
        return value

    def compute(self, report: dict, kind: str | None, save) -> None:
        """Forward and backward without the gradient all-reduce: this rank's own speed,
        which the synchronized steps hide (every rank waits for the slowest). The
        check judges each rank's first quartile, so that is what must be sure here."""

        def once(i: int) -> float:
            self._sync()
            t = time.perf_counter()
            with self.grads.no_sync():
                loss = self._loss(self.model, self.tokens)
                loss.backward()
            if kind == "slow":
                self._slow(t)  # after the whole pass: a GPU this many times slower at everything
            self._sync()
            report["step"] = report.get("step", 0) + 1
            return round(time.perf_counter() - t, 6)

        a = self.args
        report["compute_seconds"] = self._repeat(report, "compute", once, a.compute_steps, a.max_compute_steps, warmup=a.compute_warmup, q=0.25)
        self.grads.zero()  # these gradients were never meant to be applied

    def checksum(self, report: dict, kind: str | None, save) -> None:
        """After the all-reduced optimizer steps every rank must hold the same bits."""
        if kind == "wrong":
            with self.torch.no_grad():
                next(self.model.parameters()).view(-1)[0] += 1e-3  # the fault: a rank whose weights drifted
        report["param_checksums"] = [str(c) for c in self._gather(_bits_checksum(self.torch, list(self.model.parameters()), lambda: self._sync("the parameters' checksum")))]

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

    # -- helpers -------------------------------------------------------------------------

    def _repeat(self, report: dict, what: str, once, least: int, most: int, warmup: int = 0, q: float = 0.5) -> list[float]:
        """``once`` until its statistic is sure or a cap is reached, every rank as many times."""
        rule = _converge.Rule(self.args.tolerance, least, max(least, most), self.args.max_seconds, q)
        xs, stopped = _converge.repeat(once, rule, warmup, agree=self._more)
        report.setdefault("stopped", {})[what] = stopped  # steps, compute, gemm: converged, max_repeats or max_seconds
        report["tolerance"] = self.args.tolerance
        return xs

    def _more(self, flag: float) -> float:
        """The largest flag of any rank ("repeat again" is 1), between timed repeats."""
        t = self.torch.tensor([flag], dtype=self.torch.float32, device=self.device)
        self._collective(lambda: self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, async_op=True), "agreeing on more repeats")
        return float(t.item())

    def _slow(self, t: float) -> None:
        self._sync()
        time.sleep(_rank.slow_seconds(time.perf_counter() - t, self.factor, SLOW, 0.05, self.pause))

    def _gather(self, value: int) -> list[int]:
        """Every rank's integer, exactly (int64 on the device, as NCCL needs)."""
        t = self.torch.tensor([value], dtype=self.torch.int64, device=self.device)
        out = [self.torch.zeros_like(t) for _ in range(self.me.world_size)]
        self._collective(lambda: self.dist.all_gather(out, t, async_op=True), "gathering every rank's checksum")
        return [int(x.item()) for x in out]


def probe_bytes(batch: int, layers: int, d: int, seq: int, vocab: int) -> int:
    """Memory the probe needs: activations kept for backward, 56 x seq x d bytes per
    layer and sequence (Korthikanti et al. 2022 count 34 for pure bf16; the fp32
    residual stream and norms here measured 1.5x that), the logits at the
    loss's peak (16 bytes a vocab entry: bf16, the fp32 copy and its gradient),
    and 16 bytes a parameter (fp32 weights and gradients, AdamW's two moments)."""
    params = 12 * layers * d * d + vocab * d
    return batch * seq * (56 * d * layers + 16 * vocab) + 16 * params


def fit_model(free: int, batch: int, layers: int, d: int, seq: int, vocab: int) -> tuple[int, int]:
    """Halve the batch, then the layers, until the probe fits in half of ``free``; (1, 1) at least."""
    while (batch > 1 or layers > 1) and probe_bytes(batch, layers, d, seq, vocab) > free / 2:
        if batch > 1:
            batch //= 2
        else:
            layers //= 2
    return batch, layers


def _bits_checksum(torch, tensors, sync=lambda: None) -> int:
    """A sum of every value's bit pattern (as int32 words), mod 2^61: one flipped bit anywhere changes it.
    ``sync`` waits for the sums with a deadline before item() reads them."""
    sums = []
    for x in tensors:
        flat = x.detach().float().contiguous().view(-1).view(torch.int32).to(torch.int64)
        weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 1000003 + 1  # never 0: every position counts
        sums.append((flat * weights).sum())
    sync()
    total = 0
    for s in sums:
        total = (total + int(s.item())) % (2**61 - 1)
    return total


def _gpt(torch, vocab: int, d: int, heads: int, layers: int, seq: int):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.up = nn.Linear(d, 4 * d, bias=False)
            self.down = nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.n2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's: logits start near uniform, loss near ln(vocab)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()

        def forward(self, idx):
            x = self.embed(idx) + self.pos[: idx.size(1)]
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.t()  # the head tied to the embedding

    return GPT()


if __name__ == "__main__":
    _rank.exit_now(main())
