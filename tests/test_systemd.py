"""The shipped units pass `systemd-analyze verify`, with ExecStart pointing at
this installation's `preflight` so the path resolves."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).parent.parent / "systemd"
PREFLIGHT = Path(sys.executable).parent / "preflight"

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed (Debian package systemd)")


def verify(unit: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    local = tmp_path / unit.name
    local.write_text(unit.read_text().replace("/usr/local/bin/preflight", str(PREFLIGHT)))
    return subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("unit", sorted(UNITS.glob("*.service")), ids=lambda p: p.name)
def test_unit_verifies(unit, tmp_path):
    assert PREFLIGHT.exists()
    p = verify(unit, tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_verify_would_catch_a_broken_exec_start(tmp_path):
    broken = tmp_path / "src" / "preflight.service"
    broken.parent.mkdir()
    broken.write_text((UNITS / "preflight.service").read_text().replace("/usr/local/bin/preflight", "/nonexistent/preflight"))
    assert verify(broken, tmp_path).returncode != 0


def test_the_gate_writes_the_report_where_the_tool_expects_it():
    from preflight.report import DEFAULT_REPORT_PATH

    exec_start = next(line for line in (UNITS / "preflight.service").read_text().splitlines() if line.startswith("ExecStart="))
    assert f"--report {DEFAULT_REPORT_PATH}" in exec_start
