"""`preflight slurm-healthcheck`: the decision with recorded node states, and the
command end to end against recorded reports with a fake `scontrol` on PATH
that records what it was asked to do."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

import fakes
from conftest import FIXTURES, clean_env, report_file, run_preflight
from preflight.outputs.schedulers import slurm
from preflight.outputs.record.last_report import Standing
from preflight.pipeline.report_view import view

NODES = FIXTURES / "slurm"
REPORTS = FIXTURES / "reports"
SHM = "shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"


def reported(fixture: str | None, *checks: dict, **changes):  # noqa: ANN201
    """A recorded report as slurm-healthcheck reads it (report_view), its first checks replaced by ``checks``."""
    if fixture is None:
        return None
    data = json.loads((REPORTS / f"{fixture}.json").read_text())
    data["checks"] = [{**data["checks"][0], **c} for c in checks] + data["checks"][len(checks):]
    return view(json.dumps({**data, **changes}).encode())
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


def test_parse_reads_what_a_real_slurm_prints():
    drained = slurm.parse_node((NODES / "real-22.05-drained-by-preflight.txt").read_text(), "vm")
    assert (drained.state, drained.drained, drained.ours) == ("IDLE+DRAIN", True, True)
    assert drained.reason == "preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
    idle = slurm.parse_node((NODES / "real-22.05-idle.txt").read_text(), "vm")
    assert (idle.state, idle.reason, idle.drained) == ("IDLE", None, False)


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
        (FAIL, "drained-by-preflight", "drain"),  # the reason of an older preflight is rewritten in the new form, once
        (GPU_FAIL, "drained-by-preflight", "drain"),  # a new failure replaces our old reason
        (NONE, "idle", "drain"),  # no usable report: fail closed
    ],
)
def test_decide(standing, state, verb):
    action = slurm.decide(standing, node(state), REPORT[standing])
    assert action.verb == verb
    if verb == "drain":
        assert action.reason.startswith("preflight [") and len(action.reason) <= slurm.REASON_MAX


PASSED = reported("cpu-pass")
REPORT = {PASS: PASSED._replace(checks=[*PASSED.checks, PASSED.checks[0]._replace(check="cuda", summary="8 GPUs")]), FAIL: reported("shm-64m-fail"), NONE: None,
          GPU_FAIL: reported("shm-64m-fail", {"check": "cuda", "status": "FAIL", "summary": "GPU 3 (0000:3b:00.0): fell off the bus",
                                              "action": "reset-gpu", "domain": "node", "action_source": "NVML's recovery action"})}


def test_the_drain_reason_leaves_out_the_age_so_it_is_stable():
    reason = slurm.reason_for(slurm.report_cause(FAIL, REPORT[FAIL]))
    assert reason == f"preflight [node] drain: {SHM}"
    later = Standing(False, FAIL.reason.replace("12 s ago", "2.0 h ago"), True, 7200.0)
    assert slurm.decide(later, slurm.Node("gpu-01", "IDLE+DRAIN", reason), REPORT[FAIL]).verb == "none"


def test_the_drain_reason_starts_with_the_runs_action_and_domain_and_names_the_check_that_decided_it():
    action = slurm.decide(GPU_FAIL, node("idle"), REPORT[GPU_FAIL])
    assert action.reason == "preflight [node] reset-gpu: cuda FAIL: GPU 3 (0000:3b:00.0): fell off the bus"
    assert slurm.Node("gpu-01", "IDLE+DRAIN", action.reason).drained_for == "cuda"
    # The check with the highest action decides, not the first that failed.
    both = reported("shm-64m-fail", {"status": "FAIL", "action": "fix-job", "domain": "job"},
                    {"check": "xid", "status": "FAIL", "summary": "Xid 79 on GPU 2", "action": "reset-gpu", "domain": "node"})
    assert slurm.decide(FAIL, node("idle"), both).reason == "preflight [node] reset-gpu: xid FAIL: Xid 79 on GPU 2"
    # No check to name (no report, a pass too old): preflight's machinery has not vouched, the software's domain.
    assert slurm.decide(NONE, node("idle"), None).reason.startswith("preflight [software] drain: no report at")


@pytest.mark.parametrize(("reason", "ours", "check"), [
    ("preflight [node] reset-gpu: cuda FAIL: GPU 3 fell off the bus", True, "cuda"),
    ("preflight [job] fix-job: shm FAIL: /dev/shm is 64 MiB", True, "shm"),
    ("preflight [software] drain: slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7", True, "slurm-gres"),
    ("preflight [software] drain: last pass was before the last reboot; run preflight again", True, None),
    ("preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor", True, "shm"),  # an older preflight's
    ("preflight: no report at /var/lib/preflight/report.json", True, None),
    ("preflights are fun", False, None),
    ("maintenance: preflight: shm FAIL: x", False, None),
])
def test_its_own_reasons_old_and_new_and_the_check_each_names(reason, ours, check):
    n = slurm.Node("gpu-01", "IDLE+DRAIN", reason)
    assert (n.ours, n.drained_for if ours else None) == (ours, check)


def test_a_drain_is_lifted_only_once_the_check_that_drained_it_passes():
    bw = slurm.Node("gpu-01", "IDLE+DRAIN", "preflight [node] drain: bandwidth FAIL: GPU 2 H2D 11 GB/s, below the 20 GB/s floor")
    # A quick run that left bandwidth out passes: the node stays drained.
    quick = reported("cpu-pass", level="quick")
    quick = quick._replace(checks=[c for c in quick.checks if c.check != "bandwidth"])
    held = slurm.decide(PASS, bw, quick)
    assert held.verb == "none" and "stays drained: preflight drained it for bandwidth, which does not pass yet: not in this report" in held.why
    # Its result carried as it stood (a FAIL) would not vouch at all; one that now fails another way neither.
    assert slurm.decide(PASS, bw, reported("cpu-pass", {"check": "bandwidth", "status": "ERROR"})).verb == "none"
    # Once bandwidth passes, the drain is lifted.
    assert slurm.decide(PASS, bw, reported("cpu-pass")).verb == "resume"


def test_a_too_old_pass_drains_with_a_reason_that_does_not_change_as_it_ages(tmp_path):
    from datetime import timedelta

    from preflight.outputs.record.last_report import load, standing

    loaded = load(report_file(tmp_path / "r.json", "cpu-pass"))
    end = loaded.report.finished_at
    reasons = {slurm.reason_for(slurm.report_cause(standing(loaded, loaded.report.boot_id, end + timedelta(hours=h), max_age=3600), loaded.report))
               for h in (2, 2.1, 30)}
    assert reasons == {"preflight [software] drain: last pass is older than the 3600 s allowed; run preflight again"}


def test_the_drain_reason_and_the_output_carry_no_control_character_a_summary_quoted(tmp_path):
    # A summary may quote what another host posted (a group peer's name, gpuwork/meeting.py): it
    # must not reach Slurm's Reason (sinfo -R on an admin's terminal) or root's terminal raw.
    hostile = "node 1 (gpu-7\x1b]0;owned\x07\x1b[2J) kept out\tof the group"
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", checks=[{**json.loads((REPORTS / "shm-64m-fail.json").read_text())["checks"][0], "summary": hostile}])
    assert p.returncode == 1 and "draining gpu-01" in p.stdout
    reason = calls[1][3]
    assert reason == "Reason=preflight [node] drain: shm FAIL: node 1 (gpu-7\\x1b]0;owned\\x07\\x1b[2J) kept out of the group"
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in p.stdout.replace("\n", ""))


def test_a_long_reason_is_cut_for_sinfo():
    long = Standing(False, "cuda FAIL: " + "GPU-3-x-" * 40, True, 1.0)
    reason = slurm.reason_for(slurm.report_cause(long, None))
    assert len(reason) == slurm.REASON_MAX and reason.endswith("...")


# The command, as slurmd runs it.


def healthcheck(tmp_path: Path, fixture: str | None, state: str, *extra: str, exit_code: int = 0, message: str = "", hang: bool = False, boot: str = "this",
                sinfo: str = "", **changes):
    tmp_path.mkdir(parents=True, exist_ok=True)
    report = tmp_path / "report.json"
    if fixture is not None:
        report_file(report, fixture, boot=boot, **changes)
    log = tmp_path / "scontrol.log"
    bindir = fakes.scontrol(tmp_path / "bin", (NODES / f"{state}.txt").read_text(), log, exit_code, message, hang,
                            (NODES / sinfo).read_text() if sinfo else "")
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
    assert update[3] == f"Reason=preflight [node] drain: {SHM}"
    assert len(calls) == 2


def test_slurms_gres_against_the_nodes_gpus_through_the_command(tmp_path):
    # idle.txt: Gres=gpu:h100:8(S:0-1); the report says the node gave the run 7.
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", shape={"gpus": 7, "gpus_from": "PCI bus"})
    assert p.returncode == 0 and "but slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7; draining gpu-01" in p.stdout, p.stdout + p.stderr
    assert calls[1][3] == "Reason=preflight [node] service: slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7"
    p, calls = healthcheck(tmp_path / "8", "cpu-pass", "idle", shape={"gpus": 8, "gpus_from": "PCI bus"})
    assert len(calls) == 1 and "draining" not in p.stdout


def test_a_report_from_a_job_given_some_of_the_gpus_is_held_to_the_nodes_gres_by_the_bus(tmp_path):
    # Run in a job's container given 4 of the 8 (pyxis mounts only the allocated GPUs' device
    # nodes): the run saw 4, the bus lists the host's 8, and Gres=gpu:h100:8 is right.
    bus = [f"0000:{b:02x}:00.0" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)]
    partial = {"gpus": 4, "gpus_from": "the PCI bus and /dev/nvidia{0-3}", "pci_gpus": bus, "device_nodes": [0, 1, 2, 3], "host_gpus": 8,
               "notes": ["4 of the host's 8 GPUs have no device node here (not given to this container)"]}
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", shape=partial)
    assert p.returncode == 0 and len(calls) == 1 and "draining" not in p.stdout, p.stdout + p.stderr
    # A GPU gone from the bus too is the node's loss, whatever the run was given.
    p, calls = healthcheck(tmp_path / "lost", "cpu-pass", "idle", shape={**partial, "pci_gpus": bus[:7], "host_gpus": 7})
    assert calls[1][3] == "Reason=preflight [node] service: slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7", p.stdout


def test_past_the_cap_the_command_drains_nothing_and_says_would_drain(tmp_path):
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", "--textfile-dir", str(tmp_path), sinfo="sinfo-gpu-1-of-4-drained.txt")
    assert p.returncode == 1 and calls == [["show", "node", "gpu-01"]], p.stdout + p.stderr
    assert "would drain: 1 of 4 nodes already drained by preflight, past the cap (10% of partition gpu" in p.stdout
    assert json.loads((tmp_path / "sinfo.log").read_text()) == ["-h", "-N", "-p", "gpu", "-o", "%N|%R|%E"]
    assert 'preflight_slurm_drain_held{node="gpu-01"} 1' in (tmp_path / "preflight-slurm.prom").read_text()
    # Half the partition allowed: the drain goes through.
    p, calls = healthcheck(tmp_path / "wide", "shm-64m-fail", "idle", "--drain-cap", "0.5", sinfo="sinfo-gpu-1-of-4-drained.txt")
    assert calls[1][:3] == ["update", "NodeName=gpu-01", "State=DRAIN"]
    # A node preflight drained already is drained anew for a new cause without a count.
    p, calls = healthcheck(tmp_path / "again", "shm-64m-fail", "drained-by-preflight", sinfo="sinfo-gpu-1-of-4-drained.txt")
    assert calls[1][:3] == ["update", "NodeName=gpu-01", "State=DRAIN"] and not (tmp_path / "again" / "sinfo.log").exists()


@pytest.mark.parametrize("cap", ["0", "1.5", "-0.1", "nan"])
def test_a_drain_cap_that_is_no_share_is_refused(tmp_path, cap):
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", "--drain-cap", cap)
    assert p.returncode == 2 and "--drain-cap" in p.stderr and calls == []


def test_a_pass_resumes_only_its_own_drain(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-by-preflight")
    assert p.returncode == 0 and calls == [["show", "node", "gpu-01"], ["update", "NodeName=gpu-01", "State=RESUME"]]


def test_a_pass_leaves_an_admins_drain_alone(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-by-admin")
    assert p.returncode == 0 and calls == [["show", "node", "gpu-01"]]
    assert "stays drained: someone else drained it (replace PSU 2, ticket 4711)" in p.stdout


def test_a_pass_from_before_the_reboot_drains(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", boot="an-earlier-boot")
    assert p.returncode == 1 and calls[1][3].startswith("Reason=preflight [software] drain: last pass was before the last reboot")


def test_no_report_drains_fail_closed(tmp_path):
    p, calls = healthcheck(tmp_path, None, "idle")
    assert p.returncode == 1 and calls[1][3].startswith("Reason=preflight [software] drain: no report at")


def test_dry_run_prints_the_exact_scontrol_line_a_run_sends_and_sends_nothing(tmp_path):
    p, calls = healthcheck(tmp_path / "dry", "shm-64m-fail", "idle", "--dry-run")
    assert p.returncode == 1 and calls == [["show", "node", "gpu-01"]]  # looked, changed nothing
    first, because = p.stdout.splitlines()
    assert first.startswith("would run: scontrol update NodeName=gpu-01 State=DRAIN ") and because.startswith("  because: not vouched")
    _, real = healthcheck(tmp_path / "real", "shm-64m-fail", "idle")
    assert shlex.split(first.removeprefix("would run: ")) == ["scontrol", *real[1]]


def test_dry_run_says_why_it_would_do_nothing(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-by-admin", "--dry-run")
    assert p.returncode == 0 and len(calls) == 1
    assert p.stdout.startswith("nothing: passed ") and "gpu-01 stays drained: someone else drained it (replace PSU 2, ticket 4711)" in p.stdout


def invoke_without_scontrol(tmp_path, monkeypatch, *args: str):
    """The command in this process, with no scontrol anywhere it looks (this machine may have Slurm installed)."""
    from typer.testing import CliRunner

    from preflight.cli.app import app

    monkeypatch.setattr(slurm, "SCONTROL_DIRS", (str(tmp_path / "nowhere"),))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-01")
    return CliRunner().invoke(app, ["slurm-healthcheck", *args])


def cases_said(lines: list[str]) -> dict[str, str]:
    return {case.strip(): said.strip() for case, _, said in (line.partition(":") for line in lines)}


def test_dry_run_without_scontrol_gives_the_line_for_each_state_the_node_could_be_in(tmp_path, monkeypatch):
    report = report_file(tmp_path / "r.json", "shm-64m-fail")
    r = invoke_without_scontrol(tmp_path, monkeypatch, "--report", str(report), "--dry-run")
    assert r.exit_code == 1 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].startswith("not vouched: shm FAIL: /dev/shm is 64 MiB")
    assert lines[1].startswith("gpu-01's state is unknown (scontrol is not on PATH") and "what it would run in each state" in lines[1]
    drain = f"scontrol update NodeName=gpu-01 State=DRAIN 'Reason=preflight [node] drain: {SHM}'"
    assert cases_said(lines[2:6]) == {"not drained": drain, "drained by preflight for another cause": drain,
                    "drained by preflight for this cause": "nothing", "drained by someone else": "nothing"}
    assert "never lifted" in lines[6]

    report_file(report, "cpu-pass")
    r = invoke_without_scontrol(tmp_path, monkeypatch, "--report", str(report), "--dry-run")
    assert r.exit_code == 0 and r.stdout.startswith("vouched: passed ")
    assert cases_said(r.stdout.splitlines()[2:5]) == {
        "not drained": "nothing", "drained by preflight": "scontrol update NodeName=gpu-01 State=RESUME", "drained by someone else": "nothing"}


def test_dry_run_with_slurmctld_unreachable_says_so_and_gives_each_case(tmp_path):
    message = "slurm_load_node error: Unable to contact slurm controller (connect failure)"
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", "--dry-run", exit_code=1, message=message)
    assert p.returncode == 0 and len(calls) == 1 and "Unable to contact slurm controller" in p.stdout.splitlines()[1]
    assert "scontrol update NodeName=gpu-01 State=RESUME" in p.stdout


@pytest.mark.parametrize(("standing", "expected"), [
    (FAIL, {"not drained": "drain", "drained by preflight for another cause": "drain",
            "drained by preflight for this cause": "none", "drained by someone else": "none"}),
    (NONE, {"not drained": "drain", "drained by preflight for another cause": "drain",
            "drained by preflight for this cause": "none", "drained by someone else": "none"}),
    (PASS, {"not drained": "none", "drained by preflight": "resume", "drained by someone else": "none"}),
])
def test_the_cases_a_dry_run_lists_are_what_decide_does(standing, expected):
    assert {case: action.verb for case, action in slurm.cases(standing, "gpu-01", REPORT[standing])} == expected


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
    from preflight.base.host import Host

    log = tmp_path / "scontrol.log"
    bindir = fakes.scontrol(tmp_path / "bin", "", log, hang=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "TIMEOUT", 1.0)
    with pytest.raises(slurm.SlurmError, match="did not answer within 1 s: is slurmctld reachable"):
        slurm.apply(Host(), FAIL, "gpu-01", REPORT[FAIL])
    assert subprocess.run(["pgrep", "-f", str(bindir)], capture_output=True).stdout == b""  # killed, not left behind


def test_without_scontrol_it_says_what_to_do(tmp_path, monkeypatch):
    report_file(tmp_path / "r.json", "cpu-pass")
    r = invoke_without_scontrol(tmp_path, monkeypatch, "--report", str(tmp_path / "r.json"))
    (line,) = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and "scontrol is not on PATH nor in" in line and line.endswith("node gpu-01 left as it is")


def test_scontrol_is_found_without_any_path_as_slurmd_starts_the_health_check(tmp_path, monkeypatch):
    # slurmd gives HealthCheckProgram an empty environment; a source build's scontrol is in /usr/local/bin.
    site = fakes.scontrol(tmp_path / "site", "", tmp_path / "log")
    monkeypatch.setattr(slurm, "SCONTROL_DIRS", ("/nonexistent", str(site)))
    assert slurm.find_scontrol(None) == str(site / "scontrol")
    first = fakes.scontrol(tmp_path / "first", "", tmp_path / "log")
    assert slurm.find_scontrol(f"{tmp_path / 'nothing'}:{first}") == str(first / "scontrol")  # PATH, where there is one, goes first


def test_the_health_check_drains_with_no_path_in_its_environment(tmp_path, monkeypatch):
    from preflight.base.host import Host

    log = tmp_path / "scontrol.log"
    site = fakes.scontrol(tmp_path / "site", (NODES / "idle.txt").read_text(), log)
    monkeypatch.setattr(slurm, "SCONTROL_DIRS", (str(site),))
    monkeypatch.delenv("PATH")
    slurm.apply(Host(), FAIL, "gpu-01", REPORT[FAIL])
    assert [json.loads(x)[:3] for x in log.read_text().splitlines()] == [["show", "node", "gpu-01"], ["update", "NodeName=gpu-01", "State=DRAIN"]]


def test_node_name_falls_back_to_the_short_hostname():
    import socket

    assert slurm.node_name({"SLURMD_NODENAME": "gpu-42"}) == "gpu-42"
    assert slurm.node_name({}) == socket.gethostname().split(".")[0]


def test_the_cap_comes_from_the_config_where_no_flag_gives_it(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("slurm_drain_cap = 0.5\n")
    p, calls = healthcheck(tmp_path / "run", "shm-64m-fail", "idle", "--config", str(config), sinfo="sinfo-gpu-1-of-4-drained.txt")
    assert calls[1][:3] == ["update", "NodeName=gpu-01", "State=DRAIN"], p.stdout + p.stderr  # half of four: room for a second
    config.write_text("slurm_drain_cap = 2\n")
    p, calls = healthcheck(tmp_path / "bad", "shm-64m-fail", "idle", "--config", str(config), sinfo="sinfo-gpu-1-of-4-drained.txt")
    assert p.returncode == 2 and "slurm_drain_cap: Input should be less than or equal to 1" in p.stderr and calls == []  # before slurmctld is asked


def test_a_gres_it_cannot_read_is_said_and_not_held_against_the_node():
    n = slurm.Node("gpu-01", "IDLE", None, "gpu:h100:8(S:0-1")
    action = slurm.decide(PASS, n, REPORT[PASS]._replace(shape=view_shape(7)))
    assert action.verb == "none" and "Gres=gpu:h100:8(S:0-1: cannot read" in action.why and "Slurm's GPUs not compared" in action.why


def view_shape(gpus: int):  # noqa: ANN201
    from preflight.pipeline.report_view import ShapeView

    return ShapeView(gpus)


def test_a_textfile_dir_that_is_not_there_is_refused_before_slurmctld_is_asked(tmp_path):
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", "--textfile-dir", str(tmp_path / "missing"))
    assert p.returncode == 2 and "--textfile-dir" in p.stderr and "not a directory" in p.stderr and calls == []


LEMON = {"check": "history", "status": "WARN", "summary": "failed 3 times in 7 days: shm, shm, shm",
         "action": "service", "domain": "node", "action_source": "3 failed runs within 7 days (lemon_fails, lemon_days)"}


def test_a_failing_lemon_is_drained_for_service_naming_the_history_not_a_crash(tmp_path):
    # The history's result decides the run's action without being one of its checks.
    p, calls = healthcheck(tmp_path, "shm-64m-fail", "idle", history=LEMON)
    assert p.returncode == 1, p.stderr
    reason = "Reason=preflight [node] service: history WARN: failed 3 times in 7 days: shm, shm, shm"
    assert calls[-1] == ["update", "NodeName=gpu-01", "State=DRAIN", reason]
    p, _ = healthcheck(tmp_path / "dry", "shm-64m-fail", "idle", "--dry-run", history=LEMON)
    assert p.returncode == 1 and "service: history WARN" in p.stdout, p.stderr


def test_a_lemon_drain_stays_while_a_run_could_not_judge_its_history(tmp_path):
    # History locked past its deadline: the run passes, but says nothing of the lemon either way.
    skipped = {"check": "history", "status": "SKIP", "summary": "history not kept: locked by another process for over 5 s"}
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-lemon", history=skipped)
    assert [c[0] for c in calls] == ["show"], p.stdout
    assert "stays drained: preflight drained it for history, which does not pass yet: SKIP" in p.stdout, p.stdout


def test_a_lemon_drain_is_lifted_once_the_history_asks_nothing_and_the_run_passes(tmp_path):
    p, calls = healthcheck(tmp_path, "cpu-pass", "drained-lemon")
    assert p.returncode == 0, p.stderr
    assert calls[-1] == ["update", "NodeName=gpu-01", "State=RESUME"]


def test_a_passing_lemon_is_drained_for_service_and_stays_so_while_its_history_asks_it(tmp_path):
    # The latest run passed, but the node failed 3 times in 7 days: its action is service, so Slurm takes it out.
    p, calls = healthcheck(tmp_path, "cpu-pass", "idle", history=LEMON)
    reason = "Reason=preflight [node] service: history WARN: failed 3 times in 7 days: shm, shm, shm"
    assert calls[-1] == ["update", "NodeName=gpu-01", "State=DRAIN", reason], p.stdout + p.stderr
    assert "but history WARN: failed 3 times in 7 days" in p.stdout and "draining gpu-01" in p.stdout
    p, calls = healthcheck(tmp_path / "drained", "cpu-pass", "drained-lemon", history=LEMON)
    assert [c[0] for c in calls] == ["show"] and p.stdout.endswith("gpu-01 already drained by preflight\n"), p.stdout  # not resumed: still a lemon
    p, _ = healthcheck(tmp_path / "dry", "cpu-pass", "idle", "--dry-run", history=LEMON)
    assert "would run: scontrol update NodeName=gpu-01 State=DRAIN 'Reason=preflight [node] service: history WARN" in p.stdout, p.stdout


def test_the_jobs_fault_drains_nothing_and_spends_no_cap():
    jobs = reported("shm-64m-fail", {"action": "fix-job", "domain": "job", "action_source": "in a container (Docker (/.dockerenv))"})
    action = slurm.decide(FAIL, node("idle"), jobs)
    assert action.verb == "none" and "the fault is the job's (shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor: fix-job)" in action.why
    # A drain of ours for it stays until the check passes: the node is not vouched meanwhile.
    held = slurm.decide(FAIL, slurm.Node("gpu-01", "IDLE+DRAIN", f"preflight [job] fix-job: {SHM}"), jobs)
    assert held.verb == "none" and "which does not pass yet" in held.why
