"""What a scheduler integration held back, written into the report it judged
(preflight/outputs/schedulers/held_back.py), and where readers show it: status, the page, the metrics."""

from __future__ import annotations

import json
import subprocess

import fakes
from conftest import lock_held, report_file
from preflight.outputs.schedulers import held_back
from preflight.outputs.exporters import metrics
from preflight.outputs.html import page
from preflight.pipeline.report import Report

SAID = "would drain: 1 of 4 nodes already drained by preflight, past the cap (10% of partition gpu, at least 1 node; --drain-cap)"


def judged(path) -> Report:
    return Report.model_validate_json(path.read_text())


def test_the_report_judged_says_it_and_a_later_health_check_takes_it_back(tmp_path):
    path = report_file(tmp_path / "report.json", "shm-64m-fail")
    before_it = judged(path)
    started = before_it.started_at
    assert held_back.record(path, started, SAID, "slurm-healthcheck", tmp_path / "lock") is None
    r = judged(path)
    assert (r.held_back.by, r.held_back.said) == ("slurm-healthcheck", SAID)
    assert r.model_copy(update={"held_back": None}) == before_it  # the run's own findings untouched
    before = path.stat().st_mtime_ns
    assert held_back.record(path, started, SAID, "slurm-healthcheck", tmp_path / "lock") is None
    assert path.stat().st_mtime_ns == before  # said already: not rewritten at every health check
    assert held_back.record(path, started, None, "slurm-healthcheck", tmp_path / "lock") is None
    assert judged(path).held_back is None


def test_a_newer_report_or_a_run_under_way_is_left_alone(tmp_path):
    path = report_file(tmp_path / "report.json", "shm-64m-fail")
    why = held_back.record(path, judged(path).started_at.replace(year=2020), SAID, "slurm-healthcheck", tmp_path / "lock")
    assert why is not None and "a newer run's report since" in why and judged(path).held_back is None
    with lock_held(tmp_path / "lock"):
        why = held_back.record(path, judged(path).started_at, SAID, "slurm-healthcheck", tmp_path / "lock")
    assert why is not None and "another preflight holds" in why and judged(path).held_back is None


def test_status_the_page_and_serve_s_metrics_say_it(tmp_path):
    path = report_file(tmp_path / "report.json", "shm-64m-fail")
    held_back.record(path, judged(path).started_at, SAID, "slurm-healthcheck", tmp_path / "lock")
    p = subprocess.run([*fakes.PREFLIGHT, "status", "--report", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout.splitlines()[1].startswith("held back by slurm-healthcheck at ") and p.stdout.rstrip().endswith(SAID), p.stdout
    p = subprocess.run([*fakes.PREFLIGHT, "status", "--report", str(path), "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout)["held_back"]["said"] == SAID
    r = judged(path)
    assert f"held back by slurm-healthcheck at {r.held_back.at.isoformat(timespec='seconds')}: {SAID}" in page.render(r, str(path))
    assert 'preflight_held_back{by="slurm-healthcheck"} 1.0' in metrics.render_report(r).decode()
    assert "preflight_held_back" not in metrics.render_report(r.model_copy(update={"held_back": None})).decode()


def test_a_lock_file_a_run_would_refuse_is_said_and_nothing_is_written(tmp_path):
    path = report_file(tmp_path / "report.json", "shm-64m-fail")
    victim = tmp_path / "victim"
    victim.write_text("")
    victim.chmod(0o600)
    (tmp_path / "lock").hardlink_to(victim)  # two names: refused as `preflight run` refuses it
    why = held_back.record(path, judged(path).started_at, SAID, "slurm-healthcheck", tmp_path / "lock")
    assert why is not None and "has 2 names" in why and judged(path).held_back is None
