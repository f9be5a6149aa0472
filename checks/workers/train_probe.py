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

The model (the GPT, the memory it needs, the bit checksum) is _probe_model.py's
and the GEMM stage _probe_gemm.py's; Probe here runs the stages.
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
import _probe_gemm
import _rank
from _probe_model import bits_checksum, gpt, fit_model

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


class Probe(_probe_gemm.Gemm):
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
            self.model = gpt(torch, args.vocab, args.d_model, args.heads, self.layers, args.seq).to(device)
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
        mine = bits_checksum(torch, [logits], lambda: self._sync("the logits' checksum"))
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
        report["param_checksums"] = [str(c) for c in self._gather(bits_checksum(self.torch, list(self.model.parameters()), lambda: self._sync("the parameters' checksum")))]

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


if __name__ == "__main__":
    _rank.exit_now(main())
