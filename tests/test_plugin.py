"""A check from another distribution, installed by pip, runs through the real CLI.

The package is the documentation's own example (docs/writing-a-check.md): its
pyproject.toml and module are taken from that page's code blocks, so the example cannot drift from
what works. It is built and installed with pip into a directory of its own
(no network: --no-index, --no-build-isolation), beside a second package whose
check fails to import, and `preflight` sees both through PYTHONPATH, as any
installed distribution's entry points. The in-process side of a broken or
misnamed plugin, and an --only naming no installed check, are tested in
tests/pipeline/test_registry.py and tests/cli/test_cli.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CPU_TOML, clean_env, run_preflight

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BROKEN = "brokensite"  # the check whose module cannot import


def page_example() -> tuple[str, str, str]:
    """docs/writing-a-check.md, up to its next section: the package's pyproject.toml, its module,
    the profile's lines."""
    section = (ROOT / "docs" / "writing-a-check.md").read_text().split("# Writing a check\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["toml", "python", "toml"], "docs/writing-a-check.md changed its blocks"
    return blocks[0][1], blocks[1][1], blocks[2][1]


BROKEN_PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "broken-checks"
version = "1.0"

[tool.setuptools]
py-modules = ["broken_checks"]

[project.entry-points."preflight.checks"]
{BROKEN} = "broken_checks:Broken"
"""


@dataclass
class Site:
    name: str  # the check's name, from the example's entry point
    description: str
    env: dict[str, str]
    scratch: Path


def _package(where: Path, pyproject: str, module: str, text: str) -> Path:
    where.mkdir(parents=True)
    (where / "pyproject.toml").write_text(pyproject)
    (where / f"{module}.py").write_text(text)
    return where


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    pytest.importorskip("setuptools", reason="pip builds the plugin with this environment's setuptools (--no-build-isolation)")
    pyproject, code, profile_lines = page_example()
    (name, target), = tomllib.loads(pyproject)["project"]["entry-points"]["preflight.checks"].items()
    top = tmp_path_factory.mktemp("plugin")
    good = _package(top / "site-checks", pyproject, target.split(":")[0], code)
    broken = _package(top / "broken-checks", BROKEN_PYPROJECT, "broken_checks", "import site_dependency_not_installed  # noqa: F401\n")
    installed = top / "site-packages"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(installed), str(good), str(broken)],
        capture_output=True, text=True, timeout=120, cwd=top,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # The page's way: a site profile of the built-in's name, with the check in its
    # `checks` and its standard and full levels, and the page's floor table (the
    # check that cannot import listed too).
    floor = re.search(r"^\[floors\.\w+\]\n(?:\w+ = .*\n)+", profile_lines, re.M)
    assert floor, "docs/writing-a-check.md's profile lines hold no [floors.NAME] table"
    assert "[levels.standard] and [levels.full]" in profile_lines, "docs/writing-a-check.md no longer says which levels to add the check to"
    text, n = re.subn(r'^checks = \[(.*"train".*)\]$', rf'checks = [\1, "{name}", "{BROKEN}"]', CPU_TOML.read_text(), flags=re.M)
    assert n == 3, "cpu.toml's checks lines changed (checks, [levels.standard], [levels.full]): the site profile was not written"
    profiles = top / "profiles"
    profiles.mkdir()
    (profiles / "cpu.toml").write_text(text + "\n" + floor.group(0))
    scratch = top / "scratch"
    scratch.mkdir()
    env = {**clean_env(), "PYTHONPATH": str(installed), "PREFLIGHT_PROFILES_DIR": str(profiles),
           "PREFLIGHT_LOCK_FILE": str(top / "preflight.lock"), "SCRATCH": str(scratch)}
    description = re.search(r'^    description = "(.*)"$', code, re.M)
    assert description, "docs/writing-a-check.md's check has no description line"
    return Site(name, description.group(1), env, scratch)


def _run(site: Site, tmp_path: Path, floor: float, *args: str) -> subprocess.CompletedProcess:
    """`preflight run --profile cpu ARGS`, the site's floor set to ``floor`` by a config file."""
    config = tmp_path / "config.toml"
    config.write_text(f"[floors]\nscratch_free_bytes = {floor:.0f}\n")
    return run_preflight(["run", "--profile", "cpu", "--config", str(config), *args], env=site.env, timeout=60)


def test_list_shows_the_installed_check_and_the_one_that_does_not_import(site):
    r = run_preflight(["list", "--json"], env=site.env, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row["description"] for row in json.loads(r.stdout)}
    assert rows[site.name] == site.description
    assert rows[BROKEN] == "(could not be loaded)" and {"shm", "nccl"} <= set(rows)


@pytest.mark.parametrize("floor, verdict, code", [(1, "PASS", 0), (1e18, "FAIL", 1)])
def test_the_plugin_runs_alone_and_its_verdict_and_metrics_are_the_runs(site, tmp_path, floor, verdict, code):
    report, textfile = tmp_path / "report.json", tmp_path / "metrics"
    textfile.mkdir()
    r = _run(site, tmp_path, floor, "--only", site.name, "--report", str(report), "--textfile-dir", str(textfile))
    assert r.returncode == code, r.stderr
    assert f"[{verdict}] {site.name}" in r.stderr
    (result,) = json.loads(report.read_text())["checks"]
    assert (result["check"], result["status"]) == (site.name, verdict)
    assert result["summary"].startswith(f"{site.scratch}: ")
    if verdict == "FAIL":
        assert "under the floor" in result["summary"] and "mount a larger volume" in result["remedy"]
    (figure,) = result["measurements"]
    assert (figure["name"], figure["unit"], figure["floor"]) == ("scratch_free", "bytes", floor)
    metrics = (textfile / "preflight.prom").read_text()
    assert f'preflight_check_status{{check="{site.name}",status="{verdict.lower()}"}} 1.0' in metrics
    assert re.search("^" + re.escape(f'preflight_scratch_free_bytes{{path="{site.scratch}"}} '), metrics, re.M)
    assert re.search(r"^preflight_scratch_free_floor_bytes\{", metrics, re.M)


def test_a_plugin_that_does_not_import_is_an_error_naming_it_not_a_crash(site, tmp_path):
    report = tmp_path / "report.json"
    r = _run(site, tmp_path, 1, "--only", f"{site.name},{BROKEN}", "--report", str(report))
    assert r.returncode == 3 and f"[ERROR] {BROKEN}" in r.stderr, r.stderr
    by_name = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    assert by_name[site.name]["status"] == "PASS"
    assert by_name[BROKEN]["status"] == "ERROR" and "site_dependency_not_installed" in by_name[BROKEN]["summary"]
