"""A plain torch loop on one GPU: the figures preflight's own must agree with.

Each figure is measured the simplest way, CUDA events around a loop, so the
acceptance kit (run.sh) can print preflight's figures beside these as ratios:

- HBM copy: copy_ between two 1 GiB device buffers, bytes read + written a second
  (the bandwidth check's hbm_copy_bandwidth);
- H2D and D2H: a 512 MiB pinned host buffer to and from the device
  (h2d_bandwidth, d2h_bandwidth);
- bf16 8192^3 GEMM, three ways, because a GEMM's speed depends on the GPU's power
  state and on the bits it multiplies (an H200 at its 700 W cap: 741 TFLOP/s
  in its first burst, 674 once the cap settled, 755 on inputs in [1, 2);
  tests/fixtures/node/h200-1x-vm):
  `gemm_bf16_8192_first_Fps`, normal data, the first 50-matmul burst after a
  second idle (what a short loop reads);
  `gemm_bf16_8192_Fps`, normal data, after 0.5 s of untimed bursts (the train
  check's method: gemm_throughput);
  `gemm_bf16_8192_uniform12_Fps`, inputs in [1, 2), after the same warm-up
  (the burn-in's data: burnin_gemm_throughput).

Standard library and torch only. `--device cpu` is a dry run of the same code
(fp32, perf_counter, small sizes): it proves the script, not a figure.

    python3 tests/gpu/reference.py --out reference.json
    python3 tests/gpu/reference.py --device cpu --gemm-n 128 --copy-bytes 8388608 --host-bytes 8388608 --seconds 0.2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--gemm-n", type=int, default=8192)
    p.add_argument("--burst", type=int, default=50, help="matmuls back to back in each timed burst")
    p.add_argument("--warmup-seconds", type=float, default=0.5, help="untimed GEMM bursts before the sustained figures")
    p.add_argument("--seconds", type=float, default=2.0, help="timed bursts for each sustained GEMM figure")
    p.add_argument("--copy-bytes", type=int, default=1 << 30)
    p.add_argument("--host-bytes", type=int, default=512 << 20)
    p.add_argument("--repeats", type=int, default=20, help="timed copies for each copy figure")
    p.add_argument("--out", help="write the figures here as JSON (else stdout only)")
    args = p.parse_args(argv)

    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("reference.py: no CUDA device; --device cpu is the dry run", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    clock = Clock(torch, cuda)
    doc: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)", "torch": torch.__version__,
                 "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}

    n = max(1, args.copy_bytes // 4)
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    doc["d2d_copy_rw_Bps"] = 2 * n * 4 * args.repeats / clock.time(lambda: dst.copy_(src), args.repeats, warm=3)
    del src, dst

    m = max(1, args.host_bytes // 4)
    host = torch.rand(m, pin_memory=cuda)
    dev = torch.empty(m, device=device)
    doc["h2d_Bps"] = m * 4 * args.repeats / clock.time(lambda: dev.copy_(host, non_blocking=True), args.repeats, warm=2)
    doc["d2h_Bps"] = m * 4 * args.repeats / clock.time(lambda: host.copy_(dev, non_blocking=True), args.repeats, warm=2)
    del host, dev

    dtype = torch.bfloat16 if cuda else torch.float32
    g = args.gemm_n
    flops = 2 * g**3 * args.burst
    normal = (torch.randn(g, g, device=device, dtype=dtype), torch.randn(g, g, device=device, dtype=dtype))
    out = torch.empty(g, g, device=device, dtype=dtype)

    def burst(a, b):
        return lambda: [torch.matmul(a, b, out=out) for _ in range(args.burst)]

    clock.sync()
    time.sleep(1.0)  # idle: the first burst starts from the clocks a short loop starts from
    doc["gemm_bf16_8192_first_Fps"] = flops / clock.time(burst(*normal), 1, warm=0, warm_matmuls=lambda: torch.matmul(*normal, out=out))
    doc["gemm_bf16_8192_Fps"] = flops / clock.sustained(burst(*normal), args.warmup_seconds, args.seconds)
    ones = [(torch.rand(g, g, device=device) + 1).to(dtype) for _ in range(2)]
    doc["gemm_bf16_8192_uniform12_Fps"] = flops / clock.sustained(burst(*ones), args.warmup_seconds, args.seconds)
    doc["method"] = {
        "gemm_n": g, "dtype": str(dtype), "burst": args.burst, "warmup_seconds": args.warmup_seconds, "seconds": args.seconds,
        "copy_bytes": n * 4, "host_bytes": m * 4, "pinned": cuda, "repeats": args.repeats,
        "timing": "CUDA events around each loop" if cuda else "perf_counter (dry run)",
        "statistic": "copies: total over the repeats; sustained GEMM: median burst",
    }
    text = json.dumps(doc)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


class Clock:
    """Seconds a loop took: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, once, repeats: int, warm: int, warm_matmuls=None) -> float:
        for _ in range(warm):
            once()
        for _ in range(2 if warm_matmuls else 0):
            warm_matmuls()
        self.sync()
        if not self.cuda:
            t = time.perf_counter()
            for _ in range(repeats):
                once()
            return time.perf_counter() - t
        start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            once()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def sustained(self, once, warmup: float, seconds: float) -> float:
        """The median burst's seconds, timed after ``warmup`` seconds of untimed bursts."""
        t = time.perf_counter()
        while time.perf_counter() - t < warmup:
            once()
            self.sync()
        times: list[float] = []
        t = time.perf_counter()
        while not times or time.perf_counter() - t < seconds:
            times.append(self.time(once, 1, warm=0))
        return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
