"""The report page as a person sees it: `preflight report --html` on recorded
reports, opened in headless Chromium. Each page must load nothing from
anywhere, log nothing to the console, and show what it promises: the
verdict's colour, one heatmap cell per ordered GPU pair, a bar per GPU.
Reports: the recorded ones of tests/fixtures/reports, and the 8x H100 one built
there by the checks' own code (no GPU was at hand to record one).
The screenshots are kept under $PAGE_SCREENSHOTS when it is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser import CHROMIUM, look, png_pixel, png_size

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: install Debian's chromium (tests/install-tools.sh does)")
REPORTS = Path(__file__).parent.parent / "fixtures" / "reports"
GREEN, RED = (46, 125, 50), (198, 40, 40)


def page_of(report: Path, tmp_path: Path) -> Path:
    out = tmp_path / f"{report.stem}.html"
    subprocess.run([sys.executable, "-m", "preflight", "report", str(report), "--html", str(out)], check=True, capture_output=True, timeout=60)
    return out


def seen(name: str, tmp_path: Path, height: int = 3000):  # noqa: ANN201
    page = page_of(REPORTS / f"{name}.json", tmp_path)
    got = look(page, tmp_path, height=height)
    keep = os.environ.get("PAGE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"{name}.png").write_bytes(got.png)
        shutil.copy(page, Path(keep) / f"{name}.html")
    assert got.console == [], f"the page logged to the console: {got.console}"
    assert got.requests == [], f"the page reached off the machine: {got.requests}"
    assert png_size(got.png) == (1280, height)
    return got


def count(dom: str, cls: str) -> int:
    return len(re.findall(rf'<g class="{cls}"', dom))


def test_a_cpu_pass_at_the_full_level_is_green_with_bars_and_every_trace(tmp_path: Path):
    got = seen("cpu-full-pass", tmp_path, height=3600)
    assert png_pixel(got.png, 5, 5) == GREEN
    assert 'data-verdict="pass"' in got.dom
    bars = re.findall(r'<g class="bar" data-who="(rank \d)"', got.dom)
    assert bars.count("rank 0") == bars.count("rank 1") == 5  # memcpy, GEMM, compute time, burn-in GEMM and copy
    lines = re.findall(r'<g class="line" data-series="(rank \d)"', got.dom)
    assert len(lines) == 6  # loss, step time and burn-in GEMM rate, for each of the 2 ranks
    assert count(got.dom, "span") == 6  # shm, nccl, bandwidth, train, burnin, memtest on the timeline
    assert "no GPU in this report" in got.dom


def test_a_64m_dev_shm_is_red_and_says_its_cause_and_fix(tmp_path: Path):
    got = seen("shm-64m-fail", tmp_path, height=1200)
    assert png_pixel(got.png, 5, 5) == RED
    problem = re.search(r'<div class="problem FAIL" data-check="shm">(.*?)</div>', got.dom, re.S)
    assert problem and "64 MiB" in problem[1] and "cause:" in problem[1] and "fix:" in problem[1]


def test_the_fake_8x_h100_has_56_pair_cells_and_a_bar_per_gpu(tmp_path: Path):
    got = seen("h100-fake-hw-slowdown", tmp_path, height=3200)
    assert png_pixel(got.png, 5, 5) == RED
    cells = re.findall(r'<g class="cell" data-src="(\d)" data-dst="(\d)"', got.dom)
    assert len(cells) == 56 and len(set(cells)) == 56 and all(a != b for a, b in cells)
    assert "not measured: bandwidth SKIP" in got.dom  # the run never got that far: said, not drawn as zero
    bars = re.findall(r'<g class="bar" data-who="GPU (\d)"', got.dom)
    assert sorted(set(bars)) == [str(i) for i in range(8)]
    assert count(got.dom, "gpu") == 8  # the layout's GPU boxes


def test_the_built_8x_h100_shows_the_slow_pair_and_the_outlier_gpus(tmp_path: Path):
    got = seen("h100-8x-built", tmp_path, height=7000)
    assert png_pixel(got.png, 5, 5) == RED
    cells = re.findall(r'<g class="cell" data-src="(\d)" data-dst="(\d)" data-below-floor="(\w+)"', got.dom)
    assert len(cells) == 56 and [(a, b) for a, b, below in cells if below == "true"] == [("2", "5")]
    ringed = re.findall(r'<g class="bar" data-who="(GPU \d)" data-past-bound="false" data-outlier="WARN"', got.dom)
    assert sorted(set(ringed)) == ["GPU 3", "GPU 6"]  # GPU 6's HBM copy, GPU 3's clock under the burn-in
    assert count(got.dom, "gpu") == 8 and count(got.dom, "nic") == 12 and count(got.dom, "numa") == 2
    assert count(got.dom, "line") == 8 * 6  # loss, step time, burn-in GEMM rate, clock, power, temperature per GPU


def test_a_2_node_group_lists_both_nodes_with_their_figures(tmp_path: Path):
    got = seen("group-pass-node0", tmp_path, height=2400)
    rows = re.findall(r'<tr class="node" data-state="(\w+)">', got.dom)
    assert rows == ["ok", "ok"]
    assert "internode_allreduce_bus_bandwidth" in got.dom


def test_a_node_kept_out_of_its_group_is_shown_failed_with_why(tmp_path: Path):
    got = seen("group-keptout-node0", tmp_path, height=1600)
    rows = re.findall(r'<tr class="node" data-state="(\w+)">.*?</tr>', got.dom, re.S)
    assert rows == ["ok", "failed"]
    assert "64 MiB" in got.dom


# README's picture of a verdict: docs/page.png is this test's screenshot.

DOCS_PNG = Path(__file__).parents[2] / "docs" / "page.png"
DOCS_SIZE = (1280, 720)  # the banner, the problem with its cause and fix, the timeline and the table


def test_readme_s_picture_of_the_page_is_the_page_rendered_now(tmp_path: Path):
    """The page of the recorded tests/fixtures/reports/shm-64m-fail.json, rendered by Chromium with
    --screenshot into tmp_path, is a PNG of the size of the committed docs/page.png (pixels are not
    compared: fonts differ from one machine to the next). The report is named by its path from
    the repository's root, as the banner shows it, so the picture holds no local path.

    To make docs/page.png again, from the repository's root (not a PREFLIGHT_* name: the tests
    clear those):
    DOCS_PAGE_PNG=docs/page.png python -m pytest tests/outputs/test_page_browser.py -k readme
    """
    page = tmp_path / "shm-64m-fail.html"
    root = DOCS_PNG.parents[1]
    subprocess.run([sys.executable, "-m", "preflight", "report", "tests/fixtures/reports/shm-64m-fail.json", "--html", str(page)],
                   check=True, capture_output=True, timeout=60, cwd=root)
    got = look(page, tmp_path, width=DOCS_SIZE[0], height=DOCS_SIZE[1])
    assert got.console == [] and got.requests == [], (got.console, got.requests)
    assert png_size(got.png) == DOCS_SIZE
    assert png_pixel(got.png, 5, 5) == RED
    keep = os.environ.get("DOCS_PAGE_PNG")
    if keep:
        Path(keep).write_bytes(got.png)
    committed = DOCS_PNG.read_bytes()
    assert png_size(committed) == DOCS_SIZE, "docs/page.png is not the size this test renders: make it again (see the docstring)"
    assert len(committed) < 300_000, f"docs/page.png is {len(committed)} bytes: keep README's picture small"


# The harness itself: a page that does reach out is caught, both ways.


def test_an_external_load_is_refused_and_logged(tmp_path: Path):
    page = page_of(REPORTS / "shm-64m-fail.json", tmp_path)
    page.write_text(page.read_text().replace("<main>", '<main><img src="http://198.51.100.7/x.png">'))
    got = look(page, tmp_path, height=400)
    assert any("198.51.100.7" in line for line in got.console)
    assert got.requests == []  # the page's policy stopped it before the network


def test_an_external_load_without_the_policy_reaches_the_proxy(tmp_path: Path):
    page = page_of(REPORTS / "shm-64m-fail.json", tmp_path)
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    page.write_text(text.replace("<main>", '<main><img src="http://198.51.100.7/x.png">'))
    got = look(page, tmp_path, height=400)
    assert any("198.51.100.7" in line for line in got.requests)
