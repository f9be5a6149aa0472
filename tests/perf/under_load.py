"""The test suite (or part of it) with CPU hogs spinning beside it: a test that
passes alone and fails here leaned on a quiet machine (a fault a load can hide,
a healthy figure a load can make an outlier) and must be made unambiguous, not
loosened.

Starts the hogs (by default two, as the 2-core CI VM's acceptance run), runs
`python -m pytest ARGS` with them spinning, and ends them however pytest ends:
killed in a `finally`, and each stops by itself after --limit seconds, so even
a SIGKILLed script leaves nothing spinning. Exits with pytest's code.

Run: python tests/perf/under_load.py [--hogs 2] [--limit 7200] -- tests/checks -x
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench_cpu_under_load import start_hogs, stop_hogs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hogs", type=int, default=2, help="CPU hogs to run (default 2)")
    p.add_argument("--limit", type=float, default=7200.0, help="seconds after which each hog stops by itself")
    p.add_argument("pytest_args", nargs="*", help="pytest's arguments, after --")
    a = p.parse_args()
    hogs = start_hogs(a.hogs, a.limit)
    try:
        time.sleep(1)  # the hogs at full spin before the first test
        print(f"{a.hogs} CPU hogs spinning; python -m pytest {' '.join(a.pytest_args)}", flush=True)
        return subprocess.run([sys.executable, "-m", "pytest", *a.pytest_args]).returncode
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    sys.exit(main())
