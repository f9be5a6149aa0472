"""`preflight run --level` and `--budget` as a person and the integrations use them:
real processes on the cpu profile, and the fake NVML for a GPU profile at quick."""

import json
import os
import subprocess
import sys
from pathlib import Path

import fakes
import pytest
from conftest import REPORTS, clean_env, report_file, run_preflight
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from preflight.cli.app import app
from preflight.pipeline.lock import run_lock
from preflight.pipeline.report import Report

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
SPLIT = Path(__file__).parents[1] / "fixtures" / "topo" / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"


def env_with(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**clean_env(), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"), **extra}


def gate_report(tmp_path: Path) -> Path:
    """The boot gate's report (the recorded cpu run, written before levels: standard), of this boot."""
    return report_file(tmp_path / "report.json", "cpu-pass")


# ---- bad input: one line, exit 2, before anything runs, nothing written ---------------------------


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--level", "deep"], {}, "--level: Value error, 'deep' is not a level; choose one of: quick, standard, full"),
        ([], {"PREFLIGHT_LEVEL": "fast"}, "PREFLIGHT_LEVEL='fast': Value error, 'fast' is not a level"),
        (["--budget", "soon"], {}, "--budget: Value error, 'soon' is not a number of seconds"),
        (["--budget", "0"], {}, "--budget: Value error, '0' is not a number of seconds"),
        (["--budget", "-3"], {}, "--budget: Value error, '-3' is not a number of seconds"),
        (["--budget", "nan"], {}, "--budget: Value error, 'nan' is not a number of seconds"),
        (["--budget", "0.1"], {}, "budget 0.1 s (--budget or PREFLIGHT_BUDGET) fits no level: the quick level is expected to take 0.375 s, from this node's report"),
        (["--only", "nccl", "--level", "quick"], {}, "only nccl: not at level quick (asked for (--level, PREFLIGHT_LEVEL or config)) of profile cpu, whose checks there are shm"),
        (["--skip", "shm", "--level", "quick"], {}, "no check left to run: skip removes every check of profile cpu at level quick (shm)"),
    ],
)
def test_bad_level_or_budget_is_one_line_exit_2_and_writes_nothing(tmp_path, args, env, message):
    report = gate_report(tmp_path)
    before = report.read_text()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    p = run_preflight(["run", "--profile", "cpu", "--report", str(report), "--textfile-dir", str(textfile), *args], env=env_with(tmp_path, **env))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("preflight: error: " + message) and p.stderr.count("\n") == 1, p.stderr
    assert report.read_text() == before and list(textfile.iterdir()) == []


def test_a_budget_without_a_report_weighs_the_profiles_estimate_and_says_so(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--budget", "0.5"], env=env_with(tmp_path))
    assert p.returncode == 2
    assert "the quick level is expected to take 1 s, from the profile's estimate (the shm check took 0.65-0.91 s" in p.stderr


# ---- quick: what runs, what is kept, what the metrics say ----------------------------------------


def test_quick_runs_shm_alone_and_keeps_the_gates_results_with_their_time_across_quick_runs(tmp_path):
    report = gate_report(tmp_path)
    gate = Report.model_validate_json(report.read_text())
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    args = ["run", "--profile", "cpu", "--level", "quick", "--report", str(report), "--textfile-dir", str(textfile)]
    first = run_preflight(args, env=env_with(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "level quick: asked for (--level, PREFLIGHT_LEVEL or config)" in first.stderr
    assert "[PASS] shm" in first.stderr and "... nccl" not in first.stderr
    assert f"kept from the run of {gate.finished_at.isoformat()} (this boot, level standard): nccl PASS, bandwidth PASS, train PASS" in first.stderr
    assert "preflight: PASS (profile cpu, level quick; 4 pass; 3 kept from an earlier run)" in first.stderr
    second = run_preflight(args, env=env_with(tmp_path))
    assert second.returncode == 0, second.stderr
    r = Report.model_validate_json(report.read_text())
    assert (r.level, r.level_chosen_because) == ("quick", "asked for (--level, PREFLIGHT_LEVEL or config)")
    assert r.finished_at > gate.finished_at and r.versions == {"torch": "2.13.0+cpu"}
    kept = {c.check: (c.details["carried_from"], c.details["carried_level"]) for c in r.checks if "carried_from" in c.details}
    assert kept == dict.fromkeys(["nccl", "bandwidth", "train"], (gate.finished_at.isoformat(), "standard"))  # the gate's own time, twice over
    prom = {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in text_string_to_metric_families((textfile / "preflight.prom").read_text())}
    assert prom["preflight_run_level"] == {("quick",): 1, ("standard",): 0, ("full",): 0}
    measured = prom["preflight_check_timestamp_seconds"]
    assert measured[("nccl",)] == pytest.approx(gate.finished_at.timestamp()) and measured[("shm",)] == pytest.approx(r.finished_at.timestamp())
    assert "preflight_allreduce_bus_bandwidth_bytes_per_second" in prom  # the gate's figures stay in the metrics


def test_a_quick_pass_keeps_the_gates_fail(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    data = json.loads(report.read_text())
    data["checks"][2].update(status="FAIL", summary="host memcpy below floor on rank 1")
    data["verdict"], data["exit_code"] = "fail", 1
    report.write_text(json.dumps(data))
    p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--report", str(report)], env=env_with(tmp_path))
    assert p.returncode == 1, p.stderr
    assert "[PASS] shm" in p.stderr and "bandwidth FAIL" in p.stderr
    assert Report.model_validate_json(report.read_text()).verdict == "fail"


def torch_marker(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A site hook on the path of every Python started with the environment returned: as
    each process ends, it writes to the marker file whether it imported torch."""
    hook = tmp_path / "hook"
    hook.mkdir()
    marker = tmp_path / "pythons"
    (hook / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "def _said():\n"
        "    with open(os.environ['PYTHON_MARKER'], 'a') as f:\n"
        "        f.write(f\"torch={'torch' in sys.modules} {sys.argv}\\n\")\n"
        "atexit.register(_said)\n"
    )
    return marker, env_with(tmp_path, PYTHONPATH=str(hook), PYTHON_MARKER=str(marker))


def test_the_quick_level_imports_no_torch_in_any_process(tmp_path):
    """A site hook on the path of every Python this run could start says, as each
    process ends, whether it imported torch; the control shows the hook at work."""
    marker, env = torch_marker(tmp_path)
    control = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, timeout=120)
    assert control.returncode == 0 and marker.read_text().startswith("torch=True"), control.stderr
    marker.unlink()
    p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "-v"], env=env)
    assert p.returncode == 0, p.stderr
    (process,) = marker.read_text().splitlines()  # preflight alone: no worker, no other Python
    assert process.startswith("torch=False") and "preflight" in process


def test_the_fake_8x_h100_quick_level_imports_no_torch_in_any_process(tmp_path):
    """The same hook over a GPU profile's quick level (cuda, topology, pcie, rdma, fabric,
    firmware, shm) on the 8-GPU H100 fake: no Python this run starts imports torch, the
    agent included."""
    marker, env = torch_marker(tmp_path)
    bin_dir = fakes.nvidia_smi(tmp_path / "bin", SPLIT)
    config = tmp_path / "config.toml"
    config.write_text("[floors]\nshm_min_bytes = 1073741824\n")  # the 16 GiB floor takes half a minute on this VM
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    p = run_preflight(["run", "--profile", "auto", "--level", "quick", "--keep-going", "--nvml-fake", str(NVML / "h100-sxm-8x-healthy.json"),
                       "--config", str(config), "--report", str(tmp_path / "report.json")], env=env)
    assert p.returncode == 1 and "NVML facts are FAKE" in p.stderr, p.stderr  # fake facts never vouch for a node
    report = Report.model_validate_json((tmp_path / "report.json").read_text())
    assert report.profile == "h100-sxm" and [c.check for c in report.checks] == ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm"]
    pythons = marker.read_text().splitlines()
    assert pythons and all(line.startswith("torch=False") for line in pythons), pythons
    assert any("preflight" in line for line in pythons)


def test_a_gpu_profile_at_quick_runs_nvml_xid_topology_and_shm_and_starts_no_worker(tmp_path):
    """The 8-GPU H100 fake: cuda judges NVML and the kernel log, says CUDA init was not
    run, and fails closed on fake facts; topology and shm run; no worker starts (the
    interpreter GPU workers run under records any start)."""
    started = tmp_path / "python-calls"
    python = tmp_path / "python"  # records each call; the topology check asks it where torch is, without importing it
    python.write_text(f"#!/bin/sh\necho \"$@\" >> '{started}'\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    bin_dir = fakes.nvidia_smi(tmp_path / "bin", SPLIT)
    config = tmp_path / "config.toml"
    config.write_text("[floors]\nshm_min_bytes = 1073741824\n")  # the 16 GiB floor takes half a minute on this VM
    env = env_with(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}")

    def quick(fake: str) -> Report:
        report = tmp_path / f"{fake}.json"
        p = run_preflight(["run", "--profile", "h100-sxm", "--level", "quick", "--keep-going", "--nvml-fake", str(NVML / fake),
                           "--python", str(python), "--config", str(config), "--report", str(report)], env=env)
        assert p.returncode == 1, p.stderr  # fake facts never vouch for a node
        return Report.model_validate_json(report.read_text())

    healthy = quick("h100-sxm-8x-healthy.json")
    assert healthy.level == "quick" and [c.check for c in healthy.checks] == ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm"]
    cuda, topology, pcie, rdma, _, _, shm = healthy.checks
    parts = cuda.details["parts"]
    assert parts["inventory"] == "PASS" and parts["source"] == "FAIL" and parts["xid"] in ("PASS", "WARN")
    assert parts["cuda_init"] == "not run: the quick level starts no CUDA work (standard and full do)"
    assert {m.name for m in cuda.measurements} >= {"gpu_temperature", "gpu_pcie_link_width"}
    assert "gpu_cuda_init_duration" not in {m.name for m in cuda.measurements}
    assert topology.status in ("PASS", "WARN", "FAIL") and topology.details["parts"]["matrix"] == "PASS"  # it ran, on the capture
    assert pcie.status == "SKIP" and pcie.summary == "no NVIDIA GPU on the PCI bus"  # this machine's real bus
    assert shm.status == "PASS"
    # rdma reads this machine's /sys/class/infiniband: the CI VM has none.
    assert rdma.status == "SKIP" and rdma.summary == "no InfiniBand/RoCE device in /sys/class/infiniband"
    faulty = quick("h100-sxm-ecc-uncorrectable.json")
    assert faulty.checks[0].details["parts"]["inventory"] == "FAIL" and "uncorrectable" in faulty.checks[0].cause
    calls = started.read_text().splitlines() if started.exists() else []
    assert not [c for c in calls if "workers/" in c or "torch.distributed" in c or "import torch" in c], calls


def test_calibrate_runs_the_standard_level_whatever_the_config_asks_for(tmp_path):
    """Calibrate plans its runs before it takes the lock: held elsewhere, it stops there
    (exit 2), having planned bandwidth and train at standard; at quick the plan would refuse."""
    lock = tmp_path / "lock"
    with run_lock(lock, 0):  # another run holds it (flock is per open file: this process's second open waits too)
        r = CliRunner().invoke(app, ["calibrate", "--profile", "cpu", "-o", str(tmp_path / "floors.toml")],
                               env={"PREFLIGHT_LEVEL": "quick", "PREFLIGHT_LOCK_FILE": str(lock), "PREFLIGHT_LOCK_TIMEOUT": "0"})
    assert r.exit_code == 2, r.output
    assert "another preflight run" in r.stderr and "not at level" not in r.stderr, r.stderr
    assert not (tmp_path / "floors.toml").exists()


# ---- budget ----------------------------------------------------------------------------------------


def test_a_budget_picks_the_deepest_level_this_nodes_report_says_fits(tmp_path):
    report = gate_report(tmp_path)  # shm 0.37 s, the four checks 16.9 s
    p = run_preflight(["run", "--profile", "cpu", "--budget", "5", "--report", str(report)], env=env_with(tmp_path))
    assert p.returncode == 0, p.stderr
    r = Report.model_validate_json(report.read_text())
    assert r.level == "quick" and r.level_chosen_because.startswith(
        f"budget 5 s (--budget or PREFLIGHT_BUDGET): the deepest level that fits, expected 0.375 s from this node's report {report} of ")
    assert "level quick: budget 5 s" in p.stderr
    # --level caps it; --only weighs only the checks it names.
    p = run_preflight(["run", "--profile", "cpu", "--budget", "60", "--level", "quick", "--report", str(report)], env=env_with(tmp_path))
    assert p.returncode == 0 and Report.model_validate_json(report.read_text()).level == "quick"
    p = run_preflight(["run", "--profile", "cpu", "--budget", "3", "--only", "shm", "--report", str(report)], env=env_with(tmp_path))
    assert p.returncode == 0, p.stderr
    r = Report.model_validate_json(report.read_text())
    assert r.level == "full" and "the deepest level that fits" in r.level_chosen_because  # shm alone fits: --only weighs only the checks it names, so full runs it


def test_the_recorded_reports_are_what_the_budget_tests_assume():
    times = {c.check: c.duration_seconds for c in Report.model_validate_json((REPORTS / "cpu-pass.json").read_bytes()).checks}
    assert round(times["shm"], 3) == 0.375 and sum(times.values()) < 60


def test_show_profile_lists_each_levels_checks_and_estimate_with_its_source():
    r = CliRunner().invoke(app, ["show-profile", "h100-sxm"])
    assert r.exit_code == 0, r.output
    assert "    quick: cuda, topology, pcie, rdma, fabric, firmware, shm; about 4 s\n      source: measured: the quick level took 1.04-1.15 s wall" in r.stdout
    assert "    full: cuda, topology, pcie, rdma, fabric, firmware, shm, nccl, bandwidth, train, burnin, memtest; about 447 s\n      source: standard's 27 s (the time model) plus the burn-in's 300 s" in r.stdout
