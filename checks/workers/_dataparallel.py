"""Data-parallel training as torch's DistributedDataParallel and AdamW do it,
written out: rank 0's parameters broadcast to every rank, every gradient
averaged over the ranks in buckets that are all-reduced while backward still
runs, then AdamW's update with the same foreach kernels.

Why not DistributedDataParallel and torch.optim themselves: the first of
either in a process imports torch._dynamo (DDP's constructor asks it for the
optimize_ddp mode; Optimizer.step's wrapper calls its graph_break), and triton
and sympy with it. On one H200 node that import took 3.3-3.7 s of a standard
run, against 8-10 s for a whole bare torchrun
(tests/fixtures/time_model/h200-1x-vm-2026-11-27: 3-ddpprobe.txt, 7-standard.json).
That is torch's Python, not the node. The node still does the same work:
the same gradients, reduced by NCCL all-reduces of DDP's first-iteration
buckets while backward runs, and the same foreach AdamW kernels that
torch.optim uses by default on CUDA. Two differences, both small: DDP
rebuilds its buckets in the order gradients became ready after its first
step (here they keep the reversed registration order of DDP's first step;
for the probe's GPT that holds back two buckets of 20, which wait for the
embedding's gradient, ready last), and the
gradients live in the buckets (DDP's gradient_as_bucket_view=True) rather
than being copied into them and back (its default): one fewer copy of the
gradients a step, well under 1% of a 41 ms step on an H200.
tests/checks/test_dataparallel.py holds both to torch's own on two gloo ranks,
bit for bit.

torch only, and torch >= 2.1 (post-accumulate-grad hooks). Workers run by
path under the training environment's interpreter, so this file beside them
is importable as ``_dataparallel``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

# DDP's bucket caps (torch/nn/parallel/distributed.py: bucket_cap_mb=25, and 1 MiB for the
# first bucket so the first all-reduce starts early in backward), filled as DDP fills them
# (dist._compute_bucket_assignment_by_size): a bucket closes once it holds its cap or more.
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20


class Bucket:
    """Parameters whose gradients live side by side in one flat tensor, all-reduced as one."""

    def __init__(self, torch, params: list):
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.pending = len(params)  # gradients still to come this backward
        self.work = None


class GradSync:
    """Every rank's gradients averaged over the ranks, as DDP does it.

    Each parameter's ``.grad`` is a view into its bucket's flat tensor (as DDP's
    gradient_as_bucket_view=True), so autograd accumulates straight into it. When a
    bucket's last gradient is in, the bucket is scaled by 1/world size and
    all-reduced asynchronously while backward goes on. Buckets are launched in
    order only, so every rank issues the same collectives in the same order.
    ``wait()`` after backward makes the optimizer's stream wait for them, as DDP's
    end of backward does: on the GPU without waiting on the host, so the step's
    own deadline (the caller's) is where a stopped peer shows; gloo's wait blocks,
    within the group's timeout.

    ``finish(work, what)`` waits for one collective with the caller's deadline."""

    def __init__(self, torch, dist, params, world_size: int, finish: Callable, bucket_bytes: int = BUCKET_BYTES,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES):
        self.torch, self.dist, self.world, self.finish = torch, dist, world_size, finish
        self.syncing = True
        self.buckets: list[Bucket] = []
        self.next = 0  # the first bucket not yet launched this backward
        group: list = []
        size, cap = 0, first_bucket_bytes
        # Backward makes the last layers' gradients first: reversed registration order, as DDP.
        for p in reversed([p for p in params if p.requires_grad]):
            if group and (p.dtype != group[0].dtype or p.device != group[0].device):
                self.buckets.append(Bucket(torch, group))
                group, size, cap = [], 0, bucket_bytes
            group.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(Bucket(torch, group))
                group, size, cap = [], 0, bucket_bytes
        if group:
            self.buckets.append(Bucket(torch, group))
        for i, b in enumerate(self.buckets):
            offset = 0
            for p in b.params:
                p.grad = b.flat[offset: offset + p.numel()].view_as(p)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))

    def broadcast(self, src: int = 0) -> None:
        """Every rank starts from rank ``src``'s parameters, as DDP's constructor makes it,
        once every rank is known to hold as many values in as many buckets (DDP checks
        the shapes too): collectives of different sizes across ranks are undefined in NCCL."""
        torch = self.torch
        n, k = sum(b.flat.numel() for b in self.buckets), len(self.buckets)
        # One all-reduce gives both extremes: the largest of each figure and of its negation.
        t = torch.tensor([n, -n, k, -k], dtype=torch.int64, device=self.buckets[0].flat.device)
        self.finish(self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, async_op=True), "agreeing on the model's shape")
        if (int(t[0]), -int(t[1]), int(t[2]), -int(t[3])) != (n, n, k, k):
            raise RuntimeError(f"the ranks built different models: {-int(t[1])}-{int(t[0])} parameters in {-int(t[3])}-{int(t[2])} buckets "
                               f"(this rank {n} in {k}); every rank must be given the same model arguments")
        with torch.no_grad():
            for b in self.buckets:
                flat = torch.cat([p.detach().reshape(-1) for p in b.params])
                self.finish(self.dist.broadcast(flat, src, async_op=True), "broadcasting rank 0's parameters")
                offset = 0
                for p in b.params:
                    p.copy_(flat[offset: offset + p.numel()].view_as(p))
                    offset += p.numel()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes that keep their gradients to this rank (DDP's no_sync)."""
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True
            self._reset()

    def _ready(self, i: int) -> None:
        if not self.syncing:
            return
        self.buckets[i].pending -= 1
        while self.next < len(self.buckets) and self.buckets[self.next].pending == 0:
            self._launch(self.buckets[self.next])

    def _launch(self, b: Bucket) -> None:
        if self.world > 1:
            b.flat.mul_(1.0 / self.world)  # averaged as DDP's reducer does: each rank's share, then the sum
        b.work = self.dist.all_reduce(b.flat, async_op=True)
        self.next += 1

    def wait(self) -> None:
        """After backward: any bucket not yet launched (a parameter that got no gradient)
        goes now, in order; then what comes next waits for every bucket's all-reduce."""
        while self.next < len(self.buckets):
            self._launch(self.buckets[self.next])
        for b in self.buckets:
            b.work.wait()
        self._reset()

    def zero(self) -> None:
        """Every gradient back to zero, in place: the views stay the gradients."""
        for b in self.buckets:
            b.flat.zero_()

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.work = len(b.params), None
        self.next = 0


class AdamW:
    """torch.optim.AdamW with its defaults (betas 0.9 and 0.999, eps 1e-8, weight
    decay 0.01), computed as its foreach path computes it
    (torch/optim/adam.py, _multi_tensor_adam, decoupled weight decay, no capturable)."""

    def __init__(self, torch, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        self.torch = torch
        self.params = [p for p in params if p.requires_grad]
        self.lr, (self.beta1, self.beta2), self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.steps = 0
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    def step(self) -> None:
        torch, params = self.torch, self.params
        grads = [p.grad for p in params]
        lr, beta1, beta2 = self.lr, self.beta1, self.beta2
        self.steps += 1
        with torch.no_grad():
            torch._foreach_mul_(params, 1 - lr * self.weight_decay)
            torch._foreach_lerp_(self.exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(self.exp_avg_sqs, beta2)
            torch._foreach_addcmul_(self.exp_avg_sqs, grads, grads, 1 - beta2)
            step_size = -(lr / (1 - beta1**self.steps))
            bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
            denom = torch._foreach_sqrt(self.exp_avg_sqs)
            torch._foreach_div_(denom, bias_correction2_sqrt)
            torch._foreach_add_(denom, self.eps)
            torch._foreach_addcdiv_(params, self.exp_avgs, denom, step_size)
