"""The cpu dry run on a loaded machine: does it ever fail a healthy box?

Starts CPU hogs (by default one per CPU this process may use: every core
busy), runs `preflight run --profile cpu --json` several times while they
spin, and prints each run's verdict and the figures nearest their floor or
ceiling (headroom = value / floor, or ceiling / value: under 1 fails, under
1 + the profile's margin warns). The hogs end with the script, always: they
are killed in a `finally`, and each also stops by itself after the script's
whole deadline, so even a SIGKILLed script leaves nothing spinning.

Run: python tests/perf/bench_cpu_under_load.py [--runs 5] [--hogs N] [-- extra `preflight run` args]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN_TIMEOUT = 300.0  # one `preflight run --profile cpu`: the checks' own deadlines sum to under this
HOG = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def start_hogs(n: int, limit: float) -> list[subprocess.Popen]:
    code = HOG.format(limit=limit)
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for h in hogs:
        if h.poll() is None:
            os.killpg(h.pid, signal.SIGKILL)
    for h in hogs:
        h.wait(timeout=10)


def closest(report: dict, top: int) -> list[tuple[float, str, str]]:
    """(headroom, check, text) of the judged figures nearest their bound, nearest first."""
    out = []
    for check in report["checks"]:
        for m in check.get("measurements", []):
            labels = ",".join(f"{k}={v}" for k, v in sorted(m.get("labels", {}).items()))
            name = f"{m['name']}{{{labels}}}" if labels else m["name"]
            if m.get("floor"):
                head = m["value"] / m["floor"]
                out.append((head, check["check"], f"{name} = {m['value']:.4g} {m['unit']}, floor {m['floor']:.4g}, value/floor {head:.2f}"))
            elif m.get("ceiling"):
                head = m["ceiling"] / m["value"] if m["value"] > 0 else float("inf")
                out.append((head, check["check"], f"{name} = {m['value']:.4g} {m['unit']}, ceiling {m['ceiling']:.4g}, value/ceiling {m['value'] / m['ceiling']:.2f}"))
    return sorted(out)[:top]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)), help="CPU hogs to run (default: one per usable CPU)")
    p.add_argument("--top", type=int, default=4, help="figures to show per run, nearest their bound first")
    p.add_argument("extra", nargs="*", help="more `preflight run` arguments, after --")
    a = p.parse_args()
    deadline = a.runs * RUN_TIMEOUT + 60
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        env["PREFLIGHT_LOCK_FILE"] = str(Path(tmp) / "preflight.lock")  # never wait on another run's lock
        hogs = start_hogs(a.hogs, deadline)
        try:
            time.sleep(1)  # the hogs at full spin before the first run
            print(f"{a.hogs} CPU hogs on {len(os.sched_getaffinity(0))} usable CPUs; {a.runs} runs of `preflight run --profile cpu {' '.join(a.extra)}`", flush=True)
            for i in range(1, a.runs + 1):
                report = Path(tmp) / f"r{i}.json"
                cmd = [sys.executable, "-m", "preflight", "run", "--profile", "cpu", "--json", "--report", str(report), *a.extra]
                t = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
                except subprocess.TimeoutExpired:
                    print(f"run {i}: no answer in {RUN_TIMEOUT:g} s", flush=True)
                    verdicts.append("timeout")
                    continue
                took = time.perf_counter() - t
                try:
                    data = json.loads(proc.stdout)
                except json.JSONDecodeError:
                    print(f"run {i}: exit {proc.returncode}, no JSON; stderr: {proc.stderr.strip()[-400:]}", flush=True)
                    verdicts.append(f"exit {proc.returncode}")
                    continue
                verdicts.append(data["verdict"])
                statuses = " ".join(f"{c['check']}={c['status']}" for c in data["checks"])
                print(f"run {i}: {data['verdict'].upper()} (exit {proc.returncode}, {took:.0f} s) {statuses}", flush=True)
                for c in data["checks"]:
                    if c["status"] not in ("PASS", "SKIP"):
                        print(f"    {c['check']} {c['status']}: {c['summary']} | {c.get('cause') or ''}", flush=True)
                for _, check, text in closest(data, a.top):
                    print(f"    {check:<10} {text}", flush=True)
        finally:
            stop_hogs(hogs)
    print(f"verdicts: {', '.join(verdicts)}  ({verdicts.count('pass')} of {len(verdicts)} pass)", flush=True)
    return 0 if verdicts.count("pass") == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
