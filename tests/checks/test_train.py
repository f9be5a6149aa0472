"""The train check for real: torchrun, two gloo ranks training a tiny GPT on
this CPU, through the CLI, and every fault the issue names injected into the
real processes: NaN, a slow rank, perturbed parameters, a GPU that computes
different logits, a hang. Each must FAIL naming the rank, within the
deadline, leaving no process. The pure judges are in test_train_judge.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env, fast_profile, run_preflight, workers_left

from preflight.gpuwork import launch
from preflight.pipeline.report import Report

DEADLINE = 60.0  # the fast profile's train timeout
ROOM = 150.0  # a deadline with room for a second launch on a loaded 2-core machine


@pytest.fixture
def fast(tmp_path: Path) -> dict[str, str]:
    """The cpu profile with a 4 s collective timeout and a deadline of DEADLINE seconds, as a site profile."""
    return fast_profile(tmp_path, "train", DEADLINE)


@pytest.fixture
def roomy(tmp_path: Path) -> dict[str, str]:
    """As ``fast``, with time for the second launch that confirms a figure beyond its floor."""
    return fast_profile(tmp_path, "train", ROOM)


def run_train(env: dict[str, str], tmp_path: Path, *extra: str, profile: str = "cpu-fast"):
    report = tmp_path / "report.json"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    started = time.monotonic()
    p = run_preflight(["run", "--profile", profile, "--only", "train", "--report", str(report), *extra], env={"TMPDIR": str(tmp_path / "tmp"), **env}, timeout=180)
    took = time.monotonic() - started
    assert report.exists(), p.stderr
    (r,) = [c for c in Report.model_validate_json(report.read_text()).checks if c.check == "train"]
    return p, r, took


def test_the_cpu_profile_trains_with_loss_falling_and_ranks_agreeing(tmp_path):
    p, r, _ = run_train(clean_env(), tmp_path, profile="cpu")
    assert p.returncode == 0 and r.status == "PASS", p.stderr
    assert r.summary.startswith("2 gloo rank(s), 0.1M-parameter GPT, loss ") and "ranks agree" in r.summary
    reports = [o["report"] for o in r.details["ranks"]]
    assert all(rep["losses"][-1] < rep["losses"][0] for rep in reports)
    assert len({rep["logits_checksum"] for rep in reports}) == 1 and len(set(reports[0]["param_checksums"])) == 1
    names = {m.name for m in r.measurements}
    assert {"gemm_throughput", "train_step_duration", "train_tokens_throughput", "train_model_throughput", "train_straggler"} <= names
    gemm = [m for m in r.measurements if m.name == "gemm_throughput"]
    assert len(gemm) == 2 and all(m.floor == 1e10 and m.value > m.floor for m in gemm)
    assert "floor 10.0 GFLOP/s" in p.stderr
    # Each timed figure ran at least the profile's count, at most its cap, every rank as many, and says how sure it is.
    assert len(reports[0]["step_seconds"]) == len(reports[1]["step_seconds"]) and 8 <= len(reports[0]["step_seconds"]) <= 16
    assert len(reports[0]["compute_seconds"]) == len(reports[1]["compute_seconds"]) and 20 <= len(reports[0]["compute_seconds"]) <= 30
    assert len(reports[0]["gemm_seconds"]) == len(reports[1]["gemm_seconds"]) and 5 <= len(reports[0]["gemm_seconds"]) <= 10
    assert all(set(rep["stopped"]) == {"steps", "compute", "gemm"} for rep in reports)
    step = next(m for m in r.measurements if m.name == "train_step_duration" and m.labels == {"stat": "p50"})
    assert step.repeats == len(reports[0]["step_seconds"]) and step.ci is not None and step.converged is not None
    # Where the check's time went on each rank: the build in two parts, then each stage; and each warm-up step.
    stages = ["agreement", "warmup", "steps", "compute", "checksum", "gemm"]
    assert all(list(rep["phases"]) == ["model", "data_parallel", *stages] and all(s >= 0 for s in rep["phases"].values()) for rep in reports)
    assert all(rep["dynamo_imported"] is False for rep in reports)
    assert all(len(rep["warmup_seconds"]) == 2 for rep in reports)
    assert not workers_left(tmp_path)


# Three ranks where a majority must tell the odd one out: with two, either could be the wrong one.
@pytest.mark.parametrize(
    "fault, ranks, summary, words",
    [
        ("1:nan@steps", 2, "loss is not finite on rank 1", "the loss is not finite on rank 1 at step 1; then on rank 0 (the all-reduce spread it)"),
        ("1:wrong@checksum", 3, "parameters diverged after all-reduce", "rank 1 hold parameters that differ from the other ranks'"),
        ("2:wrong@agreement", 3, "rank 2 computes different results", "different logits on rank 2 than on the other ranks"),
    ],
)
def test_an_injected_fault_fails_naming_the_rank(fast, tmp_path, fault, ranks, summary, words):
    p, r, took = run_train({**fast, "PREFLIGHT_WORKER_FAULT": fault}, tmp_path, "--nproc-per-node", str(ranks))
    assert p.returncode == 1 and r.status == "FAIL", p.stderr
    assert r.summary.startswith(summary), r.summary
    assert words in r.cause, r.cause
    assert r.details["confirm"]["launches"] == 1  # a wrong answer or a NaN is never measured again
    assert took < DEADLINE and not workers_left(tmp_path)


def straggler_reading(r) -> tuple[str, float, float]:
    (x,) = [x for x in r.details["confirm"]["readings"] if x["name"] == "train_straggler_ratio"]
    return x["verdict"], x["first"][0]["value"], x["second"][0]["value"]


def test_a_slow_rank_fails_as_a_straggler_confirmed_by_a_second_reading(roomy, tmp_path):
    p, r, took = run_train({**roomy, "PREFLIGHT_WORKER_FAULT": "1:slow@compute"}, tmp_path)
    assert p.returncode == 1 and r.status == "FAIL", p.stderr
    assert r.summary.startswith("straggler: rank 1 takes "), r.summary
    assert "rank 1's own forward+backward takes" in r.cause, r.cause
    verdict, first, second = straggler_reading(r)
    assert verdict == "confirmed" and first > 2 and second > 2 and "(confirmed: " in r.cause + r.summary
    assert r.details["parts"]["straggler"] == "FAIL" and r.details["confirm"]["launches"] == 2
    assert r.details["parts"]["outliers"] == "FAIL"  # past the median's FAIL band on both readings too
    assert [o["report"]["reading"] for o in r.details["second_run"]["ranks"]] == [2, 2]
    assert next(m for m in r.measurements if m.name == "train_straggler").value == second  # the metric is the second reading
    assert not workers_left(tmp_path)


def test_a_rank_slow_on_the_first_reading_only_warns_transient_with_both_readings(roomy, tmp_path):
    p, r, took = run_train({**roomy, "PREFLIGHT_WORKER_FAULT": "1:slow-once@compute"}, tmp_path)
    assert p.returncode == 0 and r.status == "WARN", (r.summary, r.cause)
    verdict, first, second = straggler_reading(r)
    assert verdict == "transient" and first > 2 > second
    assert r.details["parts"]["straggler"] == "WARN" and r.details["confirm"]["launches"] == 2
    assert r.details["parts"]["outliers"] in ("PASS", "WARN")  # past the median's FAIL band on the first reading only: never a FAIL
    assert "slowest rank over the median (own compute) was over the 2 ceiling" in r.cause and "on the first of two readings in this run only" in r.cause
    assert any(line.startswith("slowest rank over the median (own compute): transient: first reading ") for line in r.lines)
    assert not workers_left(tmp_path)


@pytest.mark.parametrize(
    "fault, words",
    [
        ("1:stop@steps", "rank 1 hung in steps"),
        ("0:kill@gemm", "rank 0 died in gemm"),
    ],
)
def test_a_rank_that_hangs_or_dies_is_named_within_the_deadline(fast, tmp_path, fault, words):
    p, r, took = run_train({**fast, "PREFLIGHT_WORKER_FAULT": fault}, tmp_path)
    assert p.returncode == 1 and r.status == "FAIL", p.stderr
    assert words in r.cause, r.cause
    assert took < DEADLINE, took
    assert r.details["confirm"]["launches"] == 1
    assert not workers_left(tmp_path)


def test_the_worker_runs_by_hand_with_torchrun(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(launch.WORKERS_DIR / "train_probe.py"), "--backend", "gloo", "--device", "cpu",
         "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32", "--batch", "4", "--vocab", "64", "--steps", "4", "--gemm-n", "128", "--gemm-repeats", "5"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith('{"rank"')]
    assert len(lines) == 2 and all('"gemm_tflops"' in x and '"loss"' in x for x in lines), p.stdout


@pytest.mark.gpu
def test_train_on_every_gpu_of_this_node(tmp_path):
    """On the lent GPU machine: the probe for real, its figures printed for the issue
    note (GEMM TFLOP/s, step time, MFU, the check's time)."""
    import shutil

    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA driver here")
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.count("GPU ")
    p, r, took = run_train(clean_env(), tmp_path, "--nproc-per-node", str(gpus), "-v", profile="auto")
    print(p.stderr, f"check took {took:.1f} s")
    assert r.details["parts"]["run"] == "PASS" and r.details["parts"]["loss"] == "PASS" and r.details["parts"]["agreement"] == "PASS", (r.cause, p.stderr)
    assert {"gemm_throughput", "train_step_duration", "train_mfu"} <= {m.name for m in r.measurements}
    # Where the check's time went on each rank, for the time model (checkkit/train_plan.py's plan): the parts' seconds, the warm-up steps'.
    for o in r.details["ranks"]:
        rep = o["report"]
        print(f"rank {o['rank']}: phases {rep['phases']} s; warm-up steps {rep['warmup_seconds']} s; repeats: steps {len(rep['step_seconds'])}, "
              f"own passes {len(rep['compute_seconds'])}, GEMM bursts {len(rep['gemm_seconds'])}; GEMM warm-up {rep['gemm_warmup']}")
        assert list(rep["phases"]) == ["model", "data_parallel", "agreement", "warmup", "steps", "compute", "checksum", "gemm"]
        assert rep["dynamo_imported"] is False  # torch._dynamo's import (3.3-3.7 s on an H200) stays out of the probe on CUDA too
    assert not workers_left(tmp_path)


def test_ranks_that_cannot_converge_train_as_many_steps_to_the_same_cap(tmp_path):
    # Every rank must take the same number of data-parallel steps (each all-reduces its
    # gradients): with a tolerance no timing meets, all run to the cap together.
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(launch.WORKERS_DIR / "train_probe.py"), "--out", str(out), "--backend", "gloo",
         "--device", "cpu", "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32", "--batch", "4", "--vocab", "64", "--steps", "4", "--max-steps", "7",
         "--compute-steps", "3", "--max-compute-steps", "14", "--gemm-n", "64", "--gemm-repeats", "5", "--max-gemm-repeats", "8", "--tolerance", "1e-9", "--max-seconds", "60"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    import json

    for rep in (json.loads((out / f"rank{n}.json").read_text()) for n in (0, 1)):
        assert (len(rep["step_seconds"]), len(rep["compute_seconds"]), len(rep["gemm_seconds"])) == (7, 14, 8)
        assert rep["stopped"] == {"steps": "max_repeats", "compute": "max_repeats", "gemm": "max_repeats"} and rep["tolerance"] == 1e-9
        assert len(rep["losses"]) == 7 and len(set(rep["param_checksums"])) == 1  # the ranks stayed in step


def test_a_rank_hung_in_train_on_the_group_the_nccl_stage_made_is_named_not_a_peer_that_waited(fast, tmp_path):
    # Issue 33: train runs on the process group the nccl stage made (one launch, two stages). Rank 1
    # stops in train's steps; ranks 0 and 2 wait for it within train's own deadline and say so, and
    # the verdict names rank 1, the one that stopped reporting, within the check's deadline.
    report = tmp_path / "report.json"
    (tmp_path / "tmp").mkdir()
    env = {**fast, "TMPDIR": str(tmp_path / "tmp"), "PREFLIGHT_WORKER_FAULT": "1:stop@steps"}
    p = run_preflight(["run", "--profile", "cpu-fast", "--only", "nccl,train", "--nproc-per-node", "3", "--report", str(report)], env=env, timeout=180)
    assert p.returncode == 1, p.stderr
    nccl, train = Report.model_validate_json(report.read_text()).checks
    assert nccl.status == "PASS" and train.status == "FAIL", (nccl.summary, train.summary)
    assert train.details["world"] == {"launch": 1, "stage": 2, "ended_it": True}
    assert train.summary == "rank 1 hung in steps (stage 3)", train.summary
    assert train.cause.startswith("rank 1 hung in steps (stage 3) and was stopped once it made no progress after another rank failed"), train.cause
    assert "rank 0 then failed in steps" in train.cause and "rank 2 then failed in steps" in train.cause
    assert train.duration_seconds < DEADLINE and not train.details["timed_out"]
    assert not workers_left(tmp_path)
