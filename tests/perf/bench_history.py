"""The history at its retention cap: 10,000 runs, each with every figure of a whole 8-GPU
H100 report (tests/fixtures/reports/h100-8x-built.json, 379 figures) or of a cpu run
(cpu-pass.json, 33), and how long reading it takes.

Prints, per report kind: the database's size, `preflight history` as a person runs it
(a whole process: start, the last 30 runs' timeline and every figure's trend), the same
with --json and with one --figure, the read a run makes before its verdict (each figure's
last 34 readings, for drift, and a week of runs, for lemons), and one more run appended
at the cap (its transaction, retention included).

The 10,000 runs are inserted in one transaction with the store's own insert (appending
each with its own synced transaction takes minutes and builds the same rows).
Run: python tests/perf/bench_history.py [RUNS]
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from preflight.outputs.record import history
from preflight.pipeline.report import Report

REPORTS = Path(__file__).parents[1] / "fixtures" / "reports"


def at(report: Report, finished: datetime) -> Report:
    return report.model_copy(update={"started_at": finished - timedelta(seconds=report.duration_seconds), "finished_at": finished})


def build(db: Path, report: Report, runs: int) -> datetime:
    """``runs`` runs an hour apart, the last an hour ago. Returns when the last finished."""
    last = datetime.now(timezone.utc) - timedelta(hours=1)
    history.append(db, at(report, last - timedelta(hours=runs - 1)), 36500, runs)  # the schema, as a run makes it
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN")
    for i in range(1, runs):
        history._insert(con, at(report, last - timedelta(hours=runs - 1 - i)))
    con.execute("COMMIT")
    con.close()
    return last


def timed(cmd: list[str], rounds: int = 3) -> tuple[float, int]:
    best, size = float("inf"), 0
    for _ in range(rounds):
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        best, size = min(best, time.perf_counter() - t), len(done.stdout)
    return best, size


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    for name in ("h100-8x-built", "cpu-pass"):
        report = Report.model_validate_json((REPORTS / f"{name}.json").read_text())
        figures = len(history.figures_of(report))
        with tempfile.TemporaryDirectory(prefix="preflight-history-") as d:
            db = Path(d) / "history.db"
            t = time.perf_counter()
            last = build(db, report, runs)
            built = time.perf_counter() - t
            size = db.stat().st_size
            print(f"{name}: {runs} runs x {figures} figures: {size / 2**20:.1f} MiB ({size / runs / 1024:.1f} KiB a run), built in {built:.1f} s")
            base = [sys.executable, "-m", "preflight", "history", "--report", str(Path(d) / "report.json")]
            for label, extra in (("history", []), ("history --json", ["--json"]), ("history --figure memcpy_bandwidth --json", ["--figure", "memcpy_bandwidth", "--json"]),
                                 ("history --since 7d --json", ["--since", "7d", "--json"])):
                took, out = timed(base + extra)
                print(f"  `preflight {label}`: {took:.3f} s (best of 3, a whole process), {out / 1024:.0f} KiB out")
            t = time.perf_counter()
            h = history.read(db, since=last - timedelta(days=7), per_figure=34)
            print(f"  a run's read before its verdict (34 readings a figure, 7 days of runs): {time.perf_counter() - t:.3f} s, "
                  f"{len(h.series)} figures, {len(h.runs)} runs")
            nxt = at(report, last + timedelta(minutes=30))
            t = time.perf_counter()
            history.append(db, nxt, 36500, runs)
            print(f"  one run appended at the cap (synced, one run dropped): {time.perf_counter() - t:.3f} s; "
                  f"size now {db.stat().st_size / 2**20:.1f} MiB, {os.path.getsize(str(db) + '-wal') / 2**20 if os.path.exists(str(db) + '-wal') else 0:.1f} MiB WAL left")


if __name__ == "__main__":
    main()
