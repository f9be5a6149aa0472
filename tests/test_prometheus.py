"""A real Prometheus (Debian package `prometheus`) scrapes a real `preflight serve`,
evaluates the shipped alert rules, and answers through its HTTP API; promtool
checks and unit-tests the shipped rules and scrape config."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import report_file
from preflight.launch import free_port
from test_serve import serving

EXAMPLES = Path(__file__).parents[1] / "examples" / "prometheus"
RULES = EXAMPLES / "preflight-rules.yml"

promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus)")
prometheus = pytest.mark.skipif(not shutil.which("prometheus"), reason="prometheus is not installed (Debian package prometheus)")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=EXAMPLES)


@promtool
def test_the_alert_rules_are_valid():
    p = run("promtool", "check", "rules", str(RULES))
    assert p.returncode == 0 and "SUCCESS: 6 rules found" in p.stdout, p.stdout + p.stderr


@promtool
def test_the_alert_rules_fire_on_what_they_should_and_nothing_else():
    p = run("promtool", "test", "rules", "preflight-rules.test.yml")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_the_below_floor_alert_compares_every_figure_the_bandwidth_check_has_a_floor_for():
    # A figure family added to the check without its term here would never page.
    from checks.bandwidth import FLOORS

    expr = RULES.read_text()
    for name, (unit, bound) in FLOORS.items():
        if name.endswith("_p99"):
            continue  # the same family as its p50, told apart by the stat label
        op, limit = ("<", "floor") if bound == "min" else (">", "ceiling")
        assert f"preflight_{name}_{unit} {op} preflight_{name}_{limit}_{unit}" in expr, name


@promtool
def test_the_example_scrape_config_is_valid():
    p = run("promtool", "check", "config", "prometheus.yml")
    assert p.returncode == 0, p.stdout + p.stderr


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(what, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = what()
            if got:
                return got
        except OSError:
            pass  # Prometheus still starting
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing after {timeout:g} s")
        time.sleep(0.5)


@prometheus
def test_a_real_prometheus_scrapes_serve_and_raises_the_alert(tmp_path):
    report = report_file(tmp_path / "report.json", "shm-64m-fail")
    with serving(report) as (target, _):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(RULES))}]\n"
            "scrape_configs:\n"
            "  - job_name: preflight\n"
            f"    static_configs: [{{targets: ['{target.removeprefix('http://')}']}}]\n"
        )
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"), start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            passed = wait_for(lambda: query(base, "preflight_check_passed"))
            by_check = {r["metric"]["check"]: float(r["value"][1]) for r in passed}
            assert by_check == {"shm": 0.0, "nccl": 0.0, "bandwidth": 0.0, "train": 0.0}
            assert all(r["metric"]["job"] == "preflight" and "hostname" not in r["metric"] for r in passed)
            assert float(query(base, "preflight_run_passed")[0]["value"][1]) == 0.0
            assert float(query(base, "preflight_report_current_boot")[0]["value"][1]) == 1.0
            shm = query(base, "preflight_shm_size_bytes")[0]
            assert float(shm["value"][1]) == 64 * 2**20
            # The shipped rules, evaluated by Prometheus itself on what it scraped.
            want = {("PreflightNodeFailed", None), ("PreflightCheckFailed", "shm")}

            def firing() -> set:
                names = {(a["metric"]["alertname"], a["metric"].get("check")) for a in query(base, 'ALERTS{alertstate="firing"}')}
                return names if want <= names else set()

            assert wait_for(firing) == want
            # Nothing else, not even pending (the stale-boot alert waits 20 minutes before firing).
            assert {a["metric"]["alertname"] for a in query(base, "ALERTS")} == {"PreflightNodeFailed", "PreflightCheckFailed"}
            assert float(query(base, "preflight_vouched")[0]["value"][1]) == 0.0
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
