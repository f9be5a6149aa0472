"""The nccl check for real: torchrun, gloo ranks on this CPU, and every fault
the issue names injected into real processes. Each fault must FAIL naming the
rank or the setting, within the deadline, with the report written and no
process left (pgrep proves it). The pure judges are in test_nccl_judge.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import fakes
import pytest
from conftest import fast_profile, needs_root, run_preflight, workers_left

from preflight.gpuwork.launch import free_port
from preflight.pipeline.report import Report

DEADLINE = 45.0  # the fast profile's nccl timeout


@pytest.fixture
def fast(tmp_path: Path) -> dict[str, str]:
    """The cpu profile with a 4 s collective timeout and a deadline of DEADLINE seconds, as a site profile."""
    return fast_profile(tmp_path, "nccl", DEADLINE)


def run_nccl(env: dict[str, str], tmp_path: Path, *extra: str, profile: str = "cpu-fast", timeout: float = 120) -> tuple[subprocess.CompletedProcess, Report, float]:
    report = tmp_path / "report.json"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {"TMPDIR": str(tmp_path / "tmp"), **env}
    started = time.monotonic()
    p = run_preflight(["run", "--profile", profile, "--only", "nccl", "--report", str(report), *extra], env=env, timeout=timeout)
    took = time.monotonic() - started
    assert report.exists(), p.stderr  # the report is written whatever happened
    return p, Report.model_validate_json(report.read_text()), took


def nccl_result(report: Report):
    (result,) = [c for c in report.checks if c.check == "nccl"]
    return result


# --- passing runs --------------------------------------------------------------


def test_two_gloo_ranks_pass_through_the_cli_and_print_per_op_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_") or k == "PREFLIGHT_LOCK_FILE"}
    p, report, _ = run_nccl(env, tmp_path, profile="cpu")
    assert p.returncode == 0, p.stderr
    r = nccl_result(report)
    assert r.status == "PASS" and r.summary.startswith("2 gloo rank(s): 13 ops right on every rank (4 KiB and 8 MiB)")
    for op in ("all_reduce_fp32", "all_reduce_bf16", "all_gather", "reduce_scatter", "broadcast", "send_recv"):
        assert any(line.strip().startswith(op) and "small" in line and "large" in line for line in p.stderr.splitlines()), p.stderr
    ranks = r.details["ranks"]
    assert [o["report"]["stage"] for o in ranks] == ["done", "done"]
    assert {op["name"] for op in ranks[0]["report"]["ops"]} >= {"broadcast_large", "send_recv_small", "barrier"}
    names = {(m.name, m.labels.get("op"), m.labels.get("size")) for m in r.measurements}
    assert ("nccl_init_duration", None, None) in names and ("nccl_op_duration", "all_gather", "large") in names
    assert not workers_left(tmp_path)


def test_three_ranks_with_nproc_per_node(fast, tmp_path):
    p, report, _ = run_nccl(fast, tmp_path, "--nproc-per-node", "3")
    r = nccl_result(report)
    assert p.returncode == 0 and r.status == "PASS", p.stderr
    assert r.summary.startswith("3 gloo rank(s)") and len(r.details["ranks"]) == 3
    assert r.details["ranks"][2]["report"]["world_size"] == 3
    assert not workers_left(tmp_path)


# --- faults: each FAILs naming the rank, within the deadline, nothing left ---------


@pytest.mark.parametrize(
    "fault, words",
    [
        ("1:kill", "rank 1 died in all_reduce_fp32_small (op 1) (killed by SIGKILL)"),
        ("1:stop", "rank 1 hung in all_reduce_fp32_small (op 1)"),
        ("1:raise", "rank 1 failed first, in all_reduce_fp32_small (op 1): RuntimeError: PREFLIGHT_WORKER_FAULT asked rank to raise"),
        ("0:kill@broadcast_large", "rank 0 died in broadcast_large (op 11) (killed by SIGKILL)"),
        ("1:kill@start", "rank 1 never reported (killed by SIGKILL): last log line: PREFLIGHT_WORKER_FAULT: injecting kill at start"),
        ("0:stop@barrier", "rank 0 hung in barrier (op 13)"),
    ],
)
def test_a_rank_that_dies_hangs_or_raises_is_named(fast, tmp_path, fault, words):
    env = {**fast, "PREFLIGHT_WORKER_FAULT": fault}
    p, report, took = run_nccl(env, tmp_path)
    r = nccl_result(report)
    assert p.returncode == 1 and r.status == "FAIL", p.stderr
    assert words in r.cause, r.cause
    assert "last log line: PREFLIGHT_WORKER_FAULT: injecting" in r.cause or "raise" in fault
    assert took < DEADLINE, took
    assert "warning: PREFLIGHT_WORKER_FAULT" not in p.stderr  # the documented knob is not a typo
    assert not workers_left(tmp_path)


def test_past_the_deadline_the_run_is_killed_and_the_rank_named(fast, tmp_path):
    # Every rank stops itself, so none times out and says so: only the deadline ends it.
    profile = Path(fast["PREFLIGHT_PROFILES_DIR"]) / "cpu-fast.toml"
    profile.write_text(profile.read_text().replace(f"nccl = {DEADLINE}", "nccl = 15"))
    p, report, took = run_nccl({**fast, "PREFLIGHT_WORKER_FAULT": "*:stop"}, tmp_path)
    r = nccl_result(report)
    assert p.returncode == 1 and r.status == "FAIL" and took < 15 + 5, (took, p.stderr)
    assert "rank 0 hung in all_reduce_fp32_small (op 1) and was stopped at the deadline" in r.cause, r.cause
    assert "rank 1 hung" in r.cause and r.details["timed_out"] is True
    assert not workers_left(tmp_path)


def test_a_wrong_contribution_is_caught_by_the_comparison(fast, tmp_path):
    env = {**fast, "PREFLIGHT_WORKER_FAULT": "1:wrong@reduce_scatter_large"}
    p, report, _ = run_nccl(env, tmp_path)
    r = nccl_result(report)
    assert r.status == "FAIL" and r.summary == "reduce_scatter_large returned wrong values"
    # rank 1 corrupted the element at n/2 of its input, which lands in rank 1's chunk alone: 8 MiB of fp32 over 2 ranks
    assert "returned wrong values on rank(s) 1: 1 of 1048576 elements wrong; element 0 is" in r.cause and "expected" in r.cause
    assert not workers_left(tmp_path)


def test_a_socket_interface_that_does_not_exist_fails_before_launching(fast, tmp_path):
    p, report, took = run_nccl({**fast, "GLOO_SOCKET_IFNAME": "nosuch0"}, tmp_path)
    r = nccl_result(report)
    assert p.returncode == 1 and r.summary == "GLOO_SOCKET_IFNAME names a missing interface"
    assert "GLOO_SOCKET_IFNAME=nosuch0 (in the environment) names no interface on this node" in r.cause and "lo" in r.cause
    assert r.details["not_started"] and r.details["ranks"] == [] and r.duration_seconds < 2
    p, report, _ = run_nccl({**fast, "NCCL_SOCKET_IFNAME": "=eth99"}, tmp_path)
    assert "NCCL_SOCKET_IFNAME==eth99" in nccl_result(report).cause
    assert not workers_left(tmp_path)


def test_a_rendezvous_port_a_job_holds_on_the_host_is_no_obstacle(fast, tmp_path):
    # The ranks meet in a network of their own (base/tether.py): the port is free there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p, report, _ = run_nccl(fast, tmp_path, "--rdzv-port", str(port))
    r = nccl_result(report)
    assert p.returncode == 0, r.cause
    assert r.details["endpoint"] == f"127.0.0.1:{port}" and r.details["isolation"] == {"network": "private"}


def test_an_interpreter_without_torch_is_named(fast, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    p, report, _ = run_nccl(fast, tmp_path, "--python", str(python))
    r = nccl_result(report)
    assert p.returncode == 1 and r.summary == "torch is not importable"
    assert f"torch is not importable by {python}" in r.cause and "No module named" in r.cause
    assert "--python" in r.remedy


@pytest.mark.parametrize("body, did", [(None, "exited 1 with no output"), ("echo hello\n", "exited 0, printing 'hello'")])
def test_a_python_that_is_no_python_is_named_with_what_it_did(fast, tmp_path, body, did):
    python = Path("/bin/false")
    if body is not None:
        python = tmp_path / "python"
        python.write_text("#!/bin/sh\n" + body)
        python.chmod(0o755)
    p, report, took = run_nccl(fast, tmp_path, "--python", str(python))  # before: "torchrun never started the ranks ... last output: none"
    r = nccl_result(report)
    assert p.returncode == 1 and r.summary == f"{python} is not a Python interpreter", r.summary
    assert f"asked to print its version (`{python} -c " in r.cause and f"{python} {did}" in r.cause, r.cause
    assert r.remedy.startswith("point --python (PREFLIGHT_PYTHON, or python in the config file) at the training environment's interpreter")
    assert took < DEADLINE and not workers_left(tmp_path)


def _kill_rank_before_it_reports(proc: subprocess.Popen, local_rank: str) -> int:
    """SIGKILL the rank of ``proc``'s run (found among its own descendants by the LOCAL_RANK torchrun gives
    it) as soon as it exists: it is still starting, before it can write a report or a line. Its pid."""
    import psutil

    agent = psutil.Process(proc.pid)
    until = time.monotonic() + 60
    while time.monotonic() < until:
        for child in agent.children(recursive=True):
            try:
                if child.environ().get("LOCAL_RANK") == local_rank:
                    child.kill()
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.01)
    raise AssertionError("the rank never started")


def test_a_rank_killed_before_its_first_report_is_named_not_torchrun(fast, tmp_path):
    report = tmp_path / "report.json"
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp"), **fast}
    proc = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "cpu-fast", "--only", "nccl", "--report", str(report)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _kill_rank_before_it_reports(proc, "1")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    r = nccl_result(Report.model_validate_json(report.read_text()))
    # before: "torchrun never started the ranks ... run it by hand", with root_cause 1 and exitcode -9 in the details
    assert proc.returncode == 1 and r.summary == "rank 1 never reported (killed by SIGKILL)", (r.summary, r.cause)
    assert r.cause.startswith("rank 1 never reported (killed by SIGKILL)") and r.details["root_cause"] == 1
    assert "OOM killer" in r.remedy
    assert not workers_left(tmp_path)


def test_a_missing_tmpdir_is_named(fast, tmp_path):
    p, report, _ = run_nccl({**fast, "TMPDIR": str(tmp_path / "gone")}, tmp_path)
    r = nccl_result(report)
    assert p.returncode == 1 and f"TMPDIR={tmp_path / 'gone'} is not usable" in r.cause


@needs_root
def test_a_read_only_tmpdir_is_named_and_the_report_still_written(fast, tmp_path):
    ro, out = tmp_path / "ro", tmp_path / "out"
    ro.mkdir()
    out.mkdir()
    cmd = (
        f"mount -t tmpfs -o ro,size=1m tmpfs {ro} && TMPDIR={ro} {' '.join(fakes.PREFLIGHT)} run --profile cpu-fast --only nccl "
        f"--report {out}/report.json; echo rc=$?"
    )
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], env=fast, capture_output=True, text=True, timeout=120)
    assert "rc=1" in p.stdout, p.stderr
    r = nccl_result(Report.model_validate_json((out / "report.json").read_text()))
    assert f"TMPDIR={ro} is not usable (Read-only file system)" in r.cause


def test_more_ranks_than_gpus_is_refused_before_anything_runs(tmp_path):
    # The node (here NVML's facts, on a machine whose bus lists no NVIDIA GPU) gives the run 8 GPUs.
    nvml_file = Path(__file__).parent.parent / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"
    p = run_preflight(["run", "--profile", "h100-sxm", "--only", "nccl", "--nproc-per-node", "9", "--nvml-fake", str(nvml_file), "--report", str(tmp_path / "r.json")])
    errors = [line for line in p.stderr.strip().splitlines() if not line.startswith("preflight: node:")]
    assert p.returncode == 2 and "this node gives the run 8 GPU(s)" in p.stderr and len(errors) == 1, p.stderr
    assert not (tmp_path / "r.json").exists()


def test_debugging_switches_warn_naming_their_cost(fast, tmp_path):
    # NCCL_P2P_LEVEL=SYS allows every path, and NCCL_IB_DISABLE costs a one-node run of the cpu profile nothing:
    # neither is a finding, the second is said in the details.
    p, report, _ = run_nccl({**fast, "NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1"}, tmp_path)
    r = nccl_result(report)
    assert p.returncode == 0 and r.status == "WARN" and r.summary == "NCCL_P2P_DISABLE=1 is set"
    assert "staged through host memory" in r.cause and r.details["parts"]["run"] == "PASS"
    assert list(r.details["settings_without_cost"]) == ["NCCL_IB_DISABLE"]


# --- the worker by hand ----------------------------------------------------------


def test_the_worker_runs_by_hand_under_torchrun(tmp_path):
    script = Path(__file__).parents[2] / "checks" / "workers" / "nccl_smoke.py"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script),
            "--backend", "gloo", "--device", "cpu", "--large-bytes", str(1 << 20)]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert sorted(row["rank"] for row in rows) == [0, 1]
    assert all(row["ops"] == 13 and row["wrong"] == {} for row in rows)


# --- on a GPU ----------------------------------------------------------------------


@pytest.mark.gpu
def test_nccl_on_every_gpu_of_this_node(tmp_path):
    """On the lent GPU machine: NCCL for real, one rank per GPU of this node."""
    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA driver here")
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.count("GPU ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_") or k == "PREFLIGHT_LOCK_FILE"}
    p, report, took = run_nccl(env, tmp_path, "--nproc-per-node", str(gpus), "-v", profile="auto", timeout=300)
    print(p.stderr, f"check took {took:.1f} s")
    r = nccl_result(report)
    assert r.status in ("PASS", "WARN"), (r.cause, p.stderr)
    assert r.summary.startswith(f"{gpus} nccl rank(s): 13 ops right on every rank") and r.details["nccl_log"]["version"]
    assert "nvls" in r.details["nccl_log"]  # the bandwidth check's all_reduce floor follows it
    assert r.details["ranks"][0]["report"]["nccl_version"] and not workers_left(tmp_path)
