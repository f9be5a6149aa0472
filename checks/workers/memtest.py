"""Write patterns over most of this rank's free GPU memory (a host buffer on
CPU) and read them back, capped by time.

One int64 buffer holds --fraction of the free memory, worked in chunks so
the comparison's temporaries stay small. Patterns, in order: address in
address (each 8-byte word holds its own index: a fault in the address lines
writes one word over another, which a uniform pattern cannot see), walking
ones (every word 1 << bit, for each of the 64 bits: a stuck or shorted data
bit), and random from a seed (each chunk regenerated from (seed, chunk) for
the read-back: pattern-sensitive cells). A mismatch is recorded with its byte
offset in the buffer, the word written and the word read (the first few), and
the test goes on to the next pattern. Patterns not reached by --seconds are
said so. By hand:

    torchrun --nproc-per-node 8 memtest.py --fraction 0.9 --seconds 60
    torchrun --nproc-per-node 2 memtest.py --backend gloo --device cpu --host-bytes 67108864
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import _rank

CHUNK_WORDS = 32 << 20  # 256 MiB of int64 a chunk: the compare's bool temporary is 32 MiB
MAX_MISMATCHES = 8  # offsets kept per pattern
UNIFIED_FRACTION = 0.5  # of the free memory, on a GPU with no memory of its own (gb10.toml's [memtest])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for rank{N}.json and rank{N}.log")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--fraction", type=float, default=0.9, help="of the GPU's free memory")
    p.add_argument("--host-bytes", type=int, default=64 << 20, help="the buffer on CPU")
    p.add_argument("--seconds", type=float, default=120.0, help="stop after the pattern under way past this")
    p.add_argument("--seed", type=int, default=20260522)
    p.add_argument("--timeout", type=float, default=60.0, help="the most one pass over the buffer may take")
    args = p.parse_args(argv)

    me, report, save, fault = _rank.begin(args.out, "memtest", backend=args.backend, device=args.device, buffer_bytes=None, free_bytes=None,
                                          total_bytes=None, patterns=[], mismatches=[], not_reached=[], step=0)
    return _rank.guarded(lambda: run(args, me, report, save, fault), report, save)


def fraction_of_free(asked: float, integrated: bool) -> float:
    """How much of the free memory to test. A GPU on the host's own memory (GB10 and its kin)
    counts the host's free memory as its own: past half of it, the OOM killer may pick the agent
    or a daemon (profile gb10), so it gets at most half, whatever the profile asks."""
    return min(asked, UNIFIED_FRACTION) if integrated else asked


def free_to_test(cuda_free: int, integrated: bool, meminfo: str | None) -> int:
    """The free memory the test sizes its buffer by. On a GPU with the host's memory (GB10),
    cudaMemGetInfo's free leaves out what the kernel would reclaim for an allocation (the
    page cache, buffers): NVIDIA's DGX Spark known issues ("Guidance for reporting memory
    resources with unified memory architecture") and its llama.cpp change (ggml-org/llama.cpp
    PR 17368) take /proc/meminfo's MemAvailable instead, and a healthy idle GB10 holds most
    of its memory as page cache (gpud PR 1170: 7.4 GiB free of 120 GiB, 6.4 GiB used). So
    there the larger of the two; a discrete GPU's own memory is cudaMemGetInfo's alone."""
    if not integrated or not meminfo:
        return cuda_free
    m = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.M)
    return max(cuda_free, int(m[1]) * 1024) if m else cuda_free


def _meminfo() -> str | None:
    try:
        with open("/proc/meminfo") as f:
            return f.read()
    except OSError:
        return None


def run(args, me: _rank.Rank, report: dict, save, fault: _rank.Fault) -> int:
    t0 = time.perf_counter()
    started = _rank.start_torch(args.device, me.local_rank, report, save)
    if started is None:
        return 1
    torch, _dist, device = started
    gpu = device.type == "cuda"
    if gpu:
        cuda_free, total = torch.cuda.mem_get_info(device)
        integrated = bool(torch.cuda.get_device_properties(device).is_integrated)
        free = free_to_test(cuda_free, integrated, _meminfo() if integrated else None)
        fraction = fraction_of_free(args.fraction, integrated)
        size = int(free * fraction) - 2 * CHUNK_WORDS * 8  # room for a chunk's generated pattern and its compare
        report.update(fraction=fraction)
        # The other GPUs this process holds a context on (bandwidth's P2P copies, local rank 0 only,
        # in a launch shared by several stages): their free memory is that much less for their own rank.
        report.update(free_bytes=free, total_bytes=total, contexts_elsewhere=sorted(_rank.WORLD.get("contexts_elsewhere", ())))
    else:
        size = args.host_bytes
    words = max(1, size // 8)
    report.update(stage="allocate", buffer_bytes=words * 8)
    save()
    buf = torch.empty(words, dtype=torch.int64, device=device)
    sync = (lambda what: _rank.wait_for_gpu(torch, args.timeout, what)) if gpu else (lambda what: None)
    kind = fault.at("memtest")
    # The fault flips one bit of the word at this byte offset after the first pattern is written.
    flip_at = int(fault.value("memtest", words // 2 * 8)) // 8 if kind == "wrong" else None
    start = time.perf_counter()
    plan = [("address", None)] + [("walking_ones", bit) for bit in range(64)] + [("random", None)]
    for i, (name, bit) in enumerate(plan):
        label = name if bit is None else f"{name} bit {bit}"
        if time.perf_counter() - start > args.seconds:
            report["not_reached"] = sorted({n for n, _ in plan[i:]}, key=[n for n, _ in plan].index)
            break
        report.update(stage=name, step=i)
        save()
        t = time.perf_counter()
        for lo, hi in _chunks(words):
            want = _pattern(torch, name, bit, lo, hi, args.seed, device)
            buf[lo:hi].fill_(want) if isinstance(want, int) else buf[lo:hi].copy_(want)
        sync(f"writing {label}")
        if flip_at is not None:
            buf[flip_at] ^= 1
            flip_at = None
        bad = 0
        for lo, hi in _chunks(words):
            want = _pattern(torch, name, bit, lo, hi, args.seed, device)
            differs = buf[lo:hi] != want
            if bool(differs.any()):
                idx = differs.nonzero().view(-1)
                bad += int(idx.numel())
                for j in idx[: max(0, MAX_MISMATCHES - len(report["mismatches"]))].tolist():
                    report["mismatches"].append({"pattern": label, "offset": (lo + j) * 8, "wrote": f"{int(want if isinstance(want, int) else want[j]) & (2**64 - 1):#018x}",
                                                 "read": f"{int(buf[lo + j]) & (2**64 - 1):#018x}"})
        sync(f"reading {label}")
        entry = next((p for p in report["patterns"] if p["name"] == name), None)
        if entry is None:
            entry = {"name": name, "passes": 0, "seconds": 0.0, "mismatched_words": 0}
            report["patterns"].append(entry)
        entry["passes"] += 1
        entry["seconds"] = round(entry["seconds"] + time.perf_counter() - t, 4)
        entry["mismatched_words"] += bad
    del buf
    report.update(stage="done", test_seconds=round(time.perf_counter() - start, 3), seconds=round(time.perf_counter() - t0, 4))
    save()
    return 0


def _chunks(words: int):
    for lo in range(0, words, CHUNK_WORDS):
        yield lo, min(words, lo + CHUNK_WORDS)


def _pattern(torch, name: str, bit: int | None, lo: int, hi: int, seed: int, device):
    """The words [lo, hi) of a pattern, the same each time it is asked for (an int: every word the same)."""
    if name == "address":
        return torch.arange(lo, hi, dtype=torch.int64, device=device)
    if name == "walking_ones":
        return 1 << bit if bit < 63 else -(1 << 63)  # int64: bit 63 is the sign
    gen = torch.Generator(device=device).manual_seed(seed * 1000003 + lo)
    return torch.randint(-(1 << 63), (1 << 63) - 1, (hi - lo,), dtype=torch.int64, device=device, generator=gen)


if __name__ == "__main__":
    _rank.exit_now(main())
