"""NCCL (or gloo) smoke test on every rank: the collectives a training job uses,
with answers that are checked, not just awaited.

Every rank fills its buffers with values that depend on its rank, the element
and the step, so a wrong, stale or missing contribution cannot pass; output
buffers start as a sentinel, so a collective that did nothing fails too.
Sums are of small integers: exact in fp32 in any reduction order, and in
bf16 while they stay within its 8-bit mantissa (beyond that, within bf16
rounding). Each op runs with a small and a large message.

Each rank writes rank{N}.json into --out (rewritten at every step, so after a
hang the agent knows where each rank stopped) and sends its output to
rank{N}.log there. Standard library and torch only. By hand:

    torchrun --nproc-per-node 8 nccl_smoke.py                       # NCCL on GPUs
    torchrun --nproc-per-node 2 nccl_smoke.py --backend gloo --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _rank

BF16_EXACT = 256  # integers up to 2^8 are exact in bf16's 8-bit significand


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for rank{N}.json and rank{N}.log (default: print rank 0's report)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--small-bytes", type=int, default=4096)
    p.add_argument("--large-bytes", type=int, default=32 << 20)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds init and each collective may take before the rank gives up")
    p.add_argument("--nccl-debug", action="store_true", help="write NCCL_DEBUG=INFO output to nccl.rank{N}.log in --out")
    args = p.parse_args(argv)

    me, report, save, fault = _rank.begin(args.out, "all_reduce_fp32_small", backend=args.backend, device=args.device, ops=[], init_seconds=None,
                                          first_collective_seconds=None)
    return _rank.guarded(lambda: run(args, me, report, save, fault), report, save)


def run(args, me: _rank.Rank, report: dict, save, fault: _rank.Fault) -> int:
    t0 = time.perf_counter()
    started = _rank.start_torch(args.device, me.local_rank, report, save)
    if started is None:
        return 1
    torch, dist, device = started
    if device.type == "cuda":
        report["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    if args.nccl_debug and args.out and args.backend == "nccl" and not _rank.WORLD["active"]:
        # Read by NCCL at its first call, which is init_process_group below. In a shared
        # launch world.py set it for the whole process, and the agent gives this stage its part.
        _rank.nccl_debug(os.path.join(args.out, f"nccl.rank{me.local_rank}.log"))
    save()

    t = time.perf_counter()
    start_group(dist, args.backend, device, args.timeout)
    report["init_seconds"] = round(time.perf_counter() - t, 4)
    if dist.get_world_size() != me.world_size:
        raise RuntimeError(f"world size {dist.get_world_size()} is not WORLD_SIZE={me.world_size}")

    ops = Ops(torch, dist, device, me.rank, me.world_size, args.timeout)
    plan = [(f"{op}_{size}", op, nbytes) for size, nbytes in (("small", args.small_bytes), ("large", args.large_bytes)) for op in Ops.NAMES]
    plan.append(("barrier", "barrier", 0))
    for salt, (name, op, nbytes) in enumerate(plan, start=1):
        report["stage"] = name
        save()
        corrupt = fault.at(name) == "wrong"
        result = ops.run(op, nbytes, salt, corrupt)
        result["name"] = name
        report["ops"].append(result)
        if report["first_collective_seconds"] is None:
            report["first_collective_seconds"] = result["seconds"]
    report.update(stage="done", seconds=round(time.perf_counter() - t0, 4))
    save()
    if args.out is None:  # by hand: one short line per rank, written at once so ranks do not interleave
        wrong = {o["name"]: o["error"] for o in report["ops"] if o["error"]}
        line = {"rank": me.rank, "ops": len(report["ops"]), "wrong": wrong, "init_seconds": report["init_seconds"], "first_collective_seconds": report["first_collective_seconds"]}
        os.write(1, (json.dumps(line)[:3000] + "\n").encode())
    _rank.end_group(dist)
    return 0 if all(o["error"] is None for o in report["ops"]) else 1


def start_group(dist, backend: str, device, timeout: float) -> None:
    """The process group, without NCCL's blocking wait: it polls with a 1-10 ms
    sleep, which would land inside every op's figure. The ops' waits spin with
    ``timeout`` as their deadline instead (Ops._timed), inside the group's own
    timeout, so a rank still gives up first and says where. gloo's own timeout is the rank's."""
    _rank.init_group(dist, backend, device, timeout)


class Ops:
    """Each op: fill, run it timed, compare with the exact answer."""

    NAMES = ("all_reduce_fp32", "all_reduce_bf16", "all_gather", "reduce_scatter", "broadcast", "send_recv")

    def __init__(self, torch, dist, device, rank: int, world: int, timeout: float = 30.0):
        self.torch, self.dist, self.device, self.rank, self.world = torch, dist, device, rank, world
        self.timeout = timeout
        self.cuda = device.type == "cuda"
        # torch 2.13 renamed these; older releases have only the old names.
        self.gather_fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.scatter_fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def run(self, op: str, nbytes: int, salt: int, corrupt: bool) -> dict:
        dtype = self.torch.bfloat16 if op == "all_reduce_bf16" else self.torch.float32
        # A multiple of the world size, so all_gather and reduce_scatter split evenly.
        n = max(self.world, nbytes // dtype.itemsize // self.world * self.world)
        result = {"op": op, "dtype": str(dtype).removeprefix("torch."), "bytes": n * dtype.itemsize, "seconds": None, "error": None}
        if op == "barrier":
            result.update(dtype=None, bytes=0, seconds=self._timed(lambda: [self.dist.barrier(async_op=True)], op))
            return result
        if op == "send_recv" and self.world == 1:
            result["skipped"] = "a ring needs two ranks"
            return result
        method = "all_reduce" if op.startswith("all_reduce") else op
        got, expected, tolerance, seconds = getattr(self, method)(n, dtype, salt, corrupt)
        result["seconds"] = seconds
        result["error"] = self._compare(got, expected, tolerance)
        return result

    # -- the values ---------------------------------------------------------

    def _modulus(self, dtype) -> int:
        # fp32 holds every sum of values up to 61 exactly; bf16 only up to 256 in all.
        return 61 if dtype == self.torch.float32 else max(1, min(61, BF16_EXACT // self.world))

    def _values(self, n: int, rank: int, salt: int, modulus: int, start: int = 0, dtype=None):
        """The contribution of ``rank`` to elements start..start+n-1."""
        return self._periodic(n, start, modulus, lambda i: (i * 7 + rank * 13 + salt) % modulus + 1, dtype)

    def _sum(self, n: int, salt: int, modulus: int, start: int = 0, dtype=None):
        """The sum over all ranks of _values, from a table over i*7+salt mod m,
        so it costs the same whatever the world size."""
        counts = [0] * modulus
        for r in range(self.world):
            counts[(13 * r) % modulus] += 1
        table = self.torch.tensor([sum(c * ((a + k) % modulus + 1) for k, c in enumerate(counts) if c) for a in range(modulus)], device=self.device)
        return self._periodic(n, start, modulus, lambda i: table[(i * 7 + salt) % modulus], dtype)

    def _periodic(self, n: int, start: int, modulus: int, f, dtype):
        """f over start..start+n-1, where f(i) depends on i only modulo ``modulus``:
        one period computed, the rest tiled (modulo over tens of MiB costs seconds on a CPU)."""
        period = f(self.torch.arange(start, start + modulus, device=self.device, dtype=self.torch.int64)).to(dtype or self.torch.float32)
        return period.repeat(-(-n // modulus))[:n]

    def _mine(self, n: int, dtype, salt: int, corrupt: bool):
        x = self._values(n, self.rank, salt, self._modulus(dtype), dtype=dtype).contiguous()
        if corrupt:
            x[n // 2] += 1  # one element off by one: exactly what the comparison must catch
        return x

    def _sentinel(self, n: int, dtype):
        return self.torch.full((n,), -7, dtype=dtype, device=self.device)

    # -- the ops --------------------------------------------------------------

    def all_reduce(self, n, dtype, salt, corrupt):
        x = self._mine(n, dtype, salt, corrupt)
        seconds = self._timed(lambda: [self.dist.all_reduce(x, async_op=True)], "all_reduce")
        exact = self._sum(n, salt, self._modulus(dtype))
        inexact = dtype != self.torch.float32 and self._modulus(dtype) * self.world > BF16_EXACT
        # Beyond 256, each of the world-1 additions rounds to bf16 (8 bits).
        tolerance = (self.world - 1) * 2.0**-8 if inexact else 0.0
        return x, exact, tolerance, seconds

    def all_gather(self, n, dtype, salt, corrupt):
        chunk = n // self.world
        out = self._sentinel(n, dtype)
        mine = self._mine(chunk, dtype, salt, corrupt)
        seconds = self._timed(lambda: [self.gather_fn(out, mine, async_op=True)], "all_gather")
        expected = self.torch.cat([self._values(chunk, r, salt, 61) for r in range(self.world)])
        return out, expected, 0.0, seconds

    def reduce_scatter(self, n, dtype, salt, corrupt):
        chunk = n // self.world
        out = self._sentinel(chunk, dtype)
        mine = self._mine(n, dtype, salt, corrupt)
        seconds = self._timed(lambda: [self.scatter_fn(out, mine, async_op=True)], "reduce_scatter")
        return out, self._sum(chunk, salt, 61, start=self.rank * chunk), 0.0, seconds

    def broadcast(self, n, dtype, salt, corrupt):
        root = self.world - 1  # not 0: a root that is not rank 0 is where hand-rolled code goes wrong
        buf = self._mine(n, dtype, salt, corrupt) if self.rank == root else self._sentinel(n, dtype)
        seconds = self._timed(lambda: [self.dist.broadcast(buf, src=root, async_op=True)], "broadcast")
        return buf, self._values(n, root, salt, 61), 0.0, seconds

    def send_recv(self, n, dtype, salt, corrupt):
        nxt, prev = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        mine, got = self._mine(n, dtype, salt, corrupt), self._sentinel(n, dtype)
        P2POp = self.dist.P2POp

        seconds = self._timed(lambda: self.dist.batch_isend_irecv([P2POp(self.dist.isend, mine, nxt), P2POp(self.dist.irecv, got, prev)]), "send_recv")
        return got, self._values(n, prev, salt, 61), 0.0, seconds

    # -- timing and checking --------------------------------------------------

    def _timed(self, start, what: str) -> float:
        """Seconds the op ``start()`` starts takes (it returns the op's Work objects).
        On the GPU, CUDA events around it on the current stream, waited for by
        spinning with --timeout as the deadline, as the bandwidth worker times its
        repeats: Work.wait() without blocking wait only makes the stream wait for
        NCCL's, so no host sleep lands in the figure. gloo: the host clock around its waits."""
        if not self.cuda:
            t = time.perf_counter()
            for work in start():
                work.wait()
            return round(time.perf_counter() - t, 6)
        begin, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        self.torch.cuda.synchronize(self.device)
        begin.record()
        for work in start():
            if what == "barrier":
                # NCCL's barrier wait() synchronizes the stream with no deadline: have it done first.
                _rank.spin(work.is_completed, self.timeout, what)
            work.wait()
        end.record()
        _rank.wait_for_gpu(self.torch, self.timeout, what, end)
        return round(begin.elapsed_time(end) / 1e3, 6)

    def _compare(self, got, expected, tolerance: float) -> str | None:
        """None when right; otherwise what is wrong, with the first bad element."""
        if tolerance == 0 and self.torch.equal(got, expected.to(got.dtype)):
            return None
        got, expected = got.float(), expected.float()
        bad = (got - expected).abs() > tolerance * expected.abs()
        wrong = int(bad.sum())
        if not wrong:
            return None
        first = int(bad.nonzero()[0, 0])
        return f"{wrong} of {got.numel()} elements wrong; element {first} is {got[first].item():g}, expected {expected[first].item():g}"


if __name__ == "__main__":
    _rank.exit_now(main())
