"""The quick level on the 8-GPU H100 facts, and how many NVML inventories it reads.

Each inventory is a child process (python start, nvidia-ml-py, NVML init) and a
0.4 s window of clock readings (nvml_inventory.CLOCK_SAMPLES): a run that reads it
once per check pays that several times. Two ways, interleaved round by round so
a burst of load falls on both:

- "fake file": `--nvml-fake` (FakeNvml), the facts from JSON; it starts no
  child, so its time shows everything but NVML's own cost;
- "NVML child": the real child (preflight.readers.nvidia.nvml_query) over the stand-in
  nvidia-ml-py of tests/fakes.py serving the same facts, as a GPU node's run
  starts it (its 0.4 s window included; NVML init itself costs more on a GPU).

Each run is a real `preflight run --profile auto --level quick --keep-going` with
`nvidia-smi topo -m` served from a capture; shm is skipped (its write is the
profile's floor, not NVML). A site hook on PYTHONPATH counts every Python the
run starts, by what it runs, and whether any imported torch (the quick level
must not). Prints the median, min and max wall time and the children per run.

Run: python tests/perf/bench_nvml_reads.py [N]   (default 5)
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests/, for fakes

import fakes  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
FIXTURES = HERE.parent / "fixtures"
FACTS = FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"
TOPO = FIXTURES / "topo" / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"
HOOK = (
    "import atexit, json, os, sys\n"
    "def _said():\n"
    "    with open(os.environ['BENCH_PYTHONS'], 'a') as f:\n"
    "        f.write(json.dumps({'argv': sys.argv, 'torch': 'torch' in sys.modules}) + '\\n')\n"
    "atexit.register(_said)\n"
)


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-nvml-"))
    try:
        (tmp / "hook").mkdir()
        (tmp / "hook" / "sitecustomize.py").write_text(HOOK)
        pynvml_dir = fakes.install_fake_pynvml(tmp / "nvml")
        bin_dir = fakes.nvidia_smi(tmp / "bin", TOPO)
        base = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        base |= {"PATH": f"{bin_dir}:{base['PATH']}", "PREFLIGHT_LOCK_FILE": str(tmp / "lock"), "FAKE_NVML_FACTS": str(FACTS)}
        run = [*fakes.PREFLIGHT, "run", "--profile", "auto", "--level", "quick", "--keep-going", "--skip", "shm", "--scratch"]
        ways = {
            "fake file (--nvml-fake)": (["--nvml-fake", str(FACTS)], str(tmp / "hook")),
            "NVML child (stand-in nvidia-ml-py)": ([], f"{tmp / 'hook'}:{pynvml_dir}"),
        }
        times: dict[str, list[float]] = collections.defaultdict(list)
        children: dict[str, list[int]] = collections.defaultdict(list)
        torch: dict[str, int] = collections.defaultdict(int)
        for round_ in range(N + 1):  # round 0 writes the bytecode and is not counted
            for label, (extra, pythonpath) in ways.items():
                log = tmp / "pythons.jsonl"
                log.unlink(missing_ok=True)
                report = tmp / "report.json"
                env = {**base, "PYTHONPATH": pythonpath, "BENCH_PYTHONS": str(log)}
                start = time.perf_counter()
                p = subprocess.run([*run, *extra, "--report", str(report)], env=env, capture_output=True, text=True, timeout=300)
                took = time.perf_counter() - start
                checks = [c["check"] for c in json.loads(report.read_text())["checks"]] if report.exists() else []
                if p.returncode not in (0, 1) or "cuda" not in checks:
                    print(f"{label}: exit {p.returncode}, checks {checks}: {p.stderr[-400:]}")
                    return 1
                pythons = [json.loads(line) for line in log.read_text().splitlines()]
                if round_:
                    times[label].append(took)
                    children[label].append(sum(1 for x in pythons if x["argv"][-1:] == ["inventory"] and "nvml_query" in x["argv"][0]))
                    torch[label] += sum(x["torch"] for x in pythons)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'quick level, 8 x H100 facts, shm skipped':<40} {'median':>8} {'min':>8} {'max':>8}  NVML inventory children per run  torch imports"
          f"   (n={N}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    for label in ways:
        t = times[label]
        print(f"{label:<40} {statistics.median(t):>7.2f}s {min(t):>7.2f}s {max(t):>7.2f}s  {sorted(set(children[label]))!s:<32} {torch[label]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
