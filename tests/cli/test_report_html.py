"""`preflight report [REPORT.json] --html OUT.html` as a user runs it: the page
of a recorded report, the last report by default, and bad input refused in
one line, exit 2, with nothing written."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import REPORTS, clean_env, run_preflight


def test_a_report_becomes_one_self_contained_page(tmp_path: Path):
    out = tmp_path / "page.html"
    done = run_preflight(["report", str(REPORTS / "h100-fake-hw-slowdown.json"), "--html", str(out)])
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stderr and done.stdout == ""
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "FAIL: vm" in page
    # What to do, as the JSON's action says it: in the banner and under each problem.
    assert "; action: drain (node, from cuda: a failure with no more specific action" in page
    assert '<span class="muted">action:</span> drain (node)</div>' in page
    # Nothing outside the file: no script, no link, no URL but the page's own text.
    assert "<script" not in page and "<link" not in page and re.search(r"\s(src|href)=", page) is None
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_without_a_path_it_reads_the_last_report_the_config_names(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text(f'report = "{REPORTS / "shm-64m-fail.json"}"\n')
    done = run_preflight(["report", "--config", str(config), "--html", "-"], env=clean_env(report=False))  # the config's, not PREFLIGHT_REPORT
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and "/dev/shm is 64 MiB" in done.stdout


def newer_schema(tmp_path: Path) -> Path:
    data = json.loads((REPORTS / "cpu-pass.json").read_text())
    data["schema_version"] = 2
    p = tmp_path / "newer.json"
    p.write_text(json.dumps(data))
    return p


def truncated(tmp_path: Path) -> Path:
    p = tmp_path / "cut.json"
    p.write_bytes((REPORTS / "cpu-pass.json").read_bytes()[:5000])
    return p


@pytest.mark.parametrize(("make", "words"), [
    (lambda d: d / "absent.json", "no report at"),
    (truncated, "if it was cut short, write it again"),
    (newer_schema, "is a report of schema 2, from a newer preflight"),
    (lambda d: d, "cannot read the report"),
], ids=["missing", "truncated", "newer-schema", "a-directory"])
def test_a_report_it_cannot_read_is_one_line_exit_2_and_no_page(tmp_path: Path, make, words):
    out = tmp_path / "out" / "page.html"
    out.parent.mkdir()
    out.write_text("the page of the run before\n")
    done = run_preflight(["report", str(make(tmp_path)), "--html", str(out)])
    assert done.returncode == 2 and words in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert out.read_text() == "the page of the run before\n" and os.listdir(out.parent) == ["page.html"]


def test_an_html_path_it_cannot_write_is_refused_before_reading(tmp_path: Path):
    done = run_preflight(["report", str(REPORTS / "cpu-pass.json"), "--html", str(tmp_path / "no" / "page.html")])
    assert done.returncode == 2 and "--html" in done.stderr and "does not exist" in done.stderr
    done = run_preflight(["report", str(REPORTS / "cpu-pass.json"), "--html", str(tmp_path)])
    assert done.returncode == 2 and "is a directory" in done.stderr and "report.html" in done.stderr


def test_the_default_report_path_is_said_when_there_is_none(tmp_path: Path):
    env = {**clean_env(), "PREFLIGHT_REPORT": str(tmp_path / "never-written.json")}
    done = run_preflight(["report", "--html", str(tmp_path / "p.html")], env=env)
    assert done.returncode == 2 and "never-written.json" in done.stderr and not (tmp_path / "p.html").exists()
