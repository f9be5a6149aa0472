"""The history through the CLI: real `preflight run`s on the cpu profile add to history.db beside
their report and are judged against it (drift, lemons), and `preflight history` reads it back.

Earlier runs are recorded ones (a real cpu report's, at the times and values a test needs)
inserted into the database: ten real bandwidth runs would take minutes on a loaded 2-core
machine. The run judged is always a real one."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from conftest import as_user, clean_env, fast_profile, recorded_run, run_preflight, shared  # noqa: F401 (shared: a fixture)

from preflight.outputs.record import history
from preflight.pipeline.report import Report

GB = 1e9


def run(tmp_path: Path, env: dict[str, str], *args: str, profile: str = "cpu"):
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return run_preflight(["run", "--profile", profile, "--report", str(tmp_path / "report.json"), *args],
                         env={"TMPDIR": str(tmp_path / "tmp"), **env}, timeout=200)


def test_ten_runs_with_memcpy_slowed_step_by_step_end_in_a_drift_warn_naming_the_figure_and_its_first_run(tmp_path):
    """Nine recorded runs (five at 9 GB/s, then 8, 7, 6, 5) and a tenth real one whose every memcpy
    repeat both ranks sleep 0.5 s into (PREFLIGHT_WORKER_FAULT): about 0.26 GB/s, above the site's
    10 MB/s floor. The last five runs' median (6 GB/s) is a third under the first five's: past the
    cpu profile's 30%."""
    env = fast_profile(tmp_path, "bandwidth", 120.0, edits={"value = 2e9\n": "value = 1e7\n"})  # [floors.memcpy_bandwidth]
    db = tmp_path / "history.db"
    for i, memcpy in enumerate([9, 9, 9, 9, 9, 8, 7, 6, 5]):
        history.append(db, recorded_run(10 - i, memcpy * GB), 90, 10000)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    p = run(tmp_path, {**env, "PREFLIGHT_WORKER_FAULT": "*:slow=0.5s@memcpy"}, "--only", "bandwidth", "--textfile-dir", str(textfile), profile="cpu-fast")
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert p.returncode == 0 and report.verdict == "pass", p.stderr
    h = report.history
    assert h is not None and h.status == "WARN" and report.action == "watch" and report.action_check == "history", h
    drifting = {d["labels"]["rank"]: d for d in h.details["drifting"]}
    assert set(drifting) == {"0", "1"} and all(d["figure"] == "memcpy_bandwidth" and d["since_run"] == 6 for d in drifting.values())
    assert all(d["earlier"] == 9 * GB and d["recent"] == 6 * GB and d["floor"] == 1e7 for d in drifting.values())
    assert "[WARN] history" in p.stderr and "bandwidth memcpy_bandwidth{rank=0} drifting: 6 GB/s over the last 5 runs, 33.3% under its earlier 9 GB/s, since run 6 of " in p.stderr
    assert "profile cpu-fast [drift]: 2-core CI VM run to run" in h.cause
    prom = (textfile / "preflight.prom").read_text()
    assert 'preflight_history_drift_ratio{check="bandwidth",figure="memcpy_bandwidth",rank="0"} 0.666' in prom, prom
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=prom, capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0 and lint.stdout == lint.stderr == "", lint.stderr
    # The run joined the history, and `history` shows the slide.
    shown = run_preflight(["history", "--report", str(tmp_path / "report.json"), "--figure", "memcpy_bandwidth", "--json"], env=env)
    data = json.loads(shown.stdout)
    assert shown.returncode == 0 and len(data["runs"]) == 10 and data["runs"][-1]["checks"] == {"bandwidth": "PASS"}
    rank0 = next(f for f in data["figures"] if f["labels"] == {"rank": "0"})
    assert [v["value"] / GB for v in rank0["values"][:9]] == [9, 9, 9, 9, 9, 8, 7, 6, 5] and rank0["values"][-1]["value"] < 1 * GB
    text = run_preflight(["history", "--report", str(tmp_path / "report.json"), "--check", "bandwidth", "--figure", "memcpy_bandwidth"], env=env).stdout
    # The page gains the trends, and the drift is among its problems.
    html = run_preflight(["report", str(tmp_path / "report.json"), "--html", "-"], env=env).stdout
    assert "<h2>Trends over the last 10 runs</h2>" in html and "<td>memcpy_bandwidth <span class=muted>rank=0</span></td><td style=\"font-family:monospace\">██████▇▆▅▁</td>" in html
    assert '<div class="problem WARN" data-check="history"><b>history WARN</b>: bandwidth memcpy_bandwidth{rank=0} drifting' in html
    assert "10 run(s) in " in text and "  bandwidth memcpy_bandwidth{rank=0}\n    ██████▇▆▅▁  9 GB/s -> " in text, text


def test_three_fails_in_a_week_of_recorded_runs_make_a_passing_node_s_action_service(tmp_path):
    env = clean_env()
    db = tmp_path / "history.db"
    for hours_ago, failed in [(160, []), (140, ["shm"]), (100, []), (80, ["bandwidth"]), (50, []), (20, ["bandwidth"]), (2, [])]:
        history.append(db, recorded_run(hours_ago, failed=failed), 90, 10000)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    p = run(tmp_path, env, "--only", "shm", "--textfile-dir", str(textfile))
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert p.returncode == 0 and report.verdict == "pass" and [c.check for c in report.checks] == ["shm"], p.stderr
    assert report.action == "service" and report.domain == "node" and report.action_check == "history"
    assert report.action_source.startswith("a lemon: failed 3 times in 7 days: shm, bandwidth, bandwidth")
    assert "[WARN] history" in p.stderr and "a lemon: failed 3 times in 7 days: shm, bandwidth, bandwidth" in p.stderr
    prom = (textfile / "preflight.prom").read_text()
    assert 'preflight_history_failed_runs{days="7"} 3.0' in prom, prom
    # K in the config: four fails needed, so the same week is no lemon.
    p = run(tmp_path, {**env, "PREFLIGHT_LEMON_FAILS": "4"}, "--only", "shm")
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert p.returncode == 0 and report.action == "none" and report.history.details["failures"] == 3, p.stderr


def test_a_corrupt_history_is_one_line_and_the_run_passes_with_its_report(tmp_path):
    db = tmp_path / "history.db"
    db.write_bytes(b"garbage " * 1000)
    db.chmod(0o600)
    p = run(tmp_path, clean_env(), "--only", "shm")
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert p.returncode == 0 and report.verdict == "pass", p.stderr
    said = [line for line in p.stderr.splitlines() if "history" in line]
    assert len(said) == 1 and said[0].startswith("preflight: error: history not kept: ") and "not a database" in said[0], p.stderr
    assert report.history.status == "SKIP" and db.read_bytes() == b"garbage " * 1000
    shown = run_preflight(["history", "--report", str(tmp_path / "report.json")], env=clean_env())
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1 and "not a database" in shown.stderr


def test_history_with_no_database_says_so(tmp_path):
    p = run_preflight(["history", "--report", str(tmp_path / "report.json")], env=clean_env())
    assert p.returncode == 0 and p.stdout.startswith(f"no history at {tmp_path / 'history.db'}") and not list(tmp_path.iterdir())


def test_a_user_who_may_not_read_the_nodes_history_is_told_how_to(shared):
    # The node's history.db is root's alone (0600); an admin without sudo is told to run as root or read
    # the trends beside it. Asked from a forked child that gave up root, so this checkout's code answers.
    from typer.testing import CliRunner

    from preflight.cli.app import app

    d = shared  # reachable by nobody, as /var/lib/preflight is
    history.append(d / "history.db", recorded_run(1), 90, 10000)
    # As root first, a read and a refusal (a corrupt file), so whatever either imports is loaded:
    # the child runs as nobody, who may not reach this interpreter's standard library.
    CliRunner().invoke(app, ["history", "--report", str(d / "report.json")])
    (d / "bad").mkdir()
    (d / "bad" / "history.db").write_text("not a database")
    CliRunner().invoke(app, ["history", "--report", str(d / "bad" / "report.json")])

    def asked() -> dict:
        done = CliRunner().invoke(app, ["history", "--report", str(d / "report.json")])
        return {"code": done.exit_code, "said": done.output + (repr(done.exception) if done.exception else "")}

    seen = as_user(65534, asked)
    assert seen.get("code") == 2 and f"the node's history is root's alone: run it as root, or read {d / 'trends.json'}" in seen["said"], seen
