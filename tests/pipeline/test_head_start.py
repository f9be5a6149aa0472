"""The ranks' launch started ahead of the plan (preflight/pipeline/head_start.py): which
launch the run may start before NVML answers, from the settings, a named profile and the
recorded HGX tree; and, with real gloo ranks, that the run adopts it, ends a launch it does
not want, and leaves none behind when the plan refuses the input."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import clean_env, lock_held, run_preflight, world_processes
from preflight.base.host import Host
from preflight.gpuwork.world import Worlds
from preflight.pipeline import head_start
from preflight.pipeline.report import Report
from preflight.pipeline.settings import Settings

FIXTURES = Path(__file__).parents[1] / "fixtures"
HGX = Host(FIXTURES / "sysfs" / "hgx-h100")  # 8 GPUs on the PCI bus, /dev/nvidia0-7
BARE = Host(FIXTURES / "no-such-tree")  # no GPU in sysfs or /dev


def test_a_standard_run_on_an_eight_gpu_node_starts_eight_ranks_before_nvml_answers():
    assert head_start.ranks(Settings(), HGX) == 8
    assert head_start.ranks(Settings(level="full"), HGX) == 8
    assert head_start.ranks(Settings(profile="h100-sxm"), HGX) == 8
    assert head_start.ranks(Settings(nproc_per_node=2), HGX) == 2  # the person's count, as Context.ranks takes it


def test_a_named_profile_without_gpus_starts_its_own_gloo_ranks():
    assert head_start.ranks(Settings(profile="cpu"), BARE) == 2  # cpu.toml's ranks
    assert head_start.ranks(Settings(profile="cpu", nproc_per_node=3), BARE) == 3


@pytest.mark.parametrize("why, kw", [
    ("the quick level starts no torch", {"level": "quick"}),
    ("a budget picks the level from the profile's times", {"budget": "60"}),
    ("a fake NVML's GPUs are not this node's", {"nvml_fake": FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"}),
    ("a run across nodes waits for its meeting", {"nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400"}),
    ("no selected check has ranks", {"only": ["shm", "topology"]}),
    ("skip leaves the named profile no check with ranks", {"profile": "cpu", "skip": ["nccl", "bandwidth", "train"]}),
    ("a profile that is not there is the plan's to name", {"profile": "no-such-profile"}),
    ("a group of one node still meets", {"rdzv_endpoint": "10.0.0.1:29400"}),
    ("skip leaves auto no check with ranks", {"skip": ["cuda", "nccl", "bandwidth", "train", "burnin", "memtest"]}),
])
def test_nothing_starts_where_the_launch_cannot_be_told_or_is_not_wanted(why, kw):
    assert head_start.ranks(Settings(**kw), HGX) is None, why


def test_auto_on_a_node_with_no_gpu_in_sysfs_or_dev_starts_nothing():
    assert head_start.ranks(Settings(), BARE) is None  # detection may pick cpu or fail: the plan says


def test_nvml_is_read_ahead_where_the_run_reads_it():
    assert head_start.reads_nvml(Settings())  # auto detects from it
    assert head_start.reads_nvml(Settings(profile="h100-sxm"))  # execute reads the GPUs' facts
    assert not head_start.reads_nvml(Settings(profile="cpu"))  # no GPU: nothing asks
    assert not head_start.reads_nvml(Settings(nvml_fake=FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"))
    assert not head_start.reads_nvml(Settings(profile="no-such-profile"))  # the plan names that


def test_a_launch_of_other_ranks_is_ended_before_the_one_the_plan_wants_starts():
    worlds = Worlds()
    try:
        worlds.prestart(sys.executable, 2, 0)
        first = worlds.starting()
        worlds.prestart(sys.executable, 2, 0)  # the same launch: kept
        assert worlds.starting() is first and worlds.launches == 1
        worlds.prestart(sys.executable, 1, 0)  # another: the first ends, its ranks with it
        assert worlds.launches == 2 and not first.usable()
        said = worlds.torch_said(sys.executable, time.monotonic() + 120)
        assert said is not None and sorted(said) == [0]
    finally:
        worlds.close()
    assert world_processes() == []


def run_watching_the_plan(tmp_path: Path, monkeypatch, *args: str):
    """`preflight run --profile cpu ARGS` in this process; what was up as its plan began: the
    ranks of a launch, whether the run lock was held, and by which of the launch's processes."""
    from typer.testing import CliRunner

    from preflight.cli.app import app
    from preflight.outputs import gate
    from preflight.pipeline import lock

    lock_file = tmp_path / "lock"
    seen: dict = {}

    def plan(*a):
        ranks = world_processes()
        holders = [p.pid for p in ranks for f in p.open_files() if f.path == str(lock_file)]
        seen.update(ranks=len(ranks), held=lock.held(lock_file), holders=holders)
        return planned(*a)

    planned = gate.pipeline.plan
    monkeypatch.setattr(gate.pipeline, "plan", plan)
    r = CliRunner().invoke(app, ["run", "--profile", "cpu", "--lock-file", str(lock_file), "--report", str(tmp_path / "r.json"), *args])
    return r, seen


def test_the_run_adopts_the_launch_it_started_under_its_lock_before_the_plan(tmp_path, monkeypatch):
    """The ranks are up while the plan runs, hold the run lock as everything the run starts
    does, and nccl's stage runs in that very launch."""
    r, seen = run_watching_the_plan(tmp_path, monkeypatch, "--only", "nccl")
    assert r.exit_code == 0, r.output
    assert seen["ranks"] >= 1 and seen["held"] is True and seen["holders"]  # torchrun's ranks, under the lock
    nccl = Report.model_validate_json((tmp_path / "r.json").read_text()).checks[0]
    assert nccl.details["world"] == {"launch": 1, "stage": 1, "ended_it": False}
    assert world_processes() == []


def test_a_lock_taken_between_the_look_and_the_head_start_leaves_the_ranks_unstarted(tmp_path):
    s = Settings(profile="cpu", lock_file=tmp_path / "lock")
    ahead = head_start.HeadStart(s)
    with lock_held(tmp_path / "lock"):
        try:
            ahead.begin(s, sys.executable, ranks_too=True, host=BARE)
            assert not ahead.locked and ahead.worlds.starting() is None
        finally:
            ahead.close()
    assert world_processes() == []


def test_a_run_that_finds_the_lock_held_starts_nothing_until_it_holds_it(tmp_path, monkeypatch):
    with lock_held(tmp_path / "lock"):
        r, seen = run_watching_the_plan(tmp_path, monkeypatch, "--only", "nccl", "--lock-timeout", "1", "--if-locked", "skip")
    assert r.exit_code == 0 and "still holds" in r.output, r.output
    assert seen["ranks"] == 0 and not (tmp_path / "r.json").exists()
    assert world_processes() == []


def test_input_the_plan_refuses_after_the_head_start_leaves_no_rank_behind(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--only", "nccl", "--skip", "nccl", "--report", str(tmp_path / "r.json")], env=clean_env())
    assert p.returncode == 2 and "only and skip both name nccl" in p.stderr
    assert list(tmp_path.iterdir()) == [] and world_processes() == []
