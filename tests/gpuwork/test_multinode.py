"""The node group for checks that span nodes: Slurm's host lists, the
environment srun gives a task (recorded files), and the settings by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.gpuwork import multinode
from preflight.base.errors import UsageError

SLURM = Path(__file__).parents[1] / "fixtures" / "slurm"


def recorded_env(name: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (SLURM / f"env-{name}.txt").read_text().splitlines() if line)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu-[01-03,07]", ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("a[1-2],login1,b[3]", ["a1", "a2", "login1", "b3"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ],
)
def test_expand_hostlist_as_slurm_does(text, hosts):
    assert multinode.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-03", "gpu]01[", "gpu[3-1]", "gpu[a-b]", "", "gpu[0-999999999]", "r[1-1000]n[1-1000]"])
def test_a_malformed_hostlist_is_refused(text):
    with pytest.raises(ValueError):
        multinode.expand_hostlist(text)


def test_srun_gives_the_group_and_node_rank_0_hosts_the_rendezvous():
    g = multinode.from_slurm(recorded_env("srun-4-nodes-rank-2"))
    assert g == multinode.Group(nnodes=4, node_rank=2, endpoint="gpu-01:29500", rdzv_id="preflight-81235.0")
    assert (g.host, g.port) == ("gpu-01", 29500)
    assert multinode.from_slurm(recorded_env("srun-4-nodes-rank-2"), port=29611).endpoint == "gpu-01:29611"


def test_one_task_per_gpu_is_refused_with_the_srun_flag_to_use():
    with pytest.raises(UsageError, match=r"SLURM_NTASKS_PER_NODE=8: .* run one task per node \(--ntasks-per-node=1\)"):
        multinode.from_slurm(recorded_env("srun-8-tasks-per-node"))


def test_outside_an_srun_step_it_says_how_to_run_it():
    with pytest.raises(UsageError, match=r"SLURM_NODEID not set: run it under `srun -N N --ntasks-per-node=1 preflight run --multi-node`"):
        multinode.from_slurm(recorded_env("salloc-shell-no-step"))


def test_a_nodelist_that_disagrees_with_the_node_count_is_refused():
    env = {**recorded_env("srun-4-nodes-rank-2"), "SLURM_NNODES": "3"}
    with pytest.raises(UsageError, match="SLURM_NNODES=3 but SLURM_JOB_NODELIST=gpu-\\[01-03,07\\] names 4 hosts"):
        multinode.from_slurm(env)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((2, 2, "n1:29500", "x"), "--node-rank 2: give a rank from 0 to 1"),
        ((0, 0, "n1:29500", "x"), "--nnodes 0"),
        ((2, 0, "n1", "x"), "give HOST:PORT"),
        ((2, 0, "n1:0", "x"), "give HOST:PORT"),
        ((2, 0, "fd00::1:29500", "x"), "IPv6 address in brackets"),
        ((2, 0, "n1:29500", "a b"), "--rdzv-id 'a b'"),
    ],
)
def test_bad_group_settings_name_the_flag(args, words):
    with pytest.raises(UsageError, match=words.replace("[", "\\[").replace("(", "\\(")):
        multinode.group(*args)


def test_an_ipv6_endpoint_in_brackets():
    g = multinode.group(2, 1, "[fd00::1]:29500", "preflight-7")
    assert (g.host, g.port, g.endpoint) == ("fd00::1", 29500, "[fd00::1]:29500")
