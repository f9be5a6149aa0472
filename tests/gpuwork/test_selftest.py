"""`preflight selftest`, the GPU acceptance kit: on this CPU-only machine it skips
the GPU stages with the reason and runs the cpu path for real; its judges and
tables are checked against recorded reports (tests/fixtures/reports)."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import FIXTURES, clean_env, needs_root, no_driver, run_preflight, tmpdir_in_nobodys_home
from typer.testing import CliRunner

import fakes
from preflight.gpuwork import selftest
from preflight.cli.app import app
from preflight.gpuwork.selftest_report import (
    Outcome, StageResult, judge_inventory, judge_run, render_report, render_stage, verdict,
)

REPORTS = FIXTURES / "reports"


def outcome(stdout: str = "", stderr: str = "", exit_code: int = 0, timed_out: bool = False) -> Outcome:
    return Outcome(["python", "-m", "preflight"], exit_code, 1.0, timed_out, stdout, stderr)


def recorded(name: str) -> str:
    return (REPORTS / f"{name}.json").read_text()


# ---- the whole kit, as a person runs it ----------------------------------------------


@no_driver
def test_without_a_gpu_the_gpu_stages_skip_with_the_reason_and_nccl_runs_on_the_cpu_profile(tmp_path):
    out = tmp_path / "selftest.json"
    p = run_preflight(["selftest", "--stage", "cuda,nccl", "--out", str(out)], timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    stages = {s["name"]: s for s in doc["stages"]}
    assert [s["status"] for s in doc["stages"]] == ["SKIP", "SKIP", "PASS", "not selected", "not selected", "not selected"]
    assert stages["inventory"]["reason"].startswith("no NVIDIA GPU here (no NVIDIA driver")
    assert stages["cuda"]["reason"].startswith("needs an NVIDIA GPU")
    nccl = stages["nccl"]
    assert nccl["command"][-8:] == ["run", "--profile", "cpu", "--only", "nccl", "--keep-going", "--json", "--scratch"]
    assert nccl["report"]["verdict"] == "pass" and nccl["report"]["checks"][0]["check"] == "nccl"
    assert 0 < nccl["seconds"] < nccl["deadline_seconds"] and doc["gpu"] is False and doc["profile"] == "cpu"
    # Each figure next to its bound, the stage's time, and what was skipped, said at the end.
    assert "== nccl: NCCL (the nccl check)  PASS" in p.stdout
    assert any(line.split()[:1] == ["nccl_init_duration"] and "ceiling 10.00 s" in line and "x ceiling" in line for line in p.stdout.splitlines())
    assert p.stdout.rstrip().splitlines()[-1].startswith("selftest: PASS for what ran; skipped: inventory, cuda")
    assert doc["exit_code"] == 0 and "no GPU acceptance" in doc["verdict"]


def test_on_fake_nvml_facts_the_gpu_stages_run_and_a_failing_check_fails_the_selftest(tmp_path):
    # NVML facts of a healthy 8-GPU HGX H100 but no CUDA device: the GPU path is taken
    # (inventory, profile auto, the cuda check), and the cuda check must fail.
    env = {**clean_env(), "PREFLIGHT_NVML_FAKE": str(FIXTURES / "nvml" / "h100-sxm-8x-healthy.json")}
    out = tmp_path / "selftest.json"
    p = run_preflight(["selftest", "--stage", "cuda", "--out", str(out)], env=env, timeout=240)
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    inventory, cuda = doc["stages"][:2]
    assert inventory["status"] == "PASS" and inventory["reason"].startswith("8 GPU(s): NVIDIA H100 80GB HBM3; driver ")
    assert doc["gpu"] is True and doc["plan"]["resolved"] == "h100-sxm"
    assert cuda["status"] == "FAIL" and cuda["command"][-7:-3] == ["--profile", "auto", "--only", "cuda"]
    assert "   GPU 7  NVIDIA H100 80GB HBM3" in p.stdout and "      cause: " in p.stdout
    assert p.stdout.rstrip().splitlines()[-1] == "selftest: FAIL (failed: cuda)"


@pytest.mark.parametrize("args, said", [
    (["--stage", "nccl,gpu"], "--stage gpu: no such stage"),
    (["--budget", "0"], "--budget 0: give seconds above 0"),
    (["--out", "/nonexistent/dir/selftest.json"], "--out /nonexistent/dir/selftest.json: directory /nonexistent/dir does not exist; create it"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(args, said, tmp_path):
    r = CliRunner().invoke(app, ["selftest", *args])
    assert r.exit_code == 2 and said in r.stderr and r.stdout == "", r.output


@needs_root
def test_a_tmpdir_another_user_could_swap_is_refused_before_anything_runs(tmp_path, monkeypatch):
    # The stages run `python -m preflight` in a folder there: a swapped one would import their preflight as root.
    tmp, refusal = tmpdir_in_nobodys_home(tmp_path, monkeypatch)
    r = CliRunner().invoke(app, ["selftest"])
    assert r.exit_code == 2 and r.stdout == "" and refusal in r.stderr, r.output
    assert not any(tmp.iterdir())


def test_a_stage_past_its_deadline_is_stopped_with_everything_it_started(tmp_path, monkeypatch):
    root = fakes.install_plugin(tmp_path / "plugin", broken=False)
    fakes.write_profile(root / "profiles", "sleepy", ["slow"])
    mark = uuid.uuid4().hex
    for k, v in {**fakes.plugin_env(root), "FAKE_SLOW_SECONDS": "120", "KIT_TEST_MARK": mark}.items():
        monkeypatch.setenv(k, v)
    started = time.monotonic()
    o = selftest.run_child(["run", "--profile", "sleepy", "--json", "--scratch"], 4.0, tmp_path)
    assert o.timed_out and time.monotonic() - started < 4.0 + selftest.GRACE_SECONDS + 5
    status, reason, _ = judge_run(o)
    assert status == "FAIL" and reason.startswith("no answer in ")
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _has_env(p, f"KIT_TEST_MARK={mark}")]


def test_a_stage_the_budget_cuts_short_is_a_skip_that_strict_fails(tmp_path):
    root = fakes.install_plugin(tmp_path / "plugin", broken=False)
    fakes.write_profile(root / "profiles", "sleepy", ["passing", "slow"])
    env = {**fakes.plugin_env(root), "FAKE_SLOW_SECONDS": "120"}
    started = time.monotonic()
    p = run_preflight(["selftest", "--profile", "sleepy", "--budget", "15", "--strict"], env=env, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert time.monotonic() - started < 15 + selftest.GRACE_SECONDS + 10
    summary = p.stdout[p.stdout.index("== summary"):]
    assert "nccl SKIP - not a check of profile sleepy" in [" ".join(line.split()) for line in summary.splitlines()]
    run = next(line.split() for line in summary.splitlines() if line.startswith("   run "))
    assert run[1] == "SKIP" and "--budget" in run  # never started, or stopped when the budget ran out
    assert p.stdout.rstrip().splitlines()[-1] == "selftest: FAIL (skipped under --strict: inventory, cuda, nccl, bandwidth, train, run)"


def test_a_signal_stops_the_stage_in_flight_and_the_json_says_so(tmp_path):
    root = fakes.install_plugin(tmp_path / "plugin", broken=False)
    fakes.write_profile(root / "profiles", "sleepy", ["slow"])
    mark = uuid.uuid4().hex
    env = {**fakes.plugin_env(root), "FAKE_SLOW_SECONDS": "120", "KIT_TEST_MARK": mark}
    out = tmp_path / "selftest.json"
    kit = subprocess.Popen([*fakes.PREFLIGHT, "selftest", "--profile", "sleepy", "--stage", "run", "--out", str(out)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in kit.stderr:  # progress: the stage's command line, once it has started
            if line.startswith("selftest: run: "):
                break
        time.sleep(1)
        kit.send_signal(signal.SIGTERM)
        assert kit.wait(timeout=selftest.GRACE_SECONDS + 10) == 128 + signal.SIGTERM
    finally:
        kit.kill()
    run = json.loads(out.read_text())["stages"][-1]
    assert run["name"] == "run" and run["status"] == "FAIL" and run["reason"].startswith("selftest interrupted by signal 15")
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _has_env(p, f"KIT_TEST_MARK={mark}")]


def test_the_sweep_kills_a_process_that_left_the_session_but_carries_the_token():
    token = uuid.uuid4().hex
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True, env={**os.environ, selftest.TOKEN_ENV: token})
    assert selftest._sweep(token) == 1
    assert proc.wait(timeout=5) == -signal.SIGKILL


def _has_env(proc: Path, needle: str) -> bool:
    try:
        return needle.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


# ---- judges, on recorded output ------------------------------------------------------


def test_a_passing_recorded_run_passes_and_a_failing_one_names_the_check():
    assert judge_run(outcome(recorded("cpu-pass")))[:2] == ("PASS", "verdict pass, exit 0, 4 check(s)")
    status, reason, report = judge_run(outcome(recorded("shm-64m-fail"), exit_code=1))
    assert status == "FAIL" and reason.startswith("verdict fail, exit 1; shm FAIL: ") and report["profile"] == "cpu"


def test_a_run_that_printed_no_report_fails_with_its_last_line():
    status, reason, report = judge_run(outcome("Traceback ...", "ModuleNotFoundError: No module named 'pydantic'\n", exit_code=1))
    assert (status, report) == ("FAIL", None) and reason == "exit 1, no JSON report: ModuleNotFoundError: No module named 'pydantic'"


def test_a_pass_with_a_nonzero_exit_is_not_a_pass():
    # The report could not be written: the run exits 3 though its checks passed.
    assert judge_run(outcome(recorded("cpu-pass"), exit_code=3))[0] == "FAIL"


def test_a_run_whose_every_check_skipped_is_a_skip_with_their_reasons():
    report = json.loads(recorded("cpu-pass"))
    for c in report["checks"]:
        c.update(status="SKIP", summary=f"{c['check']} does not apply here")
    status, reason, _ = judge_run(outcome(json.dumps(report)))
    assert status == "SKIP" and reason.startswith("shm: shm does not apply here; nccl: ")


def test_inventory_skips_only_where_nothing_says_a_gpu_is_here():
    said = "preflight: error: no NVIDIA driver: libnvidia-ml.so.1 was not found; install or load the NVIDIA driver\n"
    status, reason, _ = judge_inventory(outcome(stderr=said, exit_code=1), None, False)
    assert status == "SKIP" and reason.startswith("no NVIDIA GPU here (no NVIDIA driver: libnvidia-ml.so.1 was not found; no NVIDIA")
    status, reason, _ = judge_inventory(outcome(stderr=said, exit_code=1), "device nodes /dev/nvidia0", False)
    assert status == "FAIL" and "this machine has device nodes /dev/nvidia0" in reason


def test_inventory_fails_on_a_lost_gpu_and_on_a_model_no_profile_knows(tmp_path):
    facts = json.loads((FIXTURES / "nvml" / "h100-sxm-8x-healthy.json").read_text())
    data = {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": facts["gpus"], "lost": [], "profile": None, "why": "no profile matches"}
    assert judge_inventory(outcome(json.dumps(data), exit_code=1), None, False)[0] == "FAIL"
    assert judge_inventory(outcome(json.dumps(data), exit_code=1), None, True)[0] == "PASS"  # --profile given
    data["lost"] = [{"index": 3, "pci_bus_id": "00000000:5D:00.0", "error": "GPU is lost"}]
    status, reason, _ = judge_inventory(outcome(json.dumps(data)), None, True)
    assert status == "FAIL" and reason == "1 GPU(s) lost: GPU 3 (00000000:5D:00.0): GPU is lost"


def test_gpu_evidence_reads_device_nodes_and_nvidia_controllers_on_the_pci_bus(tmp_path):
    assert selftest.gpu_evidence(tmp_path) is None
    dev = tmp_path / "sys/bus/pci/devices/0000:1b:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x068000\n")  # an NVSwitch bridge is no GPU
    assert selftest.gpu_evidence(tmp_path) is None
    (dev / "class").write_text("0x030200\n")
    assert selftest.gpu_evidence(tmp_path) == "NVIDIA PCI device(s) 0000:1b:00.0"
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").touch()
    (tmp_path / "dev/nvidiactl").touch()  # the control node is there without any GPU too
    assert selftest.gpu_evidence(tmp_path) == "device nodes /dev/nvidia0"


def test_a_skip_passes_unless_strict_and_a_failure_always_fails():
    ran = StageResult("nccl", "NCCL", "PASS")
    skipped = StageResult("cuda", "CUDA init", "SKIP", "needs an NVIDIA GPU")
    assert verdict([ran], strict=True) == (0, "selftest: PASS (every stage ran and passed)")
    assert verdict([skipped, ran], strict=False)[0] == 0
    assert verdict([skipped, ran], strict=True) == (1, "selftest: FAIL (skipped under --strict: cuda)")
    assert verdict([ran, StageResult("run", "run", "FAIL")], strict=False) == (1, "selftest: FAIL (failed: run)")
    assert verdict([ran, StageResult("train", "train", "not selected")], strict=True)[0] == 0


# ---- the tables, from recorded reports -------------------------------------------------


def rows(lines: list[str], name: str) -> list[list[str]]:
    return [line.split("  ") for line in lines if line.strip().startswith(name + " ")]


def test_each_figure_is_printed_with_its_labels_its_floor_and_its_ratio_to_the_floor():
    lines = render_report(json.loads(recorded("cpu-pass")))
    assert lines[0].startswith("   report: profile cpu (--profile cpu), verdict pass, exit 0, 17.13 s; versions torch 2.13.0+cpu")
    memcpy = [" ".join(c.split()) for c in lines[[i for i, x in enumerate(lines) if x.strip().startswith("memcpy_bandwidth")][0]].split("  ") if c.strip()]
    assert memcpy == ["memcpy_bandwidth", "rank=0", "11.5 GB/s", "floor 2 GB/s", "5.77x floor"]
    latency = next(line for line in lines if line.strip().startswith("allreduce_latency") and "stat=p50" in line)
    assert "263.1 us" in latency and "ceiling 20 ms" in latency and "0.0132x ceiling" in latency
    gather = next(line for line in lines if line.strip().startswith("allgather_bus_bandwidth"))
    assert gather.split()[-1] == "-"  # no bound, no ratio
    assert any(line.startswith("   train  PASS  4.90 s  2 gloo rank(s), 0.1M-parameter GPT") for line in lines)
    assert any(line.startswith("      | time: import + init 1.5 s") for line in lines)  # the check's own timings


def test_per_gpu_figures_show_the_gpu_not_its_uuid_and_a_failure_its_cause_and_remedy():
    lines = render_report(json.loads(recorded("h100-fake-hw-slowdown")))
    links = next(line for line in lines if line.strip().startswith("gpu_nvlinks_active") and "gpu=3" in line)
    assert "UUID" not in links and "18 links" in links and "floor 18 links" in links and "1x floor" in links
    assert "   cuda  FAIL  1.89 s  GPU 6 (0000:d1:00.0): hardware slowdown active (+2 more) (xid passed)" in lines
    assert any(line.startswith("      cause: GPU 6 (0000:d1:00.0) runs with HW slowdown") for line in lines)
    assert any(line.startswith("      remedy: check the BMC") for line in lines)
    assert "   nccl  SKIP  0 ms  skipped: requires cuda, which failed" in lines


def test_a_failed_stage_shows_the_command_its_time_and_the_end_of_its_stderr():
    r = StageResult("run", "the whole run", "FAIL", "exit 1, no JSON report: boom", [sys.executable, "-m", "preflight", "run", "--json"],
                    1, 12.5, 600.0, False, None, ["Traceback (most recent call last):", "boom"])
    text = render_stage(r)
    assert text.splitlines()[:3] == ["== run: the whole run  FAIL  12.50 s (deadline 600 s)", "   $ preflight run --json", "   exit 1, no JSON report: boom"]
    assert text.splitlines()[-2:] == ["   > Traceback (most recent call last):", "   > boom"]
