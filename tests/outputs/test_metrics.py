"""Prometheus metrics of a report: names, labels and values from recorded
reports, `promtool check metrics` on them, and the textfile `run` writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPORTS, needs_root, report_file, run_preflight
from preflight.outputs.exporters import metrics
from preflight.outputs.record.last_report import Loaded, State, load

promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus)")
FIXTURES = ["cpu-pass", "shm-64m-fail", "h100-fake-hw-slowdown", "group-pass-node0", "group-pass-node1", "group-keptout-node0"]


def text_of(fixture: str) -> str:
    loaded = load(REPORTS / f"{fixture}.json")
    return metrics.render(metrics.ReportCollector(lambda: loaded)).decode()


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def lint(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)


@promtool
@pytest.mark.parametrize("fixture", FIXTURES)
def test_promtool_finds_nothing_to_lint(fixture):
    p = lint(text_of(fixture))
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_family_is_prefixed_and_no_label_names_the_host(fixture):
    for name, samples in families(text_of(fixture)).items():
        assert name.startswith("preflight_")
        for s in samples:
            assert not {"host", "hostname", "node", "instance"} & set(s.labels), (name, s.labels)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_no_family_says_its_unit_twice(fixture):
    for name in families(text_of(fixture)):
        words = name.split("_")
        assert not any(words[i:i + 1] == words[i + 1:i + 2] for i in range(len(words) - 1)), name
        assert not name.endswith(("_ratio_ratio", "_generation_generation", "_seconds_seconds", "_bytes_bytes")), name


def test_the_run_families_a_dashboard_reads():
    fam = families(text_of("cpu-pass"))
    (info,) = fam["preflight_info"]
    assert info.value == 1 and info.labels == {"version": "0.1.0", "profile": "cpu", "driver_version": "", "cuda_version": "", "torch_version": "2.13.0+cpu", "gpu_model": ""}
    assert fam["preflight_run_passed"][0].value == 1
    assert fam["preflight_run_exit_code"][0].value == 0
    assert fam["preflight_run_timestamp_seconds"][0].value > 1.7e9
    assert fam["preflight_last_success_timestamp_seconds"][0].value == fam["preflight_run_timestamp_seconds"][0].value
    assert 10 < fam["preflight_run_duration_seconds"][0].value < 120
    assert {s.labels["check"]: s.value for s in fam["preflight_check_passed"]} == {"shm": 1, "nccl": 1, "bandwidth": 1, "train": 1}
    assert {s.labels["check"] for s in fam["preflight_check_duration_seconds"]} == {"shm", "nccl", "bandwidth", "train"}


def test_check_status_is_one_hot_over_all_five_states():
    fam = families(text_of("shm-64m-fail"))
    by_check: dict[str, dict[str, float]] = {}
    for s in fam["preflight_check_status"]:
        by_check.setdefault(s.labels["check"], {})[s.labels["status"]] = s.value
    assert set(by_check) == {"shm", "nccl", "bandwidth", "train"}
    for states in by_check.values():
        assert set(states) == {"pass", "warn", "fail", "skip", "error"} and sorted(states.values()) == [0, 0, 0, 0, 1]
    assert by_check["shm"]["fail"] == 1 and by_check["nccl"]["skip"] == 1
    assert {s.labels["check"]: s.value for s in fam["preflight_check_passed"]} == {"shm": 0, "nccl": 0, "bandwidth": 0, "train": 0}


def test_the_action_and_its_domain_are_one_hot_over_the_ladder():
    # shm-64m-fail predates actions: its FAIL asks for its status's, a drain for a person.
    fam = families(text_of("shm-64m-fail"))
    action = {s.labels["action"]: s.value for s in fam["preflight_action"]}
    assert list(action) == ["none", "watch", "fix-job", "drain", "reset-gpu", "reboot", "service"]
    assert [a for a, v in action.items() if v == 1] == ["drain"]
    assert {s.labels["domain"]: s.value for s in fam["preflight_action_domain"]} == {"node": 1, "software": 0, "job": 0}
    fam = families(text_of("cpu-pass"))
    assert [s.labels["action"] for s in fam["preflight_action"] if s.value == 1] == ["none"]


def test_a_failed_run_has_passed_0_and_no_success_time():
    fam = families(text_of("shm-64m-fail"))
    assert fam["preflight_run_passed"][0].value == 0 and fam["preflight_run_exit_code"][0].value == 1
    assert "preflight_last_success_timestamp_seconds" not in fam


def test_measurements_become_families_in_base_units_with_their_floors():
    fam = families(text_of("cpu-pass"))
    shm = fam["preflight_shm_size_bytes"][0]
    assert shm.value > 2**30 and fam["preflight_shm_size_floor_bytes"][0].value == 2**30
    busbw = fam["preflight_allreduce_bus_bandwidth_bytes_per_second"]
    floor = fam["preflight_allreduce_bus_bandwidth_floor_bytes_per_second"]
    assert [s.labels for s in busbw] == [s.labels for s in floor] == [{"collective": "all_reduce"}]  # figure < floor matches in PromQL
    assert {s.labels["stat"] for s in fam["preflight_allreduce_latency_seconds"]} == {"p50", "p99"}
    assert fam["preflight_allreduce_latency_ceiling_seconds"][0].labels == {"stat": "p50"}
    assert {s.labels["rank"] for s in fam["preflight_memcpy_bandwidth_bytes_per_second"]} == {"0", "1"}
    assert fam["preflight_train_straggler_ratio"][0].value >= 1  # the unit once, not "_ratio_ratio"
    for name in fam:
        assert "_floor_" not in name or name.replace("_floor_", "_", 1) in fam


def test_gpu_figures_carry_dcgm_exporters_labels():
    fam = families(text_of("h100-fake-hw-slowdown"))
    temps = fam["preflight_gpu_temperature_celsius"]
    assert len(temps) == 8 and temps[0].labels == {"gpu": "0", "UUID": "GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000000"}
    (info,) = fam["preflight_info"]
    assert (info.labels["driver_version"], info.labels["cuda_version"], info.labels["profile"]) == ("550.54.15", "12.4", "h100-sxm")
    # The model the fleet rules compare a node with: profile generic judges many under one name.
    assert info.labels["gpu_model"] == "NVIDIA H100 80GB HBM3"


def test_a_repeated_label_set_is_exported_once():
    loaded = load(REPORTS / "cpu-pass.json")
    shm = loaded.report.checks[0]
    shm.measurements.append(shm.measurements[0].model_copy(update={"value": 1.0}))
    text = metrics.render(metrics.ReportCollector(lambda: loaded)).decode()
    assert len(families(text)["preflight_shm_size_bytes"]) == 1


def test_without_a_report_there_is_no_run_passed_at_all():
    gone = Loaded(State.MISSING, error="no report at /x")
    text = metrics.render(metrics.ReportCollector(lambda: gone, live=lambda: ("b", None, None))).decode()
    fam = families(text)
    assert {s.labels["state"]: s.value for s in fam["preflight_report_state"]} == {"ok": 0, "missing": 1, "unreadable": 0, "invalid": 0}
    assert set(fam) == {"preflight_report_state", "preflight_vouched"} and fam["preflight_vouched"][0].value == 0


def test_a_group_run_says_its_size_and_outcome_and_rank_0_each_nodes():
    zero, one, out = (families(text_of(f)) for f in ("group-pass-node0", "group-pass-node1", "group-keptout-node0"))
    assert [zero[n][0].value for n in ("preflight_group_nodes", "preflight_group_node_rank", "preflight_group_passed")] == [2, 0, 1]
    assert [one[n][0].value for n in ("preflight_group_nodes", "preflight_group_node_rank", "preflight_group_passed")] == [2, 1, 1]
    assert {s.labels["node_rank"]: s.value for s in zero["preflight_group_node_passed"]} == {"0": 1, "1": 1}
    assert "preflight_group_node_passed" not in one  # only node rank 0 heard from every node
    assert {s.labels["node_rank"]: s.value for s in out["preflight_group_node_passed"]} == {"0": 1, "1": 0}
    assert out["preflight_group_passed"][0].value == 0 and out["preflight_run_passed"][0].value == 0
    busbw = one["preflight_internode_allreduce_bus_bandwidth_bytes_per_second"][0].value
    assert busbw > one["preflight_internode_allreduce_bus_bandwidth_floor_bytes_per_second"][0].value > 0


def test_a_label_name_prometheus_would_refuse_never_gets_into_a_report():
    from pydantic import ValidationError

    from preflight.base.findings import Measurement

    with pytest.raises(ValidationError, match="not a Prometheus label name"):
        Measurement(name="h2d_bandwidth", unit="bytes_per_second", value=1.0, labels={"1gpu": "0"})
    with pytest.raises(ValidationError, match="not a Prometheus label name"):
        Measurement(name="h2d_bandwidth", unit="bytes_per_second", value=1.0, labels={"__name__": "x"})


# The textfile `preflight run --textfile-dir` writes, for node_exporter.


def prom(directory: Path) -> dict[str, list]:
    return families((directory / "preflight.prom").read_text())


@promtool
def test_a_cpu_run_leaves_a_lint_clean_textfile_beside_its_report(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir()
    p = run_preflight(["run", "--profile", "cpu", "--textfile-dir", str(d), "--report", str(tmp_path / "report.json"), "-q"], timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in d.iterdir()) == ["preflight.prom"]  # no temp file left behind
    assert (d / "preflight.prom").stat().st_mode & 0o777 == 0o644  # node_exporter often runs as its own user
    text = (d / "preflight.prom").read_text()
    assert lint(text).returncode == 0 and lint(text).stdout == ""
    fam = families(text)
    assert fam["preflight_run_passed"][0].value == 1
    assert {s.labels["check"] for s in fam["preflight_check_passed"]} == {"shm", "nccl", "bandwidth", "train"}
    assert "preflight_allreduce_bus_bandwidth_bytes_per_second" in fam and "preflight_gemm_throughput_flops_per_second" in fam
    # The same names as the report serve would render: one Collector.
    report = load(tmp_path / "report.json")
    assert text == metrics.render(metrics.ReportCollector(lambda: report)).decode()

    # The hourly recheck's lighter run keeps the gate's bandwidth and train results, figures and all.
    p = run_preflight(["run", "--profile", "cpu", "--skip", "bandwidth,train", "--textfile-dir", str(d), "--report", str(tmp_path / "report.json")], timeout=300)
    # PASS, or on this loaded 2-core machine a WARN (a figure that did not converge): kept either way.
    assert p.returncode == 0 and "kept from the run of" in p.stderr and re.search(r"bandwidth (PASS|WARN), train (PASS|WARN)", p.stderr), p.stderr
    tally = re.search(r"\(profile cpu; ([^;]*); 2 kept from an earlier run\)", p.stderr)
    assert tally and sum(int(n) for n, status in re.findall(r"(\d+) (\w+)", tally.group(1)) if status in ("pass", "warn")) == 4, p.stderr
    after = load(tmp_path / "report.json").report
    assert [c.check for c in after.checks] == ["shm", "nccl", "bandwidth", "train"]
    assert after.checks[2].details["carried_from"] == report.report.finished_at.isoformat() and "carried_from" not in after.checks[0].details
    fam = prom(d)
    assert fam["preflight_allreduce_bus_bandwidth_bytes_per_second"] and fam["preflight_run_timestamp_seconds"][0].value > report.report.finished_at.timestamp()


@needs_root
def test_a_failure_keeps_the_last_success_time_in_the_textfile_and_the_report(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir()
    report = tmp_path / "report.json"
    assert run_preflight(["run", "--profile", "cpu", "--only", "shm", "--textfile-dir", str(d), "-q"]).returncode == 0
    passed_at = prom(d)["preflight_last_success_timestamp_seconds"][0].value
    shm_64m = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh"]
    p = subprocess.run([*shm_64m, *_cli(), "run", "--profile", "cpu", "--only", "shm", "--textfile-dir", str(d), "--report", str(report), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    fam = prom(d)
    assert fam["preflight_run_passed"][0].value == 0
    assert fam["preflight_last_success_timestamp_seconds"][0].value == passed_at  # carried from the textfile it replaced
    assert load(report).report.last_success_at.timestamp() == pytest.approx(passed_at)
    # The next failure carries it from the report.
    p = subprocess.run([*shm_64m, *_cli(), "run", "--profile", "cpu", "--only", "shm", "--report", str(report), "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and load(report).report.last_success_at.timestamp() == pytest.approx(passed_at)


def _cli() -> list[str]:
    import fakes

    return list(fakes.PREFLIGHT)


@pytest.mark.parametrize("case", ["missing", "a-file", "read-only"])
def test_a_bad_textfile_dir_is_refused_before_any_check_runs(tmp_path, case):
    d = tmp_path / "textfile"
    report = tmp_path / "report.json"
    args = ["run", "--profile", "cpu", "--textfile-dir", str(d), "--report", str(report)]
    if case == "a-file":
        d.write_text("")
    if case == "read-only":
        if os.geteuid() != 0 or not shutil.which("unshare"):
            pytest.skip("needs root for a read-only bind mount")
        d.mkdir()
        cmd = ["unshare", "-m", "sh", "-c", f'mount --bind {d} {d} && mount -o remount,bind,ro {d} && exec "$@"', "sh", *_cli(), *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    else:
        p = run_preflight(args)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"preflight: error: textfile dir {d}") and p.stdout == ""
    assert not report.exists() and "[PASS]" not in p.stderr  # nothing ran, nothing written
    expected = {"missing": "does not exist", "a-file": "is not a directory", "read-only": f"cannot write in {d} (Read-only file system)"}[case]
    assert expected in line


def test_the_textfile_dir_can_come_from_the_config_file(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'textfile_dir = "{d}"\n')
    assert run_preflight(["run", "--profile", "cpu", "--only", "shm", "--config", str(config), "-q"]).returncode == 0
    assert prom(d)["preflight_check_passed"][0].labels == {"check": "shm"}


def test_previous_success_ignores_a_textfile_that_is_not_ours(tmp_path):
    (tmp_path / "preflight.prom").write_text("this is { not prometheus\n")
    assert metrics.previous_success(tmp_path) is None
    assert metrics.previous_success(tmp_path / "none") is None


def test_report_file_helper_keeps_the_recorded_facts(tmp_path):
    # The tests above rewrite boot and time only.
    path = report_file(tmp_path / "r.json", "cpu-pass", boot="x")
    assert load(path).report.checks == load(REPORTS / "cpu-pass.json").report.checks


@needs_root
def test_a_textfile_that_cannot_be_written_makes_the_report_say_error_too(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir()
    report = tmp_path / "report.json"
    # A full 4 KiB tmpfs: the writability probe (an empty file) passes, the write itself fails.
    setup = f"mount -t tmpfs -o size=4k tmpfs {d} && head -c 4096 /dev/zero > {d}/filler"
    cmd = f"{setup}; {' '.join(_cli())} run --profile cpu --only shm --textfile-dir {d} --report {report}; echo rc=$?; ls -A {d}"
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "could not write the metrics to" in p.stderr and "No space left on device" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout.splitlines() == ["rc=3", "filler"]  # exit 3, and no half-written file or temp file left
    written = load(report).report
    # The gate fails (exit 3): the report must not vouch for the node either.
    assert (written.verdict, written.exit_code) == ("error", 3) and written.checks[0].status == "PASS"


def test_the_level_is_one_hot_and_a_report_before_levels_ran_standard(tmp_path):
    fam = families(text_of("cpu-pass"))  # written before levels existed
    assert {s.labels["level"]: s.value for s in fam["preflight_run_level"]} == {"quick": 0, "standard": 1, "full": 0}
    quick = report_file(tmp_path / "r.json", "cpu-pass", level="quick")
    text = metrics.render(metrics.ReportCollector(lambda: load(quick))).decode()
    assert {s.labels["level"]: s.value for s in families(text)["preflight_run_level"]} == {"quick": 1, "standard": 0, "full": 0}


def test_a_kept_result_says_when_it_was_measured_and_an_odd_time_says_nothing(tmp_path):
    import json

    path = report_file(tmp_path / "r.json", "cpu-pass", level="quick")
    data = json.loads(path.read_text())
    data["checks"][1]["details"]["carried_from"] = "2026-11-22T05:00:00+00:00"
    data["checks"][2]["details"]["carried_from"] = "yesterday"
    path.write_text(json.dumps(data))
    fam = families(metrics.render(metrics.ReportCollector(lambda: load(path))).decode())
    when = {s.labels["check"]: s.value for s in fam["preflight_check_timestamp_seconds"]}
    assert when["shm"] == when["train"] == fam["preflight_run_timestamp_seconds"][0].value  # measured in this run
    assert when["nccl"] == 1795323600.0  # 2026-11-22T05:00:00Z: the run it was kept from
    assert "bandwidth" not in when  # no sample rather than a wrong one


def sure_text() -> str:
    """cpu-pass with its memcpy figures saying how sure they are, as a run now writes them."""
    loaded = load(REPORTS / "cpu-pass.json")
    bw = next(c for c in loaded.report.checks if c.check == "bandwidth")
    memcpy = [m for m in bw.measurements if m.name == "memcpy_bandwidth"]
    memcpy[0].repeats, memcpy[0].ci, memcpy[0].converged = 7, 0.012, True
    memcpy[1].repeats, memcpy[1].ci, memcpy[1].converged = 14, 0.21, False
    return metrics.render(metrics.ReportCollector(lambda: loaded)).decode()


def test_a_timed_figure_says_how_sure_it_is_with_the_figure_s_labels():
    fam = families(sure_text())
    assert {s.labels["rank"]: s.value for s in fam["preflight_memcpy_bandwidth_repeats"]} == {"0": 7, "1": 14}
    assert {s.labels["rank"]: s.value for s in fam["preflight_memcpy_bandwidth_ci_ratio"]} == {"0": 0.012, "1": 0.21}
    assert {s.labels["rank"]: s.value for s in fam["preflight_memcpy_bandwidth_converged"]} == {"0": 1, "1": 0}
    # A report written before figures said how sure they were has none of these.
    assert "preflight_allreduce_bus_bandwidth_repeats" not in fam and "preflight_allreduce_bus_bandwidth_converged" not in fam


@promtool
def test_promtool_finds_nothing_to_lint_in_how_sure_figures_are():
    p = lint(sure_text())
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr
