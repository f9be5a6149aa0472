"""The straggler on a healthy but loaded machine: the train check's own figures
and judge, the cpu profile as shipped, and each rank's compute passes as the
probe recorded them with two CPU hogs on this 2-vCPU VM
(tests/fixtures/train/SOURCE.md). The runs with the hogs are in
tests/perf/bench_cpu_under_load.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from preflight.checks import train
from preflight.checkkit import train_figures
from preflight.checkkit.train_figures import RankReport, TrainFacts

from preflight.pipeline import profiles
from preflight.gpuwork import ranks

LOADED = json.loads((Path(__file__).parents[1] / "fixtures" / "train" / "cpu-compute-passes-loaded.json").read_text())
CPU = profiles.load(profiles.find("cpu", None)).train


def straggler_of(passes: dict[str, list[float]], expect=CPU):
    reps = [RankReport(rank=int(r), local_rank=int(r), world_size=len(passes), host="ci", pid=1, python="py", backend="gloo", device="cpu", stage="done", compute_seconds=s[: expect.compute_steps])
            for r, s in passes.items()]  # fmt: skip
    f = TrainFacts(python="py", backend="gloo", nproc=len(reps), ranks=[ranks.RankOutcome(rank=r.rank, gpu=None, report=r) for r in reps])
    figs = train_figures.figures(f, expect)
    return next(g for g in figs if g.key == "train_straggler_ratio"), train.judge_straggler(figs, expect)


@pytest.mark.parametrize("run", range(len(LOADED)))
def test_a_healthy_rank_on_a_loaded_machine_is_no_straggler(run):
    ratio, found = straggler_of(LOADED[run])
    assert found == [] and ratio.value < 1.25, (ratio, found)


def test_the_recorded_lucky_pass_made_a_straggler_of_a_healthy_rank_by_its_fastest_pass():
    # Run 5: rank 1 timed 18 and 14 ms once rank 0 had finished; rank 0 never went under 39 ms.
    passes = LOADED[4]
    fastest = {r: min(s) for r, s in passes.items()}
    assert fastest["0"] / fastest["1"] > CPU.straggler_max  # what the check said before: FAIL
    fifth = {r: sorted(s)[4] for r, s in passes.items()}  # the first quartile of 20, nearest rank
    ratio, found = straggler_of(passes)
    assert ratio.value == pytest.approx(max(fifth.values()) / min(fifth.values())) and ratio.value < 1.2 and found == []


def test_a_rank_slow_on_every_pass_is_still_a_straggler_under_load():
    # The slow fault's shape: every pass of rank 1 four times its own length, on the same loaded machine.
    passes = {"0": LOADED[4]["0"], "1": [4 * s for s in LOADED[4]["1"]]}
    ratio, found = straggler_of(passes)
    assert ratio.where == "rank 1" and ratio.value > 2 * CPU.straggler_max and found[0].summary.startswith("straggler: rank 1 takes")


def test_with_three_passes_the_gpu_profiles_take_the_fastest():
    h100 = profiles.load(profiles.find("h100-sxm", None)).train
    assert h100.compute_steps == 3
    ratio, _ = straggler_of({"0": [0.90, 0.40, 0.41], "1": [0.44, 0.45, 0.46]}, h100)
    assert ratio.value == pytest.approx(0.44 / 0.40)
