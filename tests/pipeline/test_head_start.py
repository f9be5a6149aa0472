"""The ranks' launch started ahead of the plan (preflight/pipeline/head_start.py): which
launch the run may start before NVML answers, from the settings, a named profile and the
recorded HGX tree; and, with real gloo ranks, that the run adopts it, ends a launch it does
not want, and leaves none behind when the plan refuses the input."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import clean_env, run_preflight, world_processes
from preflight.base.host import Host
from preflight.gpuwork.world import Worlds
from preflight.pipeline import head_start
from preflight.pipeline.report import Report
from preflight.pipeline.settings import Settings

FIXTURES = Path(__file__).parents[1] / "fixtures"
HGX = Host(FIXTURES / "sysfs" / "hgx-h100")  # 8 GPUs on the PCI bus, /dev/nvidia0-7
BARE = Host(FIXTURES / "no-such-tree")  # no GPU in sysfs or /dev


def settings(**kw) -> Settings:
    return Settings(**kw)


def test_a_standard_run_on_an_eight_gpu_node_starts_eight_ranks_before_nvml_answers():
    assert head_start.ranks(settings(), HGX) == 8
    assert head_start.ranks(settings(level="full"), HGX) == 8
    assert head_start.ranks(settings(profile="h100-sxm"), HGX) == 8
    assert head_start.ranks(settings(nproc_per_node=2), HGX) == 2  # the person's count, as Context.ranks takes it


def test_a_named_profile_without_gpus_starts_its_own_gloo_ranks():
    assert head_start.ranks(settings(profile="cpu"), BARE) == 2  # cpu.toml's ranks
    assert head_start.ranks(settings(profile="cpu", nproc_per_node=3), BARE) == 3


@pytest.mark.parametrize("why, kw", [
    ("the quick level starts no torch", {"level": "quick"}),
    ("a budget picks the level from the profile's times", {"budget": "60"}),
    ("a fake NVML's GPUs are not this node's", {"nvml_fake": FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"}),
    ("a run across nodes waits for its meeting", {"nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400"}),
    ("no selected check has ranks", {"only": ["shm", "topology"]}),
    ("skip leaves the named profile no check with ranks", {"profile": "cpu", "skip": ["nccl", "bandwidth", "train"]}),
    ("a profile that is not there is the plan's to name", {"profile": "no-such-profile"}),
])
def test_nothing_starts_where_the_launch_cannot_be_told_or_is_not_wanted(why, kw):
    assert head_start.ranks(settings(**kw), HGX) is None, why


def test_auto_on_a_node_with_no_gpu_in_sysfs_or_dev_starts_nothing():
    assert head_start.ranks(settings(), BARE) is None  # detection may pick cpu or fail: the plan says


def test_nvml_is_read_ahead_where_the_run_reads_it():
    assert head_start.reads_nvml(settings())  # auto detects from it
    assert head_start.reads_nvml(settings(profile="h100-sxm"))  # execute reads the GPUs' facts
    assert not head_start.reads_nvml(settings(profile="cpu"))  # no GPU: nothing asks
    assert not head_start.reads_nvml(settings(nvml_fake=FIXTURES / "nvml" / "h100-sxm-8x-healthy.json"))
    assert not head_start.reads_nvml(settings(profile="no-such-profile"))  # the plan names that


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


def test_the_run_adopts_the_launch_it_started_before_the_plan(tmp_path, monkeypatch):
    """The ranks are up while the plan runs, and nccl's stage runs in that very launch."""
    from typer.testing import CliRunner

    from preflight.cli.app import app
    from preflight.outputs import gate

    seen: list[int] = []
    plan = gate.pipeline.plan
    monkeypatch.setattr(gate.pipeline, "plan", lambda *a: seen.append(len(world_processes())) or plan(*a))
    r = CliRunner().invoke(app, ["run", "--profile", "cpu", "--only", "nccl", "--lock-file", str(tmp_path / "lock"),
                                 "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert seen and seen[0] >= 1  # torchrun's ranks, started before the plan
    nccl = Report.model_validate_json((tmp_path / "r.json").read_text()).checks[0]
    assert nccl.details["world"] == {"launch": 1, "stage": 1, "ended_it": False}
    assert world_processes() == []


def test_input_the_plan_refuses_after_the_head_start_leaves_no_rank_behind(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--only", "nccl", "--skip", "nccl", "--report", str(tmp_path / "r.json")], env=clean_env())
    assert p.returncode == 2 and "only and skip both name nccl" in p.stderr
    assert list(tmp_path.iterdir()) == [] and world_processes() == []
