"""Time of `preflight nccl-log`'s parts on logs of growing size, to show the
parse stays linear (time per line flat from 20k to 200k lines, and at the
64 MiB the command accepts) and the text and JSON cost little beside it.

The logs are the recorded ones of tests/fixtures/nccl repeated: a mix of
channel lines, WARNs, return chains and error signatures.
Run: python tests/perf/bench_nccl_log.py [N]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # timing

import timing  # noqa: E402

from preflight.outputs.explain import nccl_log_text  # noqa: E402
from preflight.readers.nccl import nccl_log  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
UNIT = "".join(p.read_text() for p in sorted((HERE.parent / "fixtures" / "nccl").glob("*.log")))


def log_of(lines: int) -> str:
    return UNIT * (lines // UNIT.count("\n") + 1)


def main() -> None:
    print(f"{'part':<52} {'median':>10} {'min':>10} {'max':>10}   (n={N})")
    for lines in (20_000, 100_000, 200_000):
        text = log_of(lines)
        timing.timed(f"parse {text.count(chr(10)):,} lines ({len(text) >> 20} MiB)", lambda: nccl_log.parse(text), N)
    text = log_of(200_000)
    log = nccl_log.parse(text)
    timing.timed("render (200k lines)", lambda: nccl_log_text.render(log, "x"), N)
    timing.timed("to_json (200k lines)", lambda: nccl_log_text.to_json(log, "x"), N)
    biggest = UNIT * (nccl_log.MAX_BYTES // len(UNIT.encode()))
    timing.timed(f"parse the largest accepted log ({len(biggest.encode()) >> 20} MiB)", lambda: nccl_log.parse(biggest), 1)
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(text)
        f.flush()
        args = [sys.executable, "-m", "preflight", "nccl-log", f.name]
        timing.timed("preflight nccl-log (200k lines, whole process)", lambda: subprocess.run(args, capture_output=True), N)


if __name__ == "__main__":
    main()
