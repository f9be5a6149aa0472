"""The time model (tests/perf/time_model.py): its table in docs/ARCHITECTURE.md is
what it prints, the 8-GPU projection stays within issue 34's 45 s, its costs are
what the H200 run's reports say, and the profiles' standard estimates come from it.
Pure: no run, no timing."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "perf"))
import time_model as tm  # noqa: E402

BOARDS = ("h200-sxm", "h100-sxm")  # the NVSwitch boards the model projects (P2P, ring and latency floors, a train probe)


def test_the_table_in_architecture_is_what_the_model_prints():
    c, report, profile = tm.model()
    text = tm.DOC.read_text()
    assert text.count(tm.BEGIN) == 1 and text.count(tm.END) == 1
    block = text[text.index(tm.BEGIN):text.index(tm.END) + len(tm.END)]
    assert block == tm.doc_block(c, report, profile), "docs/ARCHITECTURE.md's time model table drifted: python tests/perf/time_model.py --write"


@pytest.mark.parametrize("board", BOARDS)
def test_the_8_gpu_projection_is_within_45_s_and_each_gpu_count_adds_time(board):
    c, _, _ = tm.model()
    profile = tm.profiles.load(tm.profiles.find(board, None))
    totals = [tm.total(tm.project(n, c, profile)) for n in tm.GPUS]
    assert totals[-1] <= tm.GOAL_8_GPUS, totals
    assert totals == sorted(totals)


def test_a_plan_that_copies_more_moves_the_projection_past_45_s():
    """The goal bites: 20x the P2P bytes (every ordered pair's copies) is past it."""
    c, _, profile = tm.model()
    bigger = profile.model_copy(update={"bandwidth": profile.bandwidth.model_copy(update={"p2p_bytes": 20 * profile.bandwidth.p2p_bytes})})
    assert tm.total(tm.project(8, c, profile)) <= tm.GOAL_8_GPUS < tm.total(tm.project(8, c, bigger))


def test_the_pairs_and_contexts_follow_the_plan():
    rows = {n: dict(tm.project(n, tm.model()[0], tm.model()[2])) for n in (1, 8)}
    c = tm.model()[0]
    assert "  p2p: contexts from rank 0" not in rows[1]  # one GPU has no peer: steps_for leaves p2p out
    assert rows[8]["  p2p: contexts from rank 0"] == pytest.approx(7 * c["cuda_context"].seconds)
    assert tm.p2p_plan(8) == (7, 56)


def test_the_costs_are_what_the_h200_reports_say():
    # Call 4 of tests/fixtures/time_model/h200-1x-vm-2026-11-28 (4-standard.json, 4-verdict.json).
    c = tm.reports_costs()
    # cuda's launch 7.274 s = torchrun 3.633 + import 3.103 + init 0.032 + stage 0.507
    assert c["torchrun_overhead"].seconds == pytest.approx(7.2742 - 3.1027 - 0.032 - 0.507)
    assert c["torch_import"].seconds == 3.1027 and c["nccl_init_1"].seconds == 0.2878
    # d2h 0.151 s = 13 copies of 9.71 ms (3 warm-up, 10 timed) + a turn's 0.025 s
    assert c["turn_overhead"].seconds == pytest.approx(0.151 - 13 * 0.009714352, abs=1e-4)
    # h2d 0.5465 s = 13 copies of 9.70 ms + a turn + the pinned buffers' 0.396 s
    assert c["pinned_alloc"].seconds == pytest.approx(0.3957, abs=2e-3)
    # The run's 14.818 s less its checks' 14.546 s: the plan with its one NVML inventory (begun by the
    # CLI first, so mostly waited for already), the launch's end, the report.
    assert c["run_overhead"].seconds == pytest.approx(0.2727, abs=1e-3)
    assert c["bare_torchrun_1"].seconds == pytest.approx((9.132 + 8.734) / 2)
    # The probe builds no DDP (its own data parallelism: checks/workers/_dataparallel.py): no `ddp` phase.
    # Of its 5.62 s the timed phases took about 3.2 s: about 2.4 s is fixed (model, agreement, checksums).
    assert c["ddp_construct"].seconds == 0.0
    assert 2.2 < c["train_fixed"].seconds < 2.6
    assert all(v.how in ("report", "public") and v.source for v in c.values())


def test_a_cost_measured_on_cpu_keeps_the_larger_one_measured_on_a_gpu_replaces_it():
    report = {"torch_import": tm.Cost(4.0, "r", "report"), "topology": tm.Cost(0.7, "r", "report")}
    measured = {"torch_import": tm.Cost(2.0, "m", "measured"), "agent_start": tm.Cost(0.5, "m", "measured")}
    on_cpu = tm.merge(report, measured, gpu=False)
    assert on_cpu["torch_import"].seconds == 4.0 and on_cpu["agent_start"].seconds == 0.5 and on_cpu["topology"].how == "report"
    assert tm.merge(report, measured, gpu=True)["torch_import"].seconds == 2.0


@pytest.mark.parametrize("board", BOARDS)
def test_the_profiles_standard_estimate_is_the_models_8_gpu_projection(board):
    c, _, _ = tm.model()
    profile = tm.profiles.load(tm.profiles.find(board, None))
    standard = profile.levels.standard
    assert standard.seconds == math.ceil(tm.total(tm.project(8, c, profile))), f"set [levels.standard] seconds of {board} from the model's 8-GPU projection"
    assert standard.source.startswith("the time model (tests/perf/time_model.py") and f"{tm.total(tm.project(8, c, profile)):.1f} s on 8 GPUs" in standard.source
    assert profile.levels.quick.source.startswith("measured: ")


@pytest.mark.gpu
def test_the_benchs_gpu_probe_measures_a_context_pinned_buffers_and_copies_on_this_gpu():
    """On the lent GPU machine: bench_time_model's probe of one GPU (its figures printed for the
    note), the same costs the H200 report gives, on the same scale."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        pytest.skip("no NVIDIA driver here")
    import bench_time_model as bench

    bw = tm.profiles.load(tm.profiles.find("h200-sxm", None)).bandwidth
    p = subprocess.run([sys.executable, "-c", bench.GPU_PROBE, str(bw.host_bytes), str(bw.copy_bytes)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    print(got)
    assert {"cuda_context", "pinned_alloc", "h2d_copy", "d2h_copy", "hbm_copy_step"} <= set(got)
    assert all(v > 0 for v in got.values())
    # A GiB over any PCIe link a GPU node has (Gen3 x16 and up) takes well under a second.
    assert got["h2d_copy"] < 1 and got["d2h_copy"] < 1


def test_a_bandwidth_step_the_model_does_not_know_is_refused_not_left_out(monkeypatch):
    c, _, profile = tm.model()
    monkeypatch.setattr(tm, "steps_for", lambda *a, **k: ["hbm_copy", "nvlink_sweep"])
    with pytest.raises(ValueError, match="no cost for the bandwidth step 'nvlink_sweep'"):
        tm.project(8, c, profile)
