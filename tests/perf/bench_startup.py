"""Start-up cost of the commands run often: `preflight --help`, `version`, and
`status` / `status --npd`, which node-problem-detector and Slurm run every
interval. Each must start in under 150 ms; a bare interpreter is shown beside them.

Runs the installed `preflight` script (as NPD does; `python -m preflight` where
there is none) N times each, round-robin so a burst of load on the machine
falls on every command alike, and prints the median, min and max wall time.
`status` reads a passing report of this boot through a config file, as on a
node (PREFLIGHT_CONFIG; nothing under /etc or /var is touched). Modules run
from their compiled bytecode, as an installed wheel's do: one untimed round
writes it first, even where PYTHONDONTWRITEBYTECODE is set. Exits 1 when a
median misses the target.

Run: python tests/perf/bench_startup.py [N]   (default 10)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10
TARGET_MS = 150
PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "reports" / "cpu-pass.json"


def preflight() -> list[str]:
    script = Path(PY).parent / "preflight"
    return [str(script)] if script.exists() else [PY, "-m", "preflight"]


def node_like(tmp: Path) -> dict[str, str]:
    """A config naming a passing report of this boot, finished a minute ago."""
    report = json.loads(FIXTURE.read_text())
    finished = datetime.now(timezone.utc) - timedelta(seconds=60)
    report["finished_at"] = finished.isoformat()
    report["started_at"] = (finished - timedelta(seconds=report["duration_seconds"])).isoformat()
    report["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (tmp / "report.json").write_text(json.dumps(report, indent=2))
    config = (ROOT / "examples" / "config.toml").read_text().replace("/var/lib/preflight/report.json", str(tmp / "report.json"))
    (tmp / "config.toml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PREFLIGHT_") and k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PREFLIGHT_CONFIG": str(tmp / "config.toml")}


def main() -> int:
    cmd = preflight()
    tmp = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        env = node_like(tmp)
        commands = {
            "python -c pass": ([PY, "-c", "pass"], None, 0),
            "preflight --help": ([*cmd, "--help"], TARGET_MS, 0),
            "preflight version": ([*cmd, "version"], TARGET_MS, 0),
            "preflight status": ([*cmd, "status"], TARGET_MS, 0),
            "preflight status --npd": ([*cmd, "status", "--npd"], TARGET_MS, 0),
        }
        times: dict[str, list[float]] = {label: [] for label in commands}
        for round_ in range(N + 1):  # round 0 writes the bytecode and is not timed
            for label, (argv, _, expected) in commands.items():
                start = time.perf_counter()
                p = subprocess.run(argv, env=env, capture_output=True, timeout=60)
                if round_:
                    times[label].append((time.perf_counter() - start) * 1000)
                if p.returncode != expected:
                    print(f"{label}: exit {p.returncode}, expected {expected}: {p.stdout.decode()[-200:]}{p.stderr.decode()[-200:]}")
                    return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"start-up, wall time over {N} runs each; {' '.join(cmd)}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load:.1f}")
    print(f"{'command':<26} {'median':>8} {'min':>8} {'max':>8}   target")
    missed = False
    for label, (_, target, _) in commands.items():
        t = times[label]
        med = statistics.median(t)
        verdict = "" if target is None else f"< {target} ms  " + ("ok" if med < target else "MISSED")
        missed |= target is not None and med >= target
        print(f"{label:<26} {med:>5.0f} ms {min(t):>5.0f} ms {max(t):>5.0f} ms   {verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
