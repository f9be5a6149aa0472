"""What reading the journal costs the Xid scan (readers/kernel/journal.py): `journalctl -k -b
-o json` is read where /dev/kmsg fails, and beside it wherever the ring has wrapped
(on a long-running node, at every run), within the scan's 10 s.

Text: 50,000 kernel messages in journalctl's JSON layout (the fields of
tests/fixtures/journal), one in 1,000 a driver line, the rest a flood of refused
mount options. Prints the time to turn it into lines and to pick the driver lines
older than a wrapped ring's first record. Run: python tests/perf/bench_journal.py [N]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from preflight.readers.kernel import journal, xid

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ENTRIES = 50_000
ENTRY = json.loads((Path(__file__).parents[1] / "fixtures" / "journal"
                    / "journalctl-json_ring-wrapped_xid48-at-3s_xid79-also-in-ring_handmade.txt").read_text().splitlines()[0])


def best(f) -> float:
    times = []
    for _ in range(N):
        started = time.perf_counter()
        f()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    rows = []
    for i in range(ENTRIES):
        usec = str(1_000_000 + i * 100)
        msg = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=p, Graphics Exception" if i % 1000 == 0 else f"tmpfs: Unknown parameter 'flood-{i:06d}'"
        rows.append(json.dumps({**ENTRY, "__MONOTONIC_TIMESTAMP": usec, "_SOURCE_MONOTONIC_TIMESTAMP": usec, "MESSAGE": msg}))
    out = "\n".join(rows) + "\n"
    text = journal.lines(out) or ""
    keep = lambda line: bool(xid.DRIVER_MARK.search(line) and xid.parse(line))  # noqa: E731 - as readers/kernel/log_sources.py picks them
    print(f"{ENTRIES} messages, {len(out) / 2**20:.1f} MiB of JSON: lines() {best(lambda: journal.lines(out)):.2f} s, "
          f"older driver lines {best(lambda: journal.before(text, 10**12, keep)):.2f} s "
          f"({len(journal.before(text, 10**12, keep))} found)")


if __name__ == "__main__":
    main()
