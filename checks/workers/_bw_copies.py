"""The bandwidth bench's copy steps, a mixin of checks/workers/bandwidth.py's
Bench: copies within one device (HBM on a GPU, memcpy on the host), pinned
host<->device copies one local rank at a time, and copy-engine GPU->GPU copies
for every ordered pair, driven by local rank 0's one process (nvbandwidth's
way). Apart from the collectives (_bw_collectives.py): these are copies the
copy engines or the memory bus do, measured in turns so no two share a path;
their timing and buffers are _bw_bench.py's. Standard library and torch
(passed in) only; imported as ``_bw_copies`` from beside the workers.
"""

from __future__ import annotations

import time

import _rank
from _bw_bench import fit


class Copies:
    """hbm_copy, memcpy, h2d, d2h and p2p: Bench's copy steps (the plumbing is _bw_bench.BenchBase's)."""

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


def pairs(n: int) -> list[tuple[int, int]]:
    """Every ordered pair of n GPUs, (source, destination), in rounds: in round k each GPU
    writes to the one k after it. checks/bandwidth.py's p2p_plan counts them alike."""
    return [(src, (src + k) % n) for k in range(1, n) for src in range(n)]
