"""`preflight slurm-healthcheck`: the decision with recorded node states, and the
command end to end against recorded reports with a fake `scontrol` on PATH
that records what it was asked to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fakes
from conftest import FIXTURES, clean_env, report_file, run_preflight
from preflight import slurm
from preflight.last_report import Standing

NODES = FIXTURES / "slurm"
PASS = Standing(True, "passed 40 s ago, profile h100-sxm", True, 40.0)
FAIL = Standing(False, "shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor (12 s ago)", True, 12.0)
GPU_FAIL = Standing(False, "cuda FAIL: GPU 3 (0000:3b:00.0): fell off the bus (3 s ago)", True, 3.0)
NONE = Standing(None, "no report at /var/lib/preflight/report.json: preflight has not run here")


def node(name: str) -> slurm.Node:
    return slurm.parse_node((NODES / f"{name}.txt").read_text(), "gpu-01")


def test_parse_reads_state_and_reason_without_slurms_stamp():
    assert (node("idle").state, node("idle").reason, node("idle").drained) == ("IDLE", None, False)
    n = node("drained-by-preflight")
    assert n.state == "IDLE+DRAIN" and n.drained and n.ours
    assert n.reason == "preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
    admin = node("drained-by-admin")
    assert admin.drained and not admin.ours and admin.reason == "replace PSU 2, ticket 4711"
    assert node("down-drained-by-preflight").drained and node("down-drained-by-preflight").ours
    assert not node("allocated").drained


def test_parse_refuses_output_without_a_state():
    with pytest.raises(slurm.SlurmError, match="printed no State="):
        slurm.parse_node("Node gpu-9 not found\n", "gpu-9")


@pytest.mark.parametrize(
    ("standing", "state", "verb"),
    [
        (PASS, "idle", "none"),
        (PASS, "drained-by-preflight", "resume"),
        (PASS, "down-drained-by-preflight", "resume"),
        (PASS, "drained-by-admin", "none"),  # never resume a drain that is not ours
        (FAIL, "idle", "drain"),
        (FAIL, "allocated", "drain"),  # DRAIN lets the running job finish
        (FAIL, "drained-by-admin", "none"),  # the admin's reason is kept, and so it is never ours to resume
        (FAIL, "drained-by-preflight", "none"),  # the same failure: no update at every health check
        (GPU_FAIL, "drained-by-preflight", "drain"),  # a new failure replaces our old reason
        (NONE, "idle", "drain"),  # no usable report: fail closed
    ],
)
def test_decide(standing, state, verb):
    action = slurm.decide(standing, node(state))
    assert action.verb == verb
    if verb == "drain":
        assert action.reason.startswith("preflight: ") and len(action.reason) <= slurm.REASON_MAX


def test_the_drain_reason_leaves_out_the_age_so_it_is_stable():
    assert slurm.reason_for(FAIL) == "preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
    later = Standing(False, FAIL.reason.replace("12 s ago", "2.0 h ago"), True, 7200.0)
    assert slurm.decide(later, slurm.Node("gpu-01", "IDLE+DRAIN", slurm.reason_for(FAIL))).verb == "none"


def test_a_too_old_pass_drains_with_a_reason_that_does_not_change_as_it_ages(tmp_path):
    from datetime import timedelta

    from preflight.last_report import load, standing

    loaded = load(report_file(tmp_path / "r.json", "cpu-pass"))
    end = loaded.report.finished_at
    reasons = {slurm.reason_for(standing(loaded, loaded.report.boot_id, end + timedelta(hours=h), max_age=3600)) for h in (2, 2.1, 30)}
    assert reasons == {"preflight: last pass is older than the 3600 s allowed; run preflight again"}


def test_a_long_reason_is_cut_for_sinfo():
    long = Standing(False, "cuda FAIL: " + "GPU 3 x " * 40, True, 1.0)
    reason = slurm.reason_for(long)
    assert len(reason) == slurm.REASON_MAX and reason.endswith("...")


# The command, as slurmd runs it.


def healthcheck(tmp_path: Path, fixture: str | None, state: str, *extra: str, exit_code: int = 0, message: str = "", hang: bool = False, boot: str = "this"):
    report = tmp_path / "report.json"
    if fixture is not None:
        report_file(report, fixture, boot=boot)
    log = tmp_path / "scontrol.log"
    bindir = fakes.scontrol(tmp_path / "bin", (NODES / f"{state}.txt").read_text(), log, exit_code, message, hang)
    env = {**clean_env(), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SLURMD_NODENAME": "gpu-01"}
    p = run_preflight(["slurm-healthcheck", "--report", str(report), *extra], env=env, timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p, calls


def test_a_failed_report_drains_the_node_with_a_preflight_reason(tmp_path):
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle")
    assert p.returncode == 1 and "draining gpu-01" in p.stdout
    assert calls[0] == ["show", "node", "gpu-01"]
    update = calls[1]
    assert update[:3] == ["update", "NodeName=gpu-01", "State=DRAIN"]
    assert update[3].startswith("Reason=preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor")
    assert len(calls) == 2


def test_a_pass_resumes_only_its_own_drain(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-by-preflight")
    assert p.returncode == 0 and calls == [["show", "node", "gpu-01"], ["update", "NodeName=gpu-01", "State=RESUME"]]


def test_a_pass_leaves_an_admins_drain_alone(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-by-admin")
    assert p.returncode == 0 and calls == [["show", "node", "gpu-01"]]
    assert "stays drained: someone else drained it (replace PSU 2, ticket 4711)" in p.stdout


def test_a_pass_from_before_the_reboot_drains(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", boot="an-earlier-boot")
    assert p.returncode == 1 and calls[1][3].startswith("Reason=preflight: last pass was before the last reboot")


def test_no_report_drains_fail_closed(tmp_path):
    p, calls = healthcheck(tmp_path, None, "idle")
    assert p.returncode == 1 and calls[1][3].startswith("Reason=preflight: no report at")


def test_dry_run_only_looks(tmp_path):
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", "--dry-run")
    assert p.returncode == 1 and p.stdout.startswith("would drain: ") and calls == [["show", "node", "gpu-01"]]


def test_node_name_option_wins_over_slurmd_nodename(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", "--node", "gpu-07")
    assert calls == [["show", "node", "gpu-07"]]


def test_slurmctld_unreachable_is_one_line_and_changes_nothing(tmp_path):
    message = "slurm_load_node error: Unable to contact slurm controller (connect failure)"
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", exit_code=1, message=message)
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "Unable to contact slurm controller" in line and line.endswith("node gpu-01 left as it is")
    assert len(calls) == 1


def test_a_hung_scontrol_is_killed_at_its_deadline(tmp_path, monkeypatch):
    from preflight.host import Host

    log = tmp_path / "scontrol.log"
    bindir = fakes.scontrol(tmp_path / "bin", "", log, hang=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "TIMEOUT", 1.0)
    with pytest.raises(slurm.SlurmError, match="did not answer within 1 s: is slurmctld reachable"):
        slurm.apply(Host(), FAIL, "gpu-01")
    assert subprocess.run(["pgrep", "-f", str(bindir)], capture_output=True).stdout == b""  # killed, not left behind


@pytest.mark.skipif(slurm.find_scontrol(None) is not None, reason="this machine has a real scontrol in Slurm's usual places")
def test_without_scontrol_it_says_what_to_do(tmp_path):
    report_file(tmp_path / "r.json", "cpu-pass")
    env = {**clean_env(), "PATH": str(tmp_path / "empty")}
    p = subprocess.run([sys.executable, "-m", "preflight", "slurm-healthcheck", "--report", str(tmp_path / "r.json")], env=env, capture_output=True, text=True, timeout=60)
    (line,) = p.stderr.strip().splitlines()
    assert p.returncode == 1 and "scontrol is not on PATH nor in /usr/local/bin" in line and "/opt/slurm/bin" in line


def test_scontrol_is_found_without_any_path_as_slurmd_starts_the_health_check(tmp_path, monkeypatch):
    # slurmd gives HealthCheckProgram an empty environment; a source build's scontrol is in /usr/local/bin.
    site = fakes.scontrol(tmp_path / "site", "", tmp_path / "log")
    monkeypatch.setattr(slurm, "SCONTROL_DIRS", ("/nonexistent", str(site)))
    assert slurm.find_scontrol(None) == str(site / "scontrol")
    first = fakes.scontrol(tmp_path / "first", "", tmp_path / "log")
    assert slurm.find_scontrol(f"{tmp_path / 'nothing'}:{first}") == str(first / "scontrol")  # PATH, where there is one, goes first


def test_the_health_check_drains_with_no_path_in_its_environment(tmp_path, monkeypatch):
    from preflight.host import Host

    log = tmp_path / "scontrol.log"
    site = fakes.scontrol(tmp_path / "site", (NODES / "idle.txt").read_text(), log)
    monkeypatch.setattr(slurm, "SCONTROL_DIRS", (str(site),))
    monkeypatch.delenv("PATH")
    slurm.apply(Host(), FAIL, "gpu-01")
    assert [json.loads(x)[:3] for x in log.read_text().splitlines()] == [["show", "node", "gpu-01"], ["update", "NodeName=gpu-01", "State=DRAIN"]]


def test_node_name_falls_back_to_the_short_hostname():
    import socket

    assert slurm.node_name({"SLURMD_NODENAME": "gpu-42"}) == "gpu-42"
    assert slurm.node_name({}) == socket.gethostname().split(".")[0]
