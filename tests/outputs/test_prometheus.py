"""A real Prometheus (Debian package `prometheus`) scrapes a real `preflight serve`,
and a real node_exporter (Debian package `prometheus-node-exporter`) reading the
textfile real `preflight run`s wrote, evaluates the shipped alert rules, and
answers through its HTTP API; promtool checks and unit-tests the shipped rules
and scrape config."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from conftest import report_file, run_preflight
from preflight.gpuwork.launch import free_port
from test_serve import serving

EXAMPLES = Path(__file__).parents[2] / "examples" / "prometheus"
RULES = EXAMPLES / "preflight-rules.yml"
FLEET_RULES = EXAMPLES / "preflight-fleet-rules.yml"

promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus)")
prometheus = pytest.mark.skipif(not shutil.which("prometheus"), reason="prometheus is not installed (Debian package prometheus)")
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
node_exporter = pytest.mark.skipif(not shutil.which(NODE_EXPORTER), reason=f"{NODE_EXPORTER} is not installed (Debian package {NODE_EXPORTER})")
DAEMON_DEADLINE = 180  # seconds: a daemon outlives its test by at most this, even if pytest itself is killed


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

    from preflight.checkkit.nvls import RING_FLOOR

    expr = RULES.read_text()
    for name, (unit, bound) in FLOORS.items():
        if name.endswith("_p99") or name == RING_FLOOR:
            continue  # the same family as its p50, told apart by the stat label; the rings' floor is the all_reduce's where NVLS did not run
        op, limit = ("<", "floor") if bound == "min" else (">", "ceiling")
        assert f"preflight_{name}_{unit} {op} preflight_{name}_{limit}_{unit}" in expr, name


@promtool
def test_the_fleet_rules_are_valid():
    p = run("promtool", "check", "rules", str(FLEET_RULES))
    assert p.returncode == 0 and "SUCCESS: 4 rules found" in p.stdout, p.stdout + p.stderr


@promtool
def test_the_fleet_rules_flag_the_node_behind_its_profiles_median_and_no_other():
    # A recorded fleet: 5 h100-sxm nodes (one 15% slower in HBM copy, one 20% longer
    # train step) and 2 h100-pcie nodes; the test file holds the recorded values too.
    p = run("promtool", "test", "rules", "preflight-fleet-rules.test.yml")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_the_fleet_rules_compare_every_figure_a_node_measures_of_its_own():
    # A per-node figure family added to the bandwidth check without its name here
    # would never be compared across the fleet. The internode_ figures are the
    # network's, the same on every node of a group; a p99 shares its p50's family.
    from checks.bandwidth import FLOORS
    from preflight.checkkit.nvls import RING_FLOOR

    text = FLEET_RULES.read_text()
    for name in FLOORS:
        if name.startswith("internode_") or name.endswith("_p99") or name == RING_FLOOR:
            continue  # RING_FLOOR is no family of its own: the all_reduce family's floor where NVLS did not run
        assert re.search(rf"[(|]{re.escape(name)}[|)]", text), name


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


@contextlib.contextmanager
def daemon(argv: list[str], log: Path, ready_url: str) -> Iterator[subprocess.Popen]:
    """A daemon in a session of its own under `timeout`, yielded once ready_url answers, then stopped
    with its whole process group. `timeout` is the deadline that holds even if the test never ends."""
    proc = subprocess.Popen(["timeout", "-s", "KILL", str(DAEMON_DEADLINE), *argv],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    # Only Debian's daemons start here, never preflight: one that cannot
                    # start (a port taken, a broken package) is this machine's, so say why and skip.
                    pytest.skip(f"{argv[0]} did not come up at {ready_url}: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        yield proc
    finally:
        # SIGTERM first: `timeout` passes it on and reaps the daemon, which a SIGKILL would leave to init.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def prometheus_scraping(tmp_path: Path, jobs: dict[str, list[str]]) -> Iterator[str]:
    """A real Prometheus with the shipped rules, scraping each job's targets (host:port) every second
    and evaluating every second, so an alert without `for:` fires within seconds. Yields its API base."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(RULES))}]\n"
        "scrape_configs:\n"
        + "".join(f"  - job_name: {job}\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n" for job, targets in jobs.items())
    )
    base = f"http://127.0.0.1:{port}"
    with daemon(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                tmp_path / "prometheus.log", f"{base}/-/ready"):
        yield base


def evaluated_after(base: str, when: float) -> bool:
    """Whether every rule group of this Prometheus has been evaluated since ``when`` (Unix seconds)."""
    with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    # RFC 3339 with nanoseconds, e.g. 2026-11-24T05:00:01.123456789Z: Python reads microseconds.
    stamps = [datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", g["lastEvaluation"]).replace("Z", "+00:00")).timestamp() for g in groups]
    return bool(stamps) and min(stamps) > when


def run_passed(base: str) -> dict[str, float]:
    """preflight_run_passed of each node_exporter target, by instance."""
    return {r["metric"]["instance"]: float(r["value"][1]) for r in query(base, 'preflight_run_passed{job="node"}')}


def firing(base: str, want: set) -> set:
    """The (alertname, instance, check) of every firing alert, once all of ``want`` are among them."""
    names = {(a["metric"]["alertname"], a["metric"]["instance"], a["metric"].get("check")) for a in query(base, 'ALERTS{alertstate="firing"}')}
    return names if want <= names else set()


@prometheus
def test_a_real_prometheus_scrapes_serve_and_raises_the_alert(tmp_path):
    report = report_file(tmp_path / "report.json", "shm-64m-fail")
    with serving(report) as (target, _), prometheus_scraping(tmp_path, {"preflight": [target.removeprefix("http://")]}) as base:
        passed = wait_for(lambda: query(base, "preflight_check_passed"))
        by_check = {r["metric"]["check"]: float(r["value"][1]) for r in passed}
        assert by_check == {"shm": 0.0, "nccl": 0.0, "bandwidth": 0.0, "train": 0.0}
        assert all(r["metric"]["job"] == "preflight" and "hostname" not in r["metric"] for r in passed)
        assert float(query(base, "preflight_run_passed")[0]["value"][1]) == 0.0
        assert float(query(base, "preflight_report_current_boot")[0]["value"][1]) == 1.0
        shm = query(base, "preflight_shm_size_bytes")[0]
        assert float(shm["value"][1]) == 64 * 2**20
        # The shipped rules, evaluated by Prometheus itself on what it scraped.
        instance = target.removeprefix("http://")
        want = {("PreflightNodeFailed", instance, None), ("PreflightCheckFailed", instance, "shm")}
        assert wait_for(lambda: firing(base, want)) == want
        # Nothing else, not even pending (the stale-boot alert waits 20 minutes before firing).
        assert {a["metric"]["alertname"] for a in query(base, "ALERTS")} == {"PreflightNodeFailed", "PreflightCheckFailed"}
        assert float(query(base, "preflight_vouched")[0]["value"][1]) == 0.0


@pytest.fixture(scope="module")
def textfiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Textfile directories as two real `preflight run --textfile-dir` left them: one passed shm, one
    failed it against a site floor no machine meets (the run measures /dev/shm for real either way)."""
    d = tmp_path_factory.mktemp("textfiles")
    site = d / "config.toml"
    site.write_text("[floors]\nshm_min_bytes = 1125899906842624   # 1 PiB\n")
    dirs = {}
    for verdict, extra, code in (("pass", [], 0), ("fail", ["--config", str(site)], 1)):
        dirs[verdict] = d / verdict
        dirs[verdict].mkdir()
        # A report of each run's own, named: this module-wide fixture runs before the autouse
        # _isolated gives a test its own PREFLIGHT_REPORT, and the real default is not the test's.
        done = run_preflight(["run", "--profile", "cpu", "--only", "shm", "-q", "--textfile-dir", str(dirs[verdict]),
                              "--report", str(d / f"{verdict}.json"), *extra], timeout=120)
        assert done.returncode == code, done.stderr
    return dirs


@prometheus
@node_exporter
def test_a_failing_run_fires_the_alert_through_node_exporter_and_a_passing_one_does_not(tmp_path, textfiles):
    # One node_exporter per node, as on the fleet: only the textfile collector, and stat for
    # node_boot_time_seconds, which the stale-boot alert compares the textfile's last pass with.
    nodes = {}
    with contextlib.ExitStack() as stack:
        for verdict, textfile_dir in textfiles.items():
            nodes[verdict] = f"127.0.0.1:{free_port()}"
            stack.enter_context(daemon(
                [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile", f"--collector.textfile.directory={textfile_dir}",
                 "--collector.stat", f"--web.listen-address={nodes[verdict]}"],
                tmp_path / f"node_exporter-{verdict}.log", f"http://{nodes[verdict]}/metrics"))
        base = stack.enter_context(prometheus_scraping(tmp_path, {"node": list(nodes.values())}))

        want = {("PreflightNodeFailed", nodes["fail"], None), ("PreflightCheckFailed", nodes["fail"], "shm")}
        assert wait_for(lambda: firing(base, want)) == want
        # Prometheus spreads its targets' scrapes over the interval, so the failing node can fire
        # before the passing one was first scraped: wait for both, then for a rule evaluation after
        # the passing node's scrape, so that "no alert for it" is a verdict and not a race.
        passed = wait_for(lambda: run_passed(base) if len(run_passed(base)) == 2 else {})
        assert passed == {nodes["fail"]: 0.0, nodes["pass"]: 1.0}
        scraped = float(query(base, f'timestamp(preflight_run_passed{{instance="{nodes["pass"]}"}})')[0]["value"][1])
        assert wait_for(lambda: evaluated_after(base, scraped))
        assert len(query(base, f'node_boot_time_seconds{{instance="{nodes["pass"]}"}}')) == 1
        # Not pending either: the pass is later than this boot by node_exporter's own clock.
        assert query(base, f'ALERTS{{instance="{nodes["pass"]}"}}') == []
        assert {a["metric"]["alertname"] for a in query(base, "ALERTS")} == {"PreflightNodeFailed", "PreflightCheckFailed"}


@promtool
def test_the_drain_cap_alert_fires_on_a_held_drain_and_on_nothing_else():
    p = run("promtool", "check", "rules", "preflight-slurm-rules.yml")
    assert p.returncode == 0 and "SUCCESS: 1 rules found" in p.stdout, p.stdout + p.stderr
    p = run("promtool", "test", "rules", "preflight-slurm-rules.test.yml")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def test_the_drain_cap_alert_reads_the_series_slurm_healthcheck_writes():
    from prometheus_client.parser import text_string_to_metric_families

    from preflight.outputs.schedulers import slurm_cap

    held = slurm_cap.Count("gpu", 1, 4, 1)
    written = {s.name: s for f in text_string_to_metric_families(slurm_cap.textfile("gpu-b", held, [held])) for s in f.samples}
    assert written["preflight_slurm_drain_held"].labels == {"node": "gpu-b"} and written["preflight_slurm_drain_held"].value == 1
    assert written["preflight_slurm_drained_by_preflight"].labels == {"node": "gpu-b", "partition": "gpu"}
    assert "preflight_slurm_drain_held" in (EXAMPLES / "preflight-slurm-rules.yml").read_text()


@promtool
def test_the_taint_cap_alert_fires_on_a_held_taint_and_on_nothing_else():
    p = run("promtool", "check", "rules", "preflight-kube-rules.yml")
    assert p.returncode == 0 and "SUCCESS: 1 rules found" in p.stdout, p.stdout + p.stderr
    p = run("promtool", "test", "rules", "preflight-kube-rules.test.yml")
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


@promtool
def test_the_taint_cap_alert_reads_the_series_kube_label_writes():
    from prometheus_client.parser import text_string_to_metric_families

    from preflight.outputs.schedulers import kube_cap

    text = kube_cap.textfile("gpu-b", True, kube_cap.count(1, 4, 0.1))
    assert subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60).returncode == 0
    written = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert written["preflight_kube_taint_held"].labels == {"node": "gpu-b"} and written["preflight_kube_taint_held"].value == 1
    assert (written["preflight_kube_tainted_by_preflight"].value, written["preflight_kube_cluster_nodes"].value, written["preflight_kube_taint_allowed"].value) == (1, 4, 1)
    assert "preflight_kube_taint_held" in (EXAMPLES / "preflight-kube-rules.yml").read_text()
