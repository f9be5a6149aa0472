"""The shipped Grafana dashboard (examples/grafana/preflight-fleet.json): its
structure is one Grafana imports, and every PromQL expression in it, with the
template variables substituted as Grafana does, returns series from a real
Prometheus scraping the textfiles preflight's own metrics code renders from
recorded reports of several nodes."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import report_file
from preflight.gpuwork.launch import free_port
from preflight.outputs.exporters import metrics
from preflight.outputs.record.last_report import load
from test_prometheus import prometheus, prometheus_scraping, query, wait_for

DASHBOARD = Path(__file__).parents[2] / "examples" / "grafana" / "preflight-fleet.json"
STALE = 3 * 86400  # seconds: the one node whose verdict is older than the dashboard's default stale_after (a day)
# The fleet: a node per recorded report, each scraped as its own instance. Every figure the
# dashboard plots is in one of them (the group's internode figures, the cpu profile's collectives).
NODES = {"cpu-pass": 0, "shm-64m-fail": 0, "h100-fake-hw-slowdown": STALE, "group-pass-node0": 0, "group-pass-node1": 0}
# What Grafana's $__interval and friends come to on a 1-hour range at a 1200-pixel-wide panel.
BUILTINS = {"__interval": "15s", "__interval_ms": "15000", "__rate_interval": "1m", "__range": "3600s", "__range_s": "3600", "__range_ms": "3600000"}
# ${1}, ${2}: label_replace's capture groups, which Grafana leaves alone (no variable has a digit for a
# name). Braced, because Go reads "$1_" as a group named "1_".
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict) -> list[dict]:
    """Every panel that queries, rows' collapsed panels included."""
    found = []
    for p in dash["panels"]:
        found.extend(p.get("panels", []) if p["type"] == "row" else [p])
    return found


def variables(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def regex_escape(value: str) -> str:
    """Grafana's Prometheus data source escapes each value of a multi-value variable so it matches literally in =~."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def interpolate(expr: str, values: dict[str, str | list[str]], dash: dict) -> str:
    """``expr`` as Grafana sends it: each variable by its value; "All" of a multi-value variable
    by its allValue, several values by (a|b); the built-ins by what they are on a 1-hour range."""
    defs = variables(dash)

    def one(m: re.Match) -> str:
        name = next(g for g in m.groups() if g)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in defs or name not in values:
            return m.group(0)  # not a variable: Grafana leaves it, and the caller refuses it
        value = values[name]
        if isinstance(value, list):
            if value == ["$__all"]:
                return defs[name]["allValue"]
            escaped = [regex_escape(v) for v in value]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        return value

    out = VARIABLE.sub(one, expr)
    left = [m.group(0) for m in VARIABLE.finditer(out) if not next(g for g in m.groups() if g).isdigit()]
    assert not left, f"variables Grafana would not substitute: {left} in {expr}"
    return out


def defaults(dash: dict) -> dict[str, str | list[str]]:
    """The values a freshly imported dashboard starts with."""
    return {name: v["current"]["value"] for name, v in variables(dash).items() if name != "datasource"}


def targets(dash: dict) -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in panels(dash) for t in p["targets"]]


# ---- structure -----------------------------------------------------------------


def test_the_dashboard_is_one_grafana_imports_with_a_prometheus_data_source_picker():
    dash = dashboard()
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    (ds,) = dash["__inputs"]
    assert ds["type"] == "datasource" and ds["pluginId"] == "prometheus"
    var = variables(dash)
    assert var["datasource"]["type"] == "datasource" and var["datasource"]["query"] == "prometheus"
    # Import replaces ${DS_PROMETHEUS} with the data source picked on the import page.
    assert var["datasource"]["current"]["value"] == "${" + ds["name"] + "}"
    profile = var["profile"]
    assert profile["type"] == "query" and profile["definition"] == "label_values(preflight_info, profile)"
    assert profile["datasource"]["uid"] == "${datasource}" and profile["includeAll"] and profile["multi"]


def test_every_panel_queries_the_chosen_data_source():
    dash = dashboard()
    ids = [p["id"] for p in dash["panels"]]
    titles = [p["title"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(titles) == len(set(titles))
    for p in panels(dash):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]
            assert t["instant"] != t["range"], p["title"]


def test_the_panels_fit_the_grid_without_overlapping():
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_the_fleet_table_shows_node_verdict_age_and_failing_check():
    (fleet,) = [p for p in panels(dashboard()) if p["title"] == "Fleet"]
    exprs = " ".join(t["expr"] for t in fleet["targets"])
    for metric in ("preflight_run_exit_code", "preflight_run_timestamp_seconds", "preflight_check_status"):
        assert metric in exprs
    renamed = next(t["options"]["renameByName"] for t in fleet["transformations"] if t["id"] == "organize")
    assert {"Node", "Verdict", "Age of the verdict", "Failing check"} <= set(renamed.values())


def test_interpolate_is_grafanas_substitution():
    dash = dashboard()
    values = {"profile": ["$__all"], "stale_after": "86400", "weakest": "20"}
    assert interpolate('x{profile=~"$profile"} > $stale_after', values, dash) == 'x{profile=~".*"} > 86400'
    assert interpolate('x{profile=~"${profile}"}', {**values, "profile": ["cpu", "h100.sxm"]}, dash) == 'x{profile=~"(cpu|h100\\\\.sxm)"}'
    groups = 'label_replace(y, "f", "${1}_${2}", "__name__", "(.+)_floor_(.+)")'
    assert interpolate(groups, values, dash) == groups
    assert interpolate("max_over_time(y[$__interval])", values, dash) == "max_over_time(y[15s])"
    with pytest.raises(AssertionError, match="would not substitute"):
        interpolate("y > $nosuch", values, dash)


# ---- evaluated by a real Prometheus ------------------------------------------------


class Textfile(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass  # quiet: Prometheus scrapes every second


@contextlib.contextmanager
def textfile_server(body: bytes) -> Iterator[str]:
    """One node's textfile at host:port/metrics, as node_exporter's textfile collector would serve it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), type("Node", (Textfile,), {"body": body}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A real Prometheus scraping a textfile per recorded report, each written by preflight's
    write_textfile as `run --textfile-dir` writes it. Yields its API base and each node's instance."""
    d = tmp_path_factory.mktemp("grafana")
    with contextlib.ExitStack() as stack:
        instance = {}
        for name, age in NODES.items():
            (d / name).mkdir()
            report = load(report_file(d / f"{name}.json", name, age=age)).report
            body = metrics.write_textfile(d / name, report).read_bytes()
            instance[name] = stack.enter_context(textfile_server(body))
        base = stack.enter_context(prometheus_scraping(d, {"node": list(instance.values())}))
        wait_for(lambda: len(query(base, "preflight_run_passed")) == len(NODES), timeout=60)
        yield base, instance


def query_range(base: str, expr: str, seconds: int = 60) -> list[dict]:
    """``expr`` over the last ``seconds`` by Prometheus's clock, as a time series panel asks for it."""
    end = float(query(base, "time()")[1])
    url = f"{base}/api/v1/query_range?" + urllib.parse.urlencode({"query": expr, "start": end - seconds, "end": end, "step": 1})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def label_values(base: str, definition: str) -> list[str]:
    """A label_values(metric, label) variable, by the API call Grafana makes for it."""
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", definition).groups()
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def evaluate(base: str, target: dict, values: dict[str, str | list[str]], dash: dict) -> list[dict]:
    expr = interpolate(target["expr"], values, dash)
    return query(base, expr) if target["instant"] else query_range(base, expr)


@prometheus
def test_the_profile_variable_lists_the_fleets_profiles(fleet):
    base, _ = fleet
    assert sorted(label_values(base, variables(dashboard())["profile"]["definition"])) == ["cpu", "h100-sxm"]


@prometheus
@pytest.mark.parametrize("title, target", targets(dashboard()), ids=lambda x: x if isinstance(x, str) else x["refId"])
def test_every_expression_returns_series_from_a_real_prometheus(fleet, title, target):
    base, _ = fleet
    dash = dashboard()
    got = evaluate(base, target, defaults(dash), dash)
    assert got and all(s.get("value") or s.get("values") for s in got), f"{title} {target['refId']}: no series for {target['expr']}"


def expr_of(title: str, ref: str = "A") -> tuple[dict, dict]:
    dash = dashboard()
    (target,) = [t for p in panels(dash) if p["title"] == title for t in p["targets"] if t["refId"] == ref]
    return target, dash


@prometheus
def test_the_fleet_table_names_each_node_its_verdict_and_failing_check(fleet):
    base, instance = fleet
    target, dash = expr_of("Fleet", "A")
    verdicts = {s["metric"]["instance"]: float(s["value"][1]) for s in evaluate(base, target, defaults(dash), dash)}
    assert verdicts == {instance[n]: code for n, code in
                        {"cpu-pass": 0, "shm-64m-fail": 1, "h100-fake-hw-slowdown": 1, "group-pass-node0": 0, "group-pass-node1": 0}.items()}
    target, _ = expr_of("Fleet", "C")
    failing = {(s["metric"]["instance"], s["metric"]["check"]) for s in evaluate(base, target, defaults(dash), dash)}
    assert failing == {(instance["shm-64m-fail"], "shm"), (instance["h100-fake-hw-slowdown"], "cuda"), (instance["h100-fake-hw-slowdown"], "topology")}
    # Picking one profile at the top leaves only its nodes.
    one = evaluate(base, expr_of("Fleet", "A")[0], {**defaults(dash), "profile": ["h100-sxm"]}, dash)
    assert [s["metric"]["instance"] for s in one] == [instance["h100-fake-hw-slowdown"]] and one[0]["metric"]["profile"] == "h100-sxm"


@prometheus
def test_only_the_old_verdict_is_stale(fleet):
    base, instance = fleet
    target, dash = expr_of("Stale verdicts")
    (stale,) = evaluate(base, target, defaults(dash), dash)
    assert stale["metric"]["instance"] == instance["h100-fake-hw-slowdown"] and STALE <= float(stale["value"][1]) < STALE + 600


@prometheus
def test_the_headroom_panel_puts_the_weakest_figure_first_and_covers_floors_and_ceilings(fleet):
    base, instance = fleet
    target, dash = expr_of("Headroom over the floor, weakest first")
    got = evaluate(base, target, {**defaults(dash), "weakest": "200"}, dash)
    figures = {s["metric"]["figure"] for s in got}
    # A floor (bandwidth, shm, PCIe width) and a ceiling (latency, nccl init) alike, of GPU and cpu nodes.
    assert {"allreduce_bus_bandwidth_bytes_per_second", "shm_size_bytes", "gpu_pcie_link_width_lanes",
            "allreduce_latency_seconds", "internode_allreduce_bus_bandwidth_bytes_per_second", "nccl_init_duration_seconds"} <= figures
    headroom = [float(s["value"][1]) for s in got]
    assert headroom == sorted(headroom), "weakest first"
    # The figures the failing checks failed on, and nothing else: the 64 MiB /dev/shm against its
    # 1 GiB floor, and the fake H100 node's 2 vCPUs for 8 GPUs against 12 a GPU.
    under = {(s["metric"]["instance"], s["metric"]["figure"]): float(s["value"][1]) for s in got if float(s["value"][1]) < 1}
    shm, h100 = instance["shm-64m-fail"], instance["h100-fake-hw-slowdown"]
    assert under == {(shm, "shm_size_bytes"): pytest.approx(64 / 1024), (shm, "shm_free_bytes"): pytest.approx(64 / 1024, rel=0.05),
                     (h100, "vcpus_per_gpu_ratio"): pytest.approx(0.25 / 12)}
