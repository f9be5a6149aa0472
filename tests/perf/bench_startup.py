"""Start-up cost of the CLI: `preflight --help` must stay cheap (it never imports torch).

Prints the median and spread of N runs of each command, next to a bare Python
start-up and `import torch` for scale. Run: python tests/perf/bench_startup.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
PY = sys.executable
COMMANDS = {
    "python -c pass": [PY, "-c", "pass"],
    "preflight --help": [PY, "-m", "preflight", "--help"],
    "preflight version": [PY, "-m", "preflight", "version"],
    "preflight list": [PY, "-m", "preflight", "list"],
    "preflight run --profile cpu": [PY, "-m", "preflight", "run", "--profile", "cpu", "-q", "--lock-file", "/tmp/preflight-bench.lock"],
    "python -c 'import torch'": [PY, "-c", "import torch"],
}


def main() -> None:
    print(f"{'command':<32} {'median':>9} {'min':>9} {'max':>9}   (n={N}, {sys.version.split()[0]})")
    for label, argv in COMMANDS.items():
        times = []
        for _ in range(N):
            start = time.perf_counter()
            p = subprocess.run(argv, capture_output=True)
            times.append(time.perf_counter() - start)
            if p.returncode not in (0,):
                print(f"{label:<32} exited {p.returncode}: {p.stderr.decode()[-200:]}")
                break
        else:
            print(f"{label:<32} {statistics.median(times) * 1000:>7.0f}ms {min(times) * 1000:>7.0f}ms {max(times) * 1000:>7.0f}ms")


if __name__ == "__main__":
    main()
