"""A sustained, verified load on this rank's GPU (or CPU) for a fixed time.

Each burst runs --gemms matmuls back to back into the same output, then
compares the last result with the reference product computed once at the
start, bit for bit: the same inputs, shapes, device and library give the
same bits every time on a healthy GPU (cuBLAS is bit-wise reproducible on one
architecture and SM count, one stream; its documentation, "Results
reproducibility"), so any difference is the hardware computing wrong. Each
burst then copies a large buffer (HBM traffic, or host memory on CPU) and
checks the copy. A wrong result is recorded with when it came (seconds into
the burn) and which burst, and the burn goes on, so the report says whether it
happened once or kept happening. No collectives: each rank burns alone; the
agent samples NVML beside it. By hand:

    torchrun --nproc-per-node 8 burnin.py --seconds 60
    torchrun --nproc-per-node 2 burnin.py --backend gloo --device cpu --seconds 3 --gemm-n 256 --copy-bytes 16777216
"""

from __future__ import annotations

import argparse
import sys
import time

import _rank

SAVE_EVERY = 1.0  # seconds between rank{N}.json rewrites: the agent's live line and a dead rank's last word
MAX_BURSTS_KEPT = 4000  # per-burst figures kept in the report; past it, only the counts grow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="directory for rank{N}.json and rank{N}.log")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--seconds", type=float, default=300.0, help="how long to burn")
    p.add_argument("--gemm-n", type=int, default=8192)
    p.add_argument("--gemms", type=int, default=20, help="matmuls back to back in each burst")
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--timeout", type=float, default=60.0, help="the most one burst may take")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)

    me, report, save, fault = _rank.begin(args.out, "burnin", backend=args.backend, device=args.device, planned_seconds=args.seconds,
                                          gemm_n=args.gemm_n, gemms=args.gemms, copy_bytes=args.copy_bytes, bursts=0, burst_at=[], gemm_seconds=[],
                                          copy_seconds=[], wrong=[], wrong_bursts=0, step=0)
    return _rank.guarded(lambda: run(args, me, report, save, fault), report, save)


def gemm_dtype(capability: tuple[int, int] | None) -> str:
    """The GEMMs' torch dtype: bf16 where the tensor cores do it (compute capability 8.0 on);
    an older GPU, which only a profile of no SKU (generic) sends here, does fp16 (sums of 8192
    products of numbers under 2 stay under 32768, within its range); the CPU (None) fp32."""
    if capability is None:
        return "float32"
    return "bfloat16" if tuple(capability) >= (8, 0) else "float16"


def run(args, me: _rank.Rank, report: dict, save, fault: _rank.Fault) -> int:
    t0 = time.perf_counter()
    started = _rank.start_torch(args.device, me.local_rank, report, save)
    if started is None:
        return 1
    torch, _dist, device = started
    report["stage"] = "build"
    save()
    gpu = device.type == "cuda"
    dtype = getattr(torch, gemm_dtype(torch.cuda.get_device_capability(device) if gpu else None))
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    # Inputs in [1, 2): no zeros, no denormals, every product term matters.
    a = (torch.rand(args.gemm_n, args.gemm_n, generator=gen) + 1).to(device, dtype)
    b = (torch.rand(args.gemm_n, args.gemm_n, generator=gen) + 1).to(device, dtype)
    out = torch.empty_like(a)
    reference = torch.matmul(a, b)
    n_copy = max(1, args.copy_bytes // 4)
    src = torch.rand(n_copy, generator=gen).to(device)
    dst = torch.empty_like(src)
    sync = (lambda what: _rank.wait_for_gpu(torch, args.timeout, what)) if gpu else (lambda what: None)
    sync("reference GEMM")

    kind = fault.at("burnin")
    wrong_after = fault.value("burnin", 0.0) if kind == "wrong" else None  # the fault's results go wrong this many seconds in
    # The SM count beside the checksum: cuBLAS gives the same bits only on the same architecture and SM count
    # (its "Results reproducibility"), so the check compares references only among GPUs alike in both.
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if gpu else None
    report.update(stage="burnin", reference_checksum=_checksum(torch, reference), sm_count=sm_count, burn_started_at=time.time())
    save()
    start = time.perf_counter()
    saved = start
    while time.perf_counter() - start < args.seconds:
        k = report["bursts"]
        t = time.perf_counter()
        for _ in range(args.gemms):
            torch.matmul(a, b, out=out)
        sync(f"GEMM burst {k}")
        t_gemm = time.perf_counter() - t
        at = round(t - start, 3)
        if wrong_after is not None and at >= wrong_after:
            out.view(-1)[(k * 7919) % out.numel()] += 1  # a wrong element, somewhere else each burst
        t = time.perf_counter()
        dst.copy_(src)
        sync(f"copy burst {k}")
        t_copy = time.perf_counter() - t
        _compare(torch, report, k, at, "gemm", out, reference)
        _compare(torch, report, k, at, "copy", dst, src)
        report["bursts"] = report["step"] = k + 1
        if k < MAX_BURSTS_KEPT:
            report["burst_at"].append(at)
            report["gemm_seconds"].append(round(t_gemm, 6))
            report["copy_seconds"].append(round(t_copy, 6))
        if time.perf_counter() - saved >= SAVE_EVERY:
            save()
            saved = time.perf_counter()
    report.update(stage="done", burn_seconds=round(time.perf_counter() - start, 3), seconds=round(time.perf_counter() - t0, 4))
    save()
    return 0


def _compare(torch, report: dict, burst: int, at: float, what: str, got, want) -> None:
    """Bit for bit: the same computation on the same device. A difference is recorded with where and when."""
    if torch.equal(got, want):
        return
    differs = (got != want).view(-1)
    first = int(differs.nonzero()[0])
    if len(report["wrong"]) < 20:  # the first ones say when it began; the count says how often
        diff = (got.float() - want.float()).abs().max().item()
        report["wrong"].append({"burst": burst, "at_seconds": at, "what": what, "elements": int(differs.sum()), "first_index": first, "max_abs_diff": diff})
    if report.get("last_wrong_burst") != burst:
        report["wrong_bursts"] += 1
        report["last_wrong_burst"] = burst


def _checksum(torch, t) -> str:
    """A sum of the tensor's bits, so the ranks' references can be compared in the report."""
    flat = t.contiguous().view(-1)
    bits = flat.view(torch.int16 if flat.element_size() == 2 else torch.int32).to(torch.int64)
    return f"{int(bits.sum()) & 0xFFFFFFFFFFFF:012x}"


if __name__ == "__main__":
    _rank.exit_now(main())
