"""What cleaning terminal escapes costs a reader (base/tooltext.py): every tool's
output and every saved capture goes through it, so a plain text must cost
next to nothing and the largest capture `explain` reads (64 MiB) a fraction
of what parsing it costs.

Texts: the H200 `nvidia-smi topo -m` capture (driver 580's underlined header);
a 64 MiB kernel log, plain (the fast path) and coloured as `dmesg --color=always`
colours it (every line's stamp wrapped in escapes); the same coloured log with
CR LF endings. Run: python tests/perf/bench_tooltext.py [N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from preflight.base import tooltext
from preflight.readers.kernel import xid

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
FIXTURES = Path(__file__).parents[1] / "fixtures"


def best(f, text: str) -> float:
    times = []
    for _ in range(N):
        started = time.perf_counter()
        f(text)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    topo = (FIXTURES / "node" / "h200-1x-vm" / "nvidia-smi-topo-m.txt").read_text()
    line = (FIXTURES / "xid" / "no-gpu-event_dmesg_dev-machine-boot.txt").read_text().splitlines()
    plain = "\n".join(line * (64 * 2**20 // max(1, len("\n".join(line))) + 1))[: 64 * 2**20]
    coloured = "".join(f"\x1b[32m{ln[:14]}\x1b[0m{ln[14:]}\n" for ln in plain.splitlines())
    crlf = coloured.replace("\n", "\r\n")
    print(f"H200 topo -m ({len(topo)} B): clean {best(tooltext.clean, topo) * 1e6:.1f} us")
    for name, text in (("plain", plain), ("coloured", coloured), ("coloured, CR LF", crlf)):
        print(f"64 MiB kernel log, {name} ({len(text) / 2**20:.0f} MiB): clean {best(tooltext.clean, text):.3f} s")
    print(f"64 MiB kernel log, plain: xid.parse (which cleans first) {best(xid.parse, plain):.3f} s")


if __name__ == "__main__":
    main()
