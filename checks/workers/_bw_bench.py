"""The bandwidth bench's plumbing, under every step (checks/workers/bandwidth.py's
Bench is made of it and of the steps in _bw_copies.py and _bw_collectives.py):
the turns local ranks take to measure alone, the barriers and waits with their
deadlines, one timed repeat (CUDA events, perf_counter on CPU) repeated until
its median is sure (_converge.py), and the buffers: random data, how many sets
to rotate through, the size that fits the memory free now.

Apart from the steps because every step leans on it the same way: a step's
code reads as what it copies or reduces, and how a repeat is timed, agreed on
and sized is said once, here. Standard library and torch (passed in) only;
imported as ``_bw_bench`` from beside the workers.
"""

from __future__ import annotations

import math
import time

import _converge
import _rank
from _bw_machine import cpu_cache, gpu_cache, meminfo_value

MAX_SETS = 8
HOST_BLOCK = 1_000_003  # values drawn at random for a host buffer, then repeated (Bench._random_elems)
FREE_SHARE = 0.7  # of the memory free now: NCCL's buffers and peers' contexts need the rest
# The slow fault sleeps this many times the repeat's own length, and at least
# SLOW_MIN seconds: a 64 MiB memcpy then reads under 1.4 GB/s on any machine.
# slow=F instead stretches each repeat to F times its length, slow=Ns sleeps N seconds (_rank.slow_seconds).
SLOW, SLOW_MIN = 3.0, 0.1


class BenchBase:
    """What every step of Bench (bandwidth.py) stands on; the steps are its mixins'."""

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
        self.cache = gpu_cache(torch, device) if self.cuda else cpu_cache()
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

    # -- turns -----------------------------------------------------------------------

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

    # -- barriers and waits, each with a deadline -------------------------------------

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
        available = meminfo_value("MemAvailable")
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


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"
