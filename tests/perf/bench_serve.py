"""`preflight serve` under load: scrape latency, resident memory and threads.

Serves the built 8x H100 report (an 8-GPU node's every figure), then:
  1. idle: resident memory after start-up and one scrape;
  2. one client: 200 scrapes in a row, latency p50/p99 (what Prometheus sees;
     target p99 within 10 ms on a 2-core machine);
  3. twenty clients: 20 concurrent clients, 1000 scrapes in all (target p99
     within 100 ms on a 2-core machine);
  4. burst: CLIENTS concurrent clients scraping /metrics back to back, TOTAL
     scrapes in all; latency p50/p99/max, scrapes per second, peak RSS
     (VmHWM) and the most threads seen;
  5. stalled clients: SLOW connections that send nothing, then one scrape:
     how long it waits and the threads meanwhile;
  6. trickling clients: SLOW connections sending a byte at a time while scrapes run.
Run: python tests/perf/bench_serve.py [TOTAL] [CLIENTS] [SLOW]
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]
TOTAL = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
CLIENTS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
SLOW = int(sys.argv[3]) if len(sys.argv) > 3 else 200


def big_report(path: Path) -> int:
    """The built 8x H100 report (tests/fixtures/reports/h100-8x-built.json: every check's
    figures of an 8-GPU node, pairs and all), made this boot's so it vouches."""
    data = json.loads((ROOT / "tests/fixtures/reports/h100-8x-built.json").read_text())
    data["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    path.write_text(json.dumps(data, indent=2))
    return sum(len(c["measurements"]) for c in data["checks"])


def status_field(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def scrape(port: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert r.status == 200 and b"preflight_run_passed" in body
    return time.perf_counter() - t0, len(body)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def burst(port: int, total: int, clients: int) -> tuple[list[float], float]:
    """``total`` scrapes by ``clients`` concurrent clients: each scrape's latency, and the wall time."""
    latencies: list[float] = []
    lock = threading.Lock()
    left = [total]

    def client() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            t, _ = scrape(port)
            with lock:
                latencies.append(t)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for c in threads:
        c.start()
    for c in threads:
        c.join()
    return latencies, time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        n = big_report(report)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        proc = subprocess.Popen([sys.executable, "-m", "preflight", "serve", "--listen", f"127.0.0.1:{port}", "--report", str(report)],
                                env=env, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            for _ in range(300):
                try:
                    _, size = scrape(port)
                    break
                except OSError:
                    time.sleep(0.1)
            print(f"report: {report.stat().st_size / 1024:.0f} KiB, {n} measurements; /metrics body {size / 1024:.0f} KiB")
            print(f"idle after one scrape: RSS {status_field(proc.pid, 'VmRSS') / 1024:.1f} MiB, threads {status_field(proc.pid, 'Threads')}")

            alone = [scrape(port)[0] for _ in range(200)]
            print(f"one client, 200 scrapes in a row: latency p50 {pct(alone, 0.5) * 1e3:.1f} ms, p99 {pct(alone, 0.99) * 1e3:.1f} ms "
                  "(target: p99 within 10 ms on 2 cores)")

            twenty = burst(port, 1000, 20)[0]
            print(f"twenty clients, 1000 scrapes: latency p50 {pct(twenty, 0.5) * 1e3:.1f} ms, p99 {pct(twenty, 0.99) * 1e3:.1f} ms "
                  "(target: p99 within 100 ms on 2 cores)")

            threads_seen = [0]
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    threads_seen[0] = max(threads_seen[0], status_field(proc.pid, "Threads"))
                    time.sleep(0.01)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            latencies, wall = burst(port, TOTAL, CLIENTS)
            print(f"burst: {TOTAL} scrapes by {CLIENTS} concurrent clients in {wall:.1f} s ({TOTAL / wall:.0f}/s); "
                  f"latency p50 {pct(latencies, 0.5) * 1e3:.1f} ms, p99 {pct(latencies, 0.99) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms")
            print(f"  serve: peak RSS (VmHWM) {status_field(proc.pid, 'VmHWM') / 1024:.1f} MiB, RSS now {status_field(proc.pid, 'VmRSS') / 1024:.1f} MiB, "
                  f"most threads seen {threads_seen[0]}")

            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW)]
            time.sleep(0.5)
            t, _ = scrape(port)
            print(f"stalled: {SLOW} silent connections open; one scrape then took {t:.1f} s; threads {status_field(proc.pid, 'Threads')}, "
                  f"RSS {status_field(proc.pid, 'VmRSS') / 1024:.1f} MiB")
            for s in idle:
                s.close()

            trickle = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOW)]
            t0 = time.perf_counter()
            waits = []
            while time.perf_counter() - t0 < 3:
                for s in trickle:
                    try:
                        s.send(b"G")  # a byte at a time, never a whole request
                    except OSError:
                        pass  # cut off at CLIENT_TIMEOUT, as it should be
                waits.append(scrape(port)[0])
                time.sleep(0.2)
            print(f"trickling: {SLOW} connections sending a byte every 0.2 s; scrapes meanwhile took max {max(waits) * 1e3:.1f} ms; "
                  f"threads {status_field(proc.pid, 'Threads')}, most seen {threads_seen[0]}")
            for s in trickle:
                s.close()
            stop.set()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
