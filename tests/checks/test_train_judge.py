"""The train check's arithmetic and judges, on recorded facts: rank reports
built by hand (the shape checks/workers/train_probe.py writes: every timed
step's loss and seconds, each rank's own compute passes, its GEMM repeats, the
checksums), no processes."""

from __future__ import annotations

import pytest
from preflight.checks import train
from preflight.checkkit import train_figures
from preflight.checkkit.figures import Figure
from preflight.checkkit.train_figures import RankReport, TrainFacts

from preflight.checkkit import figures as figs_mod
from preflight.gpuwork import ranks
from preflight.base.findings import Status
from preflight.pipeline.profiles import ResolvedFloor
from preflight.pipeline.load_expectations import TrainExpect

FAIL, WARN = Status.FAIL, Status.WARN
FLOPS, SECONDS, RATIO = "flops_per_second", "seconds", "ratio"
PY = "/opt/venv/bin/python"
H100_PEAK = 989e12  # dense bf16 flop/s of one H100 SXM

# A GPT-2-small-like probe: 124M parameters, 12 layers of 768, 1024 tokens, 8 sequences per rank.
PARAMS, LAYERS, D, SEQ, BATCH = 124_000_000, 12, 768, 1024, 8
MODEL = {"layers": LAYERS, "d_model": D, "heads": 12, "seq": SEQ, "batch": BATCH, "vocab": 50304}
# 6 x 124,000,000 = 744,000,000 (weights) + 12 x 12 x 768 x 1024 = 113,246,208 (attention) = 857,246,208
FLOPS_PER_TOKEN = 857_246_208
GEMM_8192 = 1_099_511_627_776  # 2 x 8192^3 = 2 x 549,755,813,888


def floor(value: float, unit: str = FLOPS, bound: str = "min") -> ResolvedFloor:
    return ResolvedFloor(value=value, unit=unit, source="test src", bound=bound, origin="profile test")


def expect(**kw) -> TrainExpect:
    return TrainExpect(**{"sizes_source": "test", "straggler_source": "test", **kw})


H100 = {"peak_flops": H100_PEAK, "peak_source": "test datasheet"}


def report(rank: int, world: int = 8, stage: str = "done", backend: str = "nccl", **kw) -> RankReport:
    """A healthy rank: a falling loss, 500 ms steps, 400 ms of its own compute, 1.5 ms GEMMs, agreeing checksums."""
    base = dict(rank=rank, local_rank=rank, world_size=world, host="node1", pid=1000 + rank, python=PY, backend=backend,
                device="cuda" if backend == "nccl" else "cpu", torch_version="2.5.1",
                losses=[10.4, 9.8, 9.1], step_seconds=[0.5, 0.5, 0.5], compute_seconds=[0.40, 0.41, 0.42], gemm_seconds=[0.0015] * 3,
                params=PARAMS, tokens_per_step=BATCH * SEQ * world, model=dict(MODEL),
                logits_checksum="1234567", logits_checksums=["1234567"] * world, param_checksums=["7654321"] * world)
    return RankReport(**{**base, "stage": stage, **kw})


def outcome(rank: int, rep: RankReport | None, **kw) -> ranks.RankOutcome:
    kw.setdefault("gpu", f"GPU {rank}")
    kw.setdefault("last_line", f"rank {rank}: last line")
    return ranks.RankOutcome(rank=rank, report=rep, **kw)


def facts(outcomes: list[ranks.RankOutcome], **kw) -> TrainFacts:
    base = dict(python=PY, backend="nccl", nproc=len(outcomes), ended="exit 0", returncode=0, seconds=30.0)
    return TrainFacts(**{**base, "ranks": outcomes, **kw})


def per_rank(n: int = 8, backend: str = "nccl", each=lambda r: {}, **kw) -> TrainFacts:
    """``n`` healthy ranks, rank r's report changed by ``each(r)``."""
    gpu = (lambda r: f"GPU {r}") if backend == "nccl" else (lambda r: None)
    return facts([outcome(r, report(r, world=n, backend=backend, **each(r)), gpu=gpu(r)) for r in range(n)], backend=backend, **kw)


def by(figs: list[Figure], name: str) -> list[Figure]:
    """Figures judged against the floor ``name`` (the step p50 is "train_step_duration", its max "train_step_duration_max")."""
    return [g for g in figs if g.key == name]


def one(figs: list[Figure], name: str) -> Figure:
    (g,) = by(figs, name)
    return g


# --- arithmetic ----------------------------------------------------------------------------


def test_flops_per_token_is_six_n_plus_the_attention_term():
    assert train_figures.flops_per_token(PARAMS, LAYERS, D, SEQ) == FLOPS_PER_TOKEN


def test_flops_per_token_of_a_tiny_model():
    # 6 x 1000 + 12 x 2 x 64 x 128 = 6000 + 196,608
    assert train_figures.flops_per_token(1000, 2, 64, 128) == 202_608


def test_gemm_flops_counts_a_multiply_and_an_add_per_term():
    assert train_figures.gemm_flops(8192) == GEMM_8192
    assert train_figures.gemm_flops(8192) == pytest.approx(1.0995e12, rel=1e-4)
    assert train_figures.gemm_flops(2) == 16.0


def test_straggler_is_the_slowest_rank_over_the_median_of_its_peers():
    assert train_figures.straggler({0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0}) == (3, 2.0)
    assert train_figures.straggler({0: 0.4, 1: 0.5, 2: 0.6}) == (2, pytest.approx(0.6 / 0.45))


def test_a_straggler_among_two_ranks_is_judged_against_the_other():
    # Against its peer, not the mean of both: a rank twice as slow reads 2, not 4/3.
    assert train_figures.straggler({0: 1.0, 1: 2.0}) == (1, pytest.approx(2.0))


def test_equal_ranks_have_no_straggler():
    assert train_figures.straggler({r: 0.4 for r in range(8)})[1] == 1.0


# --- figures ---------------------------------------------------------------------------------


def test_mfu_is_the_achieved_flops_over_every_gpus_peak():
    figs = train_figures.figures(per_rank(8), expect(**H100))
    # 8 ranks x 8 sequences x 1024 tokens = 65,536 tokens a step; 0.5 s a step -> 131,072 tokens/s
    assert one(figs, "train_tokens_throughput").value == 131_072
    # 857,246,208 flop/token x 131,072 tokens/s = 112,360,974,974,976 flop/s
    achieved = one(figs, "train_model_throughput")
    assert achieved.value == 112_360_974_974_976 and achieved.unit == FLOPS
    # over 8 x 989e12 = 7.912e15 -> 0.0142013...
    mfu = one(figs, "train_mfu")
    assert mfu.value == pytest.approx(112_360_974_974_976 / 7.912e15, rel=1e-9)
    assert mfu.value == pytest.approx(0.014201336574, rel=1e-9)
    assert (mfu.unit, mfu.where) == (RATIO, "8 ranks")


def test_gemm_figure_per_gpu_is_the_median_repeat_with_its_uuid():
    f = per_rank(2, each=lambda r: {"gemm_seconds": [0.0012, 0.0011, 0.0020]} if r == 1 else {}, uuids={0: "GPU-aaaa", 1: "GPU-bbbb"})
    g0, g1 = by(train_figures.figures(f, expect()), "gemm_throughput")
    assert g1.value == pytest.approx(GEMM_8192 / 0.0012)
    assert (g1.where, g1.labels, g1.repeats, g1.rank, g1.unit) == ("rank 1 (GPU 1)", {"gpu": "1", "UUID": "GPU-bbbb"}, 3, 1, FLOPS)
    assert g0.labels == {"gpu": "0", "UUID": "GPU-aaaa"} and g0.value == pytest.approx(GEMM_8192 / 0.0015)


def test_gemm_uses_the_profiles_matrix_size():
    f = per_rank(1, each=lambda r: {"gemm_seconds": [0.5]})
    assert one(train_figures.figures(f, expect(gemm_n=1024)), "gemm_throughput").value == pytest.approx(2 * 1024**3 / 0.5)


def test_a_gpu_masked_by_cuda_visible_devices_is_labelled_by_nvidia_smis_index():
    f = facts([outcome(0, report(0, world=1), gpu="GPU 3")], uuids={3: "GPU-3f2a", 0: "GPU-0000"})
    g = one(train_figures.figures(f, expect()), "gemm_throughput")
    assert g.labels == {"gpu": "3", "UUID": "GPU-3f2a"} and g.where == "rank 0 (GPU 3)"


def test_a_gpu_without_a_known_uuid_has_only_its_index():
    assert one(train_figures.figures(per_rank(1), expect()), "gemm_throughput").labels == {"gpu": "0"}


def test_gloo_gemm_figures_are_labelled_by_rank():
    figs = by(train_figures.figures(per_rank(2, backend="gloo"), expect()), "gemm_throughput")
    assert [(g.where, g.labels) for g in figs] == [("rank 0", {"rank": "0"}), ("rank 1", {"rank": "1"})]


def test_step_time_is_the_slowest_ranks_median_step():
    steps = {2: [0.55, 0.70, 0.60], 5: [0.52, 0.51, 0.90]}  # medians 0.60 and 0.52; the 0.90 outlier does not count
    g = one(train_figures.figures(per_rank(8, each=lambda r: {"step_seconds": steps.get(r, [0.5] * 3)}), expect()), "train_step_duration")
    assert g.value == pytest.approx(0.60) and g.rank == 2 and g.unit == SECONDS
    assert g.where == "slowest of 8 ranks: rank 2 (GPU 2)" and g.repeats == 3 and g.labels == {"stat": "p50"}
    longest = one(train_figures.figures(per_rank(8, each=lambda r: {"step_seconds": steps.get(r, [0.5] * 3)}), expect()), "train_step_duration_max")
    assert longest.value == 0.90 and longest.rank == 5 and longest.name == "train_step_duration" and longest.labels == {"stat": "max"}


def test_throughput_is_measured_at_the_slowest_ranks_step():
    f = per_rank(8, each=lambda r: {"step_seconds": [0.8] * 3} if r == 4 else {})
    assert one(train_figures.figures(f, expect()), "train_tokens_throughput").value == pytest.approx(65_536 / 0.8)


def test_a_rank_that_died_before_its_steps_gives_no_step_figures():
    f = per_rank(8, each=lambda r: {"step_seconds": [], "losses": [], "stage": "warmup"} if r == 7 else {})
    names = {g.name for g in train_figures.figures(f, expect(**H100))}
    assert not names & {"train_step_duration", "train_tokens_throughput", "train_model_throughput", "train_mfu"}
    assert "gemm_throughput" in names  # the other ranks' GEMMs still count


def test_a_rank_without_a_report_gives_no_step_or_straggler_figure():
    f = per_rank(4)
    f.ranks[3] = outcome(3, None, unreadable="no rank3.json")
    names = [g.name for g in train_figures.figures(f, expect(**H100))]
    # Per GPU, the other ranks' GEMMs and own compute times still count (judged against their median).
    assert names == ["gemm_throughput"] * 3 + ["train_compute_duration"] * 3


def test_straggler_takes_each_ranks_fastest_compute_pass():
    # rank 2 was interrupted once (a real GPU is slow every time); rank 5 is slow every pass.
    compute = {2: [0.90, 0.40, 0.41], 5: [0.60, 0.61, 0.62]}
    f = per_rank(8, each=lambda r: {"compute_seconds": compute.get(r, [0.40, 0.41, 0.42])})
    g = one(train_figures.figures(f, expect()), "train_straggler_ratio")
    assert g.value == pytest.approx(0.60 / 0.40) and g.rank == 5 and g.where == "rank 5 (GPU 5)"


def test_one_rank_has_no_straggler_figure():
    assert by(train_figures.figures(per_rank(1), expect()), "train_straggler_ratio") == []


def test_no_straggler_figure_when_a_rank_has_no_compute_pass():
    f = per_rank(4, each=lambda r: {"compute_seconds": []} if r == 0 else {})
    assert by(train_figures.figures(f, expect()), "train_straggler_ratio") == []


def test_no_mfu_without_the_gpus_peak():
    names = {g.name for g in train_figures.figures(per_rank(2, backend="gloo"), expect())}
    assert "train_mfu" not in names
    assert {"train_tokens_throughput", "train_model_throughput", "train_step_duration"} <= names


def test_no_throughput_without_a_parameter_count():
    names = {g.name for g in train_figures.figures(per_rank(2, each=lambda r: {"params": None}), expect(**H100))}
    assert "train_step_duration" in names and not names & {"train_tokens_throughput", "train_model_throughput", "train_mfu"}


# --- judge_loss ---------------------------------------------------------------------------------


def test_a_nan_on_one_rank_fails_naming_it_before_the_ranks_the_all_reduce_spread_it_to():
    def nan(r):
        if r == 1:  # not finite from step 3 (index 2)
            return {"losses": [10.4, 10.1, "nan", "nan"], "nonfinite_step": 2}
        return {"losses": [10.4, 10.1, 9.9, "nan"], "nonfinite_step": 3}

    (x,) = train.judge_loss(per_rank(4, each=nan))
    assert x.status is FAIL and x.summary == "loss is not finite on rank 1 (GPU 1)"
    assert x.cause == ("the loss is not finite on rank 1 (GPU 1) at step 3; then on rank 0 (GPU 0), rank 2 (GPU 2), rank 3 (GPU 3) "
                       "(the all-reduce spread it)")
    assert "dcgmi diag -r 3" in x.remedy


def test_a_nan_on_a_single_rank_says_nothing_of_spreading():
    (x,) = train.judge_loss(per_rank(2, each=lambda r: {"losses": [10.4, "inf"], "nonfinite_step": 1} if r == 0 else {}))
    assert x.summary == "loss is not finite on rank 0 (GPU 0)"
    assert x.cause == "the loss is not finite on rank 0 (GPU 0) at step 2"


def test_a_loss_that_does_not_fall_fails_naming_the_rank():
    (x,) = train.judge_loss(per_rank(4, each=lambda r: {"losses": [10.0, 10.1, 10.2]} if r == 2 else {}))
    assert x.status is FAIL and x.summary == "loss does not fall on rank 2 (GPU 2)"
    assert "loss 10.0000 before training and 10.2000 at the last step" in x.cause


def test_the_reference_is_the_loss_before_any_update_not_the_first_timed_step():
    # Adam's early steps are not monotone: a trough at the first timed step and a spike at
    # the last are healthy as long as the end is under where training began.
    healthy = per_rank(2, each=lambda r: {"initial_loss": 10.4, "losses": [8.2, 10.8, 9.1]})
    assert train.judge_loss(healthy) == []
    (x,) = train.judge_loss(per_rank(2, each=lambda r: {"initial_loss": 10.4, "losses": [8.2, 9.0, 10.5]} if r == 1 else {"initial_loss": 10.4}))
    assert "loss 10.4000 before training and 10.5000 at the last step" in x.cause


def test_a_flat_loss_does_not_fall():
    (x,) = train.judge_loss(per_rank(2, backend="gloo", each=lambda r: {"losses": [10.4, 10.4]} if r == 1 else {}))
    assert x.summary == "loss does not fall on rank 1"


def test_a_falling_loss_is_nothing():
    assert train.judge_loss(per_rank(8)) == []


def test_ranks_without_losses_are_not_judged_for_loss():
    f = per_rank(2, each=lambda r: {"losses": [], "stage": "warmup"} if r == 1 else {})
    assert train.judge_loss(f) == []


# --- judge_agreement ------------------------------------------------------------------------------


def test_one_gpu_with_different_logits_fails_as_silent_data_corruption():
    (x,) = train.judge_agreement(per_rank(8, each=lambda r: {"logits_checksum": "9999999"} if r == 3 else {}))
    assert x.status is FAIL and x.summary == "GPU 3 computes different results"
    assert "different logits on rank 3 (GPU 3) than on the other ranks (bit checksums 9999999)" in x.cause
    assert "silent data corruption" in x.cause and "drain the node" in x.remedy


def test_a_cpu_rank_with_different_logits_is_named_by_rank():
    (x,) = train.judge_agreement(per_rank(3, backend="gloo", each=lambda r: {"logits_checksum": "1"} if r == 2 else {}))
    assert x.summary == "rank 2 computes different results"


def test_two_ranks_that_disagree_with_no_majority_are_both_named():
    (x,) = train.judge_agreement(per_rank(2, each=lambda r: {"logits_checksum": str(100 + r)}))
    assert x.status is FAIL and x.summary == "ranks disagree on the same forward pass: GPU 0, GPU 1"
    assert "rank 0 (GPU 0), rank 1 (GPU 1)" in x.cause and "no majority agrees" in x.cause


def test_an_even_split_names_every_rank():
    (x,) = train.judge_agreement(per_rank(4, each=lambda r: {"logits_checksum": "a" if r < 2 else "b"}))
    assert "rank 0 (GPU 0), rank 1 (GPU 1), rank 2 (GPU 2), rank 3 (GPU 3)" in x.cause


def test_parameters_that_differ_on_one_rank_fail_naming_it():
    sums = ["7654321"] * 8
    sums[5] = "7654322"
    (x,) = train.judge_agreement(per_rank(8, each=lambda r: {"param_checksums": list(sums)}))
    assert x.status is FAIL and x.summary == "parameters diverged after all-reduce"
    assert "rank 5 (GPU 5) hold parameters that differ" in x.cause and "7654322" in x.cause
    assert "rank 4" not in x.cause


def test_a_short_gathered_list_is_passed_over_for_a_whole_one():
    sums = ["s"] * 4
    sums[2] = "t"
    (x,) = train.judge_agreement(per_rank(4, each=lambda r: {"param_checksums": ["s"] if r == 0 else list(sums)}))
    assert "rank 2 (GPU 2)" in x.cause


def test_ranks_that_agree_are_nothing():
    assert train.judge_agreement(per_rank(8)) == []


def test_a_rank_that_never_checksummed_is_not_a_disagreement():
    f = per_rank(3, each=lambda r: {"logits_checksum": None, "param_checksums": None} if r == 2 else {})
    assert train.judge_agreement(f) == []


# --- judge_speed -----------------------------------------------------------------------------------


def test_a_straggler_over_the_allowed_ratio_fails_naming_its_rank_and_gpu():
    f = per_rank(8, each=lambda r: {"compute_seconds": [0.6, 0.6, 0.6]} if r == 6 else {})
    (x,) = train.judge_straggler(train_figures.figures(f, expect()), expect())
    assert x.status is FAIL and x.summary == "straggler: rank 6 (GPU 6) takes 1.50x as long as its peers"
    assert "rank 6 (GPU 6)'s own forward+backward takes 1.50x the median of the other ranks', over the 1.15x allowed (test)" in x.cause
    assert "nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE" in x.remedy


def test_a_straggler_at_the_allowed_ratio_passes():
    g = Figure(name="train_straggler_ratio", unit=RATIO, value=1.15, where="rank 1 (GPU 1)", rank=1)
    assert train.judge_speed([g], expect(), {}) == []


def test_a_gemm_below_its_floor_fails_naming_the_rank_and_gpu():
    f = per_rank(8, each=lambda r: {"gemm_seconds": [0.004] * 3} if r == 4 else {})
    (x,) = train.judge_speed(train_figures.figures(f, expect()), expect(), {"gemm_throughput": floor(600e12)})
    assert x.status is FAIL
    # 2 x 8192^3 / 4 ms = 274.9 TFLOP/s
    assert x.summary == "GEMM throughput below floor on rank 4 (GPU 4) (274.9 TFLOP/s, floor 600.0 TFLOP/s)"
    assert "on 1 of 8: rank 4 (GPU 4): 274.9 TFLOP/s" in x.cause and "(test src; profile test)" in x.cause
    assert "dcgmi diag -r 3" in x.remedy and "preflight run --only train" in x.remedy


def test_mfu_below_its_floor_fails():
    (x,) = train.judge_speed(train_figures.figures(per_rank(8), expect(**H100)), expect(**H100), {"train_mfu": floor(0.4, RATIO)})
    assert x.status is FAIL and x.summary == "model FLOPs utilization below floor on 8 ranks (0.0142, floor 0.4)"
    assert "host loop starved" in x.remedy


def test_mfu_within_the_margin_above_its_floor_warns():
    figs = train_figures.figures(per_rank(8), expect(**H100))
    mfu = one(figs, "train_mfu").value
    (x,) = train.judge_speed(figs, expect(**H100), {"train_mfu": floor(mfu / 1.03, RATIO)})
    assert x.status is WARN and x.summary.startswith("model FLOPs utilization marginal on 8 ranks")
    assert "within 5% of its" in x.cause


def test_mfu_clear_of_the_margin_passes():
    figs = train_figures.figures(per_rank(8), expect(**H100))
    assert train.judge_speed(figs, expect(**H100), {"train_mfu": floor(one(figs, "train_mfu").value / 1.06, RATIO)}) == []


def test_a_step_over_its_ceiling_fails_naming_the_slowest_rank():
    f = per_rank(8, each=lambda r: {"step_seconds": [0.6] * 3} if r == 2 else {})
    (x,) = train.judge_speed(train_figures.figures(f, expect()), expect(), {"train_step_duration": floor(0.45, SECONDS, "max")})
    assert x.status is FAIL and x.summary == "training step time p50 over ceiling on slowest of 8 ranks: rank 2 (GPU 2) (600 ms, ceiling 450 ms)"


def test_a_healthy_node_meets_every_floor():
    floors = {"gemm_throughput": floor(600e12), "train_mfu": floor(0.01, RATIO), "train_step_duration": floor(1.0, SECONDS, "max"),
              "train_tokens_throughput": floor(100_000, "tokens_per_second")}
    assert train.judge_speed(train_figures.figures(per_rank(8), expect(**H100)), expect(**H100), floors) == []


# --- judge_setup ---------------------------------------------------------------------------------------


def test_a_shrunk_model_warns_with_what_was_shrunk():
    text = "8 x 12 layers asked, 2 x 12 layers used: 9.5 GiB free on cuda:1"
    (x,) = train.judge_setup(per_rank(2, each=lambda r: {"shrunk": text} if r == 1 else {}))
    assert x.status is WARN and x.summary == "probe model shrunk to fit free memory"
    assert text in x.cause and "smaller model" in x.cause and "nvidia-smi" in x.remedy


def test_the_same_shrink_on_every_rank_is_said_once():
    text = "8 x 12 layers asked, 4 x 12 layers used: 20.0 GiB free on cuda:0"
    (x,) = train.judge_setup(per_rank(4, each=lambda r: {"shrunk": text}))
    assert x.cause.count(text) == 1


def test_a_model_that_fit_has_no_setup_finding():
    assert train.judge_setup(per_rank(8)) == []


# --- judge: the run part ---------------------------------------------------------------------------------


def test_a_rank_killed_in_the_steps_fails_the_run_naming_it():
    dead = outcome(1, report(1, world=2, stage="steps", losses=[10.4], step_seconds=[0.5], compute_seconds=[], gemm_seconds=[],
                             param_checksums=None), exit="killed by SIGKILL")
    waiting = outcome(0, report(0, world=2, stage="steps", losses=[10.4], step_seconds=[0.5], compute_seconds=[], gemm_seconds=[], param_checksums=None,
                                error="RuntimeError: NCCL watchdog timeout", error_time=50.0), exit="exit 1")
    f = facts([waiting, dead], ended="exit 1", returncode=1, root_cause=1)
    parts = train.judge(f, train_figures.figures(f, expect()), expect(), {})
    (x,) = parts["run"]
    assert x.status is FAIL and x.summary.startswith("rank 1 (GPU 1) died in steps")
    assert x.summary.endswith("(killed by SIGKILL)")
    assert "rank 0 (GPU 0) then failed in steps" in x.cause and "NCCL watchdog timeout" in x.cause
    assert "--nproc-per-node 2" in x.remedy and x.remedy.endswith("train_probe.py")


def test_a_launch_error_says_the_training_probe_could_not_start():
    f = facts([], nproc=8, ended=None, returncode=None, launch_error=("/opt/venv/bin/python could not be started: No such file or directory", ranks.TORCH))
    (x,) = train.judge(f, [], expect(), {})["run"]
    assert x.status is FAIL and x.summary == "the training probe could not start"
    assert "No such file" in x.cause


def test_a_healthy_run_has_no_finding_in_any_part():
    f = per_rank(8)
    floors = {"gemm_throughput": floor(600e12)}
    assert train.judge(f, train_figures.figures(f, expect(**H100)), expect(**H100), floors) == {"run": [], "loss": [], "agreement": [], "speed": [], "straggler": [], "setup": []}


def test_the_rerun_hint_on_gloo_names_the_cpu_flags():
    f = per_rank(2, backend="gloo")
    assert ranks.by_hand(f, "train_probe.py").endswith("train_probe.py --backend gloo --device cpu")


def test_progress_is_the_stage_reached():
    assert report(0, stage="agreement").progress() == 0
    assert report(0, stage="steps").progress() == 2
    assert report(0, stage="gemm").progress() == 5
    assert report(0, stage="init").progress() == 0


def test_a_report_keeps_a_nan_loss_as_text():
    rep = RankReport.model_validate(report(0).model_dump() | {"losses": [10, 9.5, "nan"]})
    assert rep.losses == [10.0, 9.5, "nan"] and isinstance(rep.losses[0], float)


# --- measurements, lines, summary ---------------------------------------------------------------------------


def test_gemm_measurements_carry_the_floor_and_the_gpu_labels():
    f = per_rank(2, uuids={0: "GPU-a", 1: "GPU-b"})
    ms = figs_mod.measurements(train_figures.figures(f, expect()), {"gemm_throughput": floor(600e12)})
    gemm = [m for m in ms if m.name == "gemm_throughput"]
    assert [(m.labels, m.floor, m.unit) for m in gemm] == [({"gpu": "0", "UUID": "GPU-a"}, 600e12, FLOPS), ({"gpu": "1", "UUID": "GPU-b"}, 600e12, FLOPS)]


def test_lines_use_the_checks_words():
    f = per_rank(8, each=lambda r: {"gemm_seconds": [0.004] * 3} if r == 4 else {})
    text = figs_mod.lines(train_figures.figures(f, expect(**H100)), {"gemm_throughput": floor(600e12)}, train_figures.WORDS)
    gemm = next(x for x in text if x.startswith("GEMM throughput"))
    assert "274.9 TFLOP/s (min of 8: rank 4 (GPU 4);" in gemm and "floor 600.0 TFLOP/s" in gemm
    assert any(x.startswith("model FLOPs utilization") and x.endswith("no floor") for x in text)


def test_summary_says_size_loss_agreement_step_mfu_gemm_and_straggler():
    f = per_rank(8, each=lambda r: {"compute_seconds": [0.42] * 3} if r == 6 else {})
    text = train.summary(f, train_figures.figures(f, expect(**H100)))
    # 0.42 / median(0.40 x 7, 0.42) = 1.05; 2 x 8192^3 / 1.5 ms = 733.0 TFLOP/s
    assert text == "8 nccl rank(s), 124.0M-parameter GPT, loss 10.400 -> 9.100, ranks agree, step 500 ms, MFU 1.4%, GEMM min 733.0 TFLOP/s, straggler 1.05x"


def test_summary_without_a_peak_leaves_out_mfu():
    text = train.summary(per_rank(2, backend="gloo"), train_figures.figures(per_rank(2, backend="gloo"), expect()))
    assert text.startswith("2 gloo rank(s), 124.0M-parameter GPT, loss 10.400 -> 9.100, ranks agree, step 500 ms, GEMM min")
    assert "MFU" not in text


def test_summary_of_a_run_without_reports_says_only_the_ranks():
    f = facts([outcome(0, None), outcome(1, None)])
    assert train.summary(f, []) == "2 nccl rank(s)"


def test_the_summary_gives_the_step_p50_and_the_loss_from_before_training():
    f = per_rank(2, backend="gloo", each=lambda r: {"step_seconds": [0.030, 0.033, 0.090], "initial_loss": 5.5, "losses": [5.2, 5.1, 5.0]})
    text = train.summary(f, train_figures.figures(f, expect()))
    assert "step 33 ms" in text and "90 ms" not in text
    assert "loss 5.500 -> 5.000, ranks agree" in text


# --- how sure each figure is ---------------------------------------------------------------------

QUIET = [0.500, 0.501, 0.499, 0.500, 0.500, 0.502, 0.500, 0.499, 0.500, 0.500]  # x(2)..x(9) within 0.4%
NOISY = [0.60, 0.72, 0.48, 0.66, 0.54, 0.60, 0.72, 0.48, 0.60, 0.66] * 3  # stopped at 30: +-10% around 0.6
SURE = {"tolerance": 0.02}


def test_step_figures_are_as_sure_as_the_slowest_ranks_median_step():
    f = per_rank(2, each=lambda r: {"step_seconds": NOISY if r == 1 else QUIET, "stopped": {"steps": "max_repeats"}, **SURE})
    figs = train_figures.figures(f, expect(**H100))
    step = one(figs, "train_step_duration")
    assert step.rank == 1 and step.repeats == 30 and step.ci == pytest.approx(0.1) and step.converged is False and step.stopped == "max_repeats"
    for name in ("train_tokens_throughput", "train_model_throughput", "train_mfu"):  # all of them divide by that step
        g = one(figs, name)
        assert (g.ci, g.converged, g.repeats) == (step.ci, False, 30), name
    assert one(figs, "train_step_duration_max").converged is None  # a maximum has no such interval


def test_a_gemm_below_its_floor_that_did_not_converge_fails_saying_so():
    gemm = {1: [s * 0.002 / 0.6 for s in NOISY]}  # rank 1: a 2 ms median, known to +-10%
    f = per_rank(2, each=lambda r: {"gemm_seconds": gemm.get(r, [0.0015] * 10), "stopped": {"gemm": "max_seconds" if r else "converged"}, **SURE})
    figs = train_figures.figures(f, expect(**H100))
    (x,) = train.judge_speed(figs, expect(**H100), {"gemm_throughput": floor(600e12)})
    assert x.status is FAIL and x.summary.startswith("GEMM throughput below floor on rank 1 (GPU 1) (549.8 TFLOP/s")
    assert "rank 1 (GPU 1): 549.8 TFLOP/s (not converged within +-2%: known to +-10.0% after 30 repeats, at its cap of seconds)" in x.cause
    assert "rank 0" not in x.cause


def test_a_passing_probe_with_an_unconverged_figure_passes_and_notes_it():
    quiet = {"gemm_seconds": [0.0015] * 10, "compute_seconds": [0.4] * 20}
    f = per_rank(2, each=lambda r: {"step_seconds": NOISY if r == 1 else QUIET, "losses": [10.4] + [9.0] * 29, "stopped": {"steps": "max_repeats"}, **quiet, **SURE})
    figs = train_figures.figures(f, expect(**H100))
    parts = train.judge(f, figs, expect(**H100), {})
    assert all(found == [] for found in parts.values()), parts
    text = train.summary(f, figs)
    assert text.endswith("; not converged within +-2% at the cap: training step time p50 (+-10%), training throughput (+-10%), model FLOP/s (+-10%) and 1 more")
    line = next(x for x in figs_mod.lines(figs, {}, train_figures.WORDS) if x.startswith("training step time p50"))
    assert "+-10.0% (95%) 30 repeats  not converged within +-2%, at its cap of repeats  no floor" in line


def test_the_straggler_ratio_is_as_sure_as_both_of_its_quartiles():
    # 20 passes each: the first quartile (the 5th fastest) within x(2)..x(10).
    fast = [0.40 + 0.001 * i for i in range(20)]  # quartile 0.404, interval 0.401..0.409: +-1.24%
    slow = [0.60 + 0.030 * i for i in range(20)]  # quartile 0.72, interval 0.63..0.87: +-20.8%
    f = per_rank(2, each=lambda r: {"compute_seconds": slow if r else fast, "stopped": {"compute": "max_repeats"}, **SURE})
    g = one(train_figures.figures(f, expect()), "train_straggler_ratio")
    a, b = 0.87 / 0.72 - 1, 0.409 / 0.404 - 1
    assert g.value == pytest.approx(0.72 / 0.404) and g.ci == pytest.approx((1 + a) / (1 - b) - 1) and g.converged is False and g.repeats == 20


def test_three_compute_passes_give_no_interval_for_the_quartile():
    g = one(train_figures.figures(per_rank(2, each=lambda r: {"stopped": {"compute": "max_repeats"}, **SURE}), expect()), "train_straggler_ratio")
    assert g.ci is None and g.converged is False
    assert figs_mod.unsure_text(g) == " (not converged within +-2%: 3 repeats give no 95% interval, at its cap of repeats)"
