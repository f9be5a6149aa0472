"""Time of each part of the cuda check, against its budget: under 10 s on a
healthy 8-GPU node with persistence mode on.

Parts: the NVML child, the kernel-log Xid scan, the cuda_init worker (python
start, `import torch`, init, a matmul per GPU, the PCIe load read), and the
whole `preflight run --only cuda`. On a GPU node it uses NVML and CUDA for
real; elsewhere a fake pynvml serving tests/fixtures/nvml's 8 x H100 facts
times the NVML child, and the worker stops at "CPU-only build" after
importing torch. Run: python tests/perf/bench_cuda.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests/, for fakes
sys.path.insert(0, str(HERE))  # timing

import fakes  # noqa: E402
import timing  # noqa: E402
from preflight.gpuwork import cuda_init  # noqa: E402

from preflight.readers.nvidia import nvml  # noqa: E402
from preflight.readers.kernel import log_sources, xid  # noqa: E402
from preflight.base.host import Host  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
FACTS = HERE.parent / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"
REAL = Path("/dev/nvidiactl").exists()


def timed(label: str, fn) -> None:
    timing.timed(label, fn, N, 48)


def main() -> None:
    print(f"{'part':<48} {'median':>10} {'min':>10} {'max':>10}   (n={N}, {'real GPU' if REAL else 'no GPU: fake pynvml, CPU torch'})")
    tmp = Path(tempfile.mkdtemp())
    env = dict(os.environ)
    if not REAL:
        os.environ["PYTHONPATH"] = str(fakes.install_fake_pynvml(tmp / "nvml"))
        os.environ["FAKE_NVML_FACTS"] = str(FACTS)
    timed("NVML inventory (child process)", lambda: nvml.inventory())
    timed("NVML PCIe link read (child process)", lambda: nvml.pcie_links())
    timed("kernel log read + Xid parse", lambda: xid.parse(log_sources.read_kernel_log(Host(), 10)[0]))
    outcome = {}

    def init() -> None:
        outcome["o"], _ = cuda_init.run_init(sys.executable, 120, read_links=REAL)

    timed("cuda_init worker" + ("" if REAL else " (stops at CPU-only build)"), init)
    r = outcome["o"].report
    if r is not None:
        per = ", ".join(f"GPU {d.index} {d.seconds * 1000:.0f}ms" for d in r.devices) or r.error
        init = f"{r.init_seconds}s" if r.init_seconds is not None else "not reached"
        print(f"  worker: import torch {r.import_seconds}s, CUDA init {init}; {per}")
    args = [sys.executable, "-m", "preflight", "run", "--profile", "h100-sxm", "--only", "cuda", "-q", "--scratch", "--lock-file", str(tmp / "lock")]
    if not REAL:
        args += ["--nvml-fake", str(FACTS)]
    os.environ.clear()
    os.environ.update(env)
    timed("preflight run --only cuda (whole process)", lambda: subprocess.run(args, capture_output=True))


if __name__ == "__main__":
    main()
