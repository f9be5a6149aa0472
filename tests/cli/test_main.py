"""`status` and `version` start without Typer and pydantic (preflight/cli/main.py, plain.py):
they must answer exactly as the Typer app does, and keep starting light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import report_file
from typer.testing import CliRunner

import fakes
from preflight.cli import main as quick, plain
from preflight.cli.app import app

THROUGH_TYPER = "import sys; sys.argv = ['preflight', *sys.argv[1:]]; from preflight.cli.app import main; main()"


def run(args: list[str], typer_app: bool = False, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    argv = [sys.executable, "-c", THROUGH_TYPER, *args] if typer_app else [*fakes.PREFLIGHT, *args]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    p = subprocess.run(argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def typer_reads(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict | None:
    """The arguments the Typer app calls `status` with, or None where it refuses them."""
    seen = []
    monkeypatch.setattr(plain, "status", lambda *args: seen.append(dict(zip(("report", "npd", "max_age", "config", "json_out"), args))) or 0)
    CliRunner().invoke(app, argv)
    return seen[0] if seen else None


# ---- the same answer as the Typer app ------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--npd"],
        ["status", "--json"],
        ["status", "--report", "/srv/r.json"],
        ["status", "--report=/srv/r.json", "--npd"],
        ["status", "--max-age", "60", "--config", "site.toml"],
        ["status", "--max-age=1.5", "--json", "--report", "r.json"],
        ["status", "--max-age", "0"],
        ["status", "--report", "a=b"],
    ],
)
def test_the_plain_forms_read_as_typer_reads_them(argv, monkeypatch):
    assert quick.parse_status(argv) == typer_reads(argv, monkeypatch) is not None


@pytest.mark.parametrize(
    "argv",
    [
        [], ["--help"], ["version", "--help"], ["status", "-h"], ["status", "--help"], ["status", "extra"], ["status", "--npd", "--npd"],
        ["status", "--report"], ["status", "--report="], ["status", "--report", "--npd"], ["status", "--report", "-"],
        ["status", "--npd=1"], ["status", "--max-age", "1e3"], ["status", "--max-age", "-5"], ["status", "--max-age", "soon"],
        ["status", "--max-age", " 5"], ["status", "--", "--npd"], ["status", "--rep", "x"], ["status", "--report", "a", "--report", "b"],
        ["run"], ["list"], ["statu"],
    ],
)
def test_every_other_form_is_left_to_typer(argv):
    assert quick.parse_status(argv) is None


def test_an_unreadable_report_path_is_left_to_typer(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("{}")
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != path)  # as for a user who may not read it
    assert quick.parse_status(["status", "--report", str(path)]) is None
    assert quick.parse_status(["status", "--report", str(tmp_path / "missing.json")]) is not None


def cases(tmp_path: Path) -> list[tuple[list[str], dict[str, str]]]:
    passed = report_file(tmp_path / "pass.json", "cpu-pass", age=7200)
    failed = report_file(tmp_path / "fail.json", "shm-64m-fail", age=7200)
    stale = report_file(tmp_path / "stale.json", "cpu-pass", boot="an-earlier-boot", age=7200)
    (tmp_path / "bad.json").write_text('{"verdict": "pass"}')
    odd = json.loads(passed.read_text())
    odd["exit_code"] = "0"  # valid, but not as preflight writes it: read by the model
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    (tmp_path / "site.toml").write_text(f'report = "{failed}"\n')
    (tmp_path / "broken.toml").write_text('report = "x"\nkeep_goin = true\n')
    out = []
    for report in (passed, failed, stale, tmp_path / "bad.json", tmp_path / "odd.json", tmp_path / "none.json"):
        for extra in ([], ["--npd"], ["--json"]):
            out.append((["status", "--report", str(report), *extra], {}))
    out += [
        (["status", "--report", str(passed), "--max-age", "3600"], {}),
        (["status", "--report", str(passed), "--max-age", "0"], {}),
        (["status", "--npd", "--config", str(tmp_path / "site.toml")], {}),
        (["status", "--config", str(tmp_path / "broken.toml")], {}),
        (["status"], {"PREFLIGHT_CONFIG": str(tmp_path / "site.toml")}),
        (["status", "--npd"], {"PREFLIGHT_REPORT": str(failed)}),
        (["status", "--npd"], {"PREFLIGHT_REPORT": ""}),
        (["status"], {"PREFLIGHT_LOCK_TIMEOUT": "soon", "PREFLIGHT_REPORT": str(passed)}),
        (["version"], {}),
    ]
    return out


def test_each_answer_is_the_typer_apps(tmp_path):
    for args, env in cases(tmp_path):
        code, out, err = run(args, env=env)
        t_code, t_out, t_err = run(args, typer_app=True, env=env)
        if "--json" in args and out:
            out, t_out = json.loads(out), json.loads(t_out)
            age, t_age = out.pop("age_seconds"), t_out.pop("age_seconds")  # a few ms apart
            assert (age is None) == (t_age is None) and (age is None or abs(age - t_age) < 30)
        assert (code, out, err) == (t_code, t_out, t_err), args
        assert code in (0, 1, 2) and (out or err)


# ---- and it keeps starting light ---------------------------------------------------------

# What `status` and `version` must not load: each alone costs them more than they may take.
HEAVY = ("typer", "pydantic", "pydantic_core", "pydantic_settings", "rich", "torch", "psutil", "importlib.metadata", "email",
         "preflight.cli.app", "preflight.cli.common", "preflight.pipeline.settings", "preflight.pipeline.report", "preflight.pipeline.check", "preflight.outputs.exporters.console")
# --help goes through Typer, in plain text: no Rich, no pydantic.
HEAVY_HELP = ("pydantic", "pydantic_core", "rich", "markdown_it", "pygments", "torch", "psutil", "preflight.pipeline.settings", "preflight.pipeline.report")


def imported(args: list[str], env: dict[str, str] | None = None) -> set[str]:
    argv = [sys.executable, "-X", "importtime", *fakes.PREFLIGHT[1:], *args]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    p = subprocess.run(argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:") and "|" in line}


def test_status_and_version_load_neither_typer_nor_pydantic(tmp_path):
    report = report_file(tmp_path / "r.json", "h100-fake-hw-slowdown")
    config = tmp_path / "config.toml"
    config.write_text((Path(__file__).parents[2] / "examples" / "config.toml").read_text().replace("/var/lib/preflight/report.json", str(report)))
    for args, env in (
        (["status", "--npd", "--report", str(report)], None),
        (["status"], {"PREFLIGHT_CONFIG": str(config)}),
        (["status", "--json", "--npd"], {"PREFLIGHT_CONFIG": str(config)}),
        (["version"], None),
    ):
        modules = imported(args, env)
        assert "preflight.cli.main" in modules
        assert not {m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY}, args


def test_help_loads_no_rich_and_no_pydantic():
    modules = imported(["--help"])
    assert "typer" in modules
    assert not {m for m in modules if m.split(".")[0] in HEAVY_HELP or m in HEAVY_HELP}


# ---- `version` reads installed versions as importlib.metadata does ---------------------------


def test_every_installed_distribution_reads_as_importlib_metadata_reads_it():
    names = {d.metadata["Name"] for d in metadata.distributions()}
    assert {"torch", "pydantic", "typer", "nvidia-ml-py"} <= names
    for name in names | {"no-such-distribution", "Pydantic", "nvidia_ml_py", "nvidia.ml.py"}:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = LookupError
        try:
            got = plain.dist_version(name)
        except LookupError:
            got = LookupError
        assert got == expected, name


def test_odd_metadata_reads_as_importlib_metadata_reads_it(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    dists = {
        "plain-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: plain\nVersion: 1.0\n\nbody Version: 9\n",
        "Upper_Case-2.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: Upper-Case\nVersion: 2.0\n",
        "dotted.name-3.0.dist-info/METADATA": "Name: dotted.name\nVersion:   3.0  \n",
        "folded-1.0.dist-info/METADATA": "Name: folded\nSummary: one\n  two\nVersion: 4.0\n",
        "pkginfo-5.0.egg-info/PKG-INFO": "Metadata-Version: 1.0\nName: pkginfo\nVersion: 5.0\n",
        "later-6.0.dist-info/METADATA": "Name: later\nVersion: 6.0\nVersion: 7.0\n",
        "crlf-8.0.dist-info/METADATA": "Name: crlf\r\nVersion: 8.0\r\n",
        "noversion-1.0.dist-info/METADATA": "Name: noversion\n",
    }
    for rel, text in dists.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(text.encode())
    (site / "eggfile-9.0.egg-info").write_text("Metadata-Version: 1.0\nName: eggfile\nVersion: 9.0\n")
    monkeypatch.syspath_prepend(str(site))
    for name in ("plain", "Upper-Case", "upper_case", "dotted.name", "dotted-name", "folded", "pkginfo", "later", "crlf", "eggfile", "noversion"):
        assert plain.dist_version(name) == metadata.version(name), name
