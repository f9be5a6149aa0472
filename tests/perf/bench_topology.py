"""Time of each part of the topology check, against its budget: "well under a
second" on a node (it is a parser and a few file reads).

Parts: parsing a 8-GPU, 12-NIC capture, the NVML child, `nvidia-smi topo -m`
(a stand-in printing that capture where there is no GPU), the same matrix
built from NVML and sysfs where nvidia-smi's cannot be read, the sysfs reads
(the recorded HGX tree, and this machine's /sys), the torchrun
--numa-binding lookup, the judges and advice, and the whole
`preflight run --only topology`. On a GPU node everything is real.
Run: python tests/perf/bench_topology.py [N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests/, for fakes
sys.path.insert(0, str(HERE))  # timing

import fakes  # noqa: E402
import timing  # noqa: E402
from preflight.checkkit import placement  # noqa: E402
from preflight.checks import topology  # noqa: E402

from preflight.readers.machine import layout  # noqa: E402
from preflight.readers.nvidia import nvml, topo  # noqa: E402
from preflight.readers.machine import topo_derived  # noqa: E402
from preflight.base.host import Host  # noqa: E402
from preflight.pipeline.settings import Settings  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
FIXTURES = HERE.parent / "fixtures"
CAPTURE = FIXTURES / "topo" / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"
FACTS = FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"
TREE = FIXTURES / "sysfs" / "hgx-h100"
REAL = Path("/dev/nvidiactl").exists()


def timed(label: str, fn) -> None:
    timing.timed(label, fn, N, 52)


def main() -> None:
    print(f"{'part':<52} {'median':>10} {'min':>10} {'max':>10}   (n={N}, {'real GPU' if REAL else 'no GPU: fake pynvml and nvidia-smi'})")
    tmp = Path(tempfile.mkdtemp())
    text = CAPTURE.read_text()
    timed("parse an 8-GPU, 12-NIC topo -m capture", lambda: topo.parse(text))
    env = dict(os.environ)
    if not REAL:
        os.environ["PYTHONPATH"] = str(fakes.install_fake_pynvml(tmp / "nvml"))
        os.environ["FAKE_NVML_FACTS"] = str(FACTS)
        os.environ["PATH"] = f"{fakes.nvidia_smi(tmp / 'bin', CAPTURE)}:{os.environ['PATH']}"
    timed("NVML inventory (child process)", lambda: nvml.inventory())
    timed("nvidia-smi topo -m + parse", lambda: layout.run_matrix(Host(), 15))
    inventory = nvml.inventory()
    timed("sysfs: GPUs, NICs, NUMA, cpuset (recorded HGX tree)", lambda: (layout.gpu_places(Host(TREE), inventory), layout.nics(Host(TREE)), layout.machine_cpus(Host(TREE))))
    timed("sysfs: the same on this machine", lambda: (layout.gpu_places(Host(), inventory), layout.nics(Host()), layout.machine_cpus(Host())))
    timed("torchrun --numa-binding lookup (no torch import)", lambda: layout.torch_numa_binding(sys.executable))
    s = Settings(nvml_fake=None if REAL else FACTS)
    facts = topology.gather(Host(TREE, environ=os.environ), s, time.monotonic() + 30)
    expect = topology.ANY_SKU
    timed("judges + advice", lambda: (topology.judge(facts, expect, 12), placement.advise(facts)))
    # Where `nvidia-smi topo -m` cannot be read: the matrix built from NVML and sysfs instead.
    unread = facts.model_copy(update={"matrix": None, "matrix_error": "unreadable", "answered": {}})
    timed("matrix from NVML and sysfs (recorded HGX tree)", lambda: topo_derived.complete(Host(TREE), unread))
    built = topo_derived.complete(Host(TREE), unread)
    timed("judges + advice on that matrix", lambda: (topology.judge(built, expect, 12), placement.advise(built)))
    args = [sys.executable, "-m", "preflight", "run", "--profile", "h100-sxm", "--only", "topology", "-q", "--scratch", "--lock-file", str(tmp / "lock")]
    if not REAL:
        args += ["--nvml-fake", str(FACTS)]
    timed("preflight run --only topology (whole process)", lambda: subprocess.run(args, capture_output=True))
    done = subprocess.run([*args, "--json"], capture_output=True, text=True)
    check = json.loads(done.stdout)["checks"][0]
    print(f"  the check itself, as the report times it: {check['duration_seconds'] * 1000:.0f}ms ({check['status']}: {check['summary'][:70]})")
    os.environ.clear()
    os.environ.update(env)


if __name__ == "__main__":
    main()
