"""Slurm's Gres against the node's GPUs: every form `scontrol show node` prints, and which side is wrong."""

from __future__ import annotations

import pytest

from preflight.base.actions import Action, Domain
from preflight.outputs.schedulers import slurm_gres


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:8", 8),
    ("gpu:h100:8", 8),
    ("gpu:h100:8(S:0-1)", 8),
    ("gpu:h100:4(S:0),gpu:a100:4(S:1)", 8),
    ("gpu:h100:4(S:0,1),shard:h100:32(S:0,1)", 4),  # a comma inside the socket list is not a new entry
    ("shard:16", None),  # no GPU named: not judged
    ("(null)", None),
    (None, None),
])
def test_the_gpus_a_gres_names(gres, gpus):
    assert slurm_gres.configured_gpus(gres) == gpus


def test_a_form_it_cannot_read_is_said_not_judged():
    with pytest.raises(slurm_gres.GresError, match="cannot read"):
        slurm_gres.configured_gpus("gpu:h100:8(S:0-1")


def test_fewer_gpus_than_configured_is_a_lost_gpu_for_service():
    nxt, said = slurm_gres.judge("gpu:h100:8(S:0-1)", 7)
    assert (nxt.action, nxt.domain) == (Action.SERVICE, Domain.NODE)
    assert said == "slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7"


def test_more_gpus_than_configured_is_a_config_to_fix():
    nxt, said = slurm_gres.judge("gpu:4", 8)
    assert (nxt.action, nxt.domain) == (Action.DRAIN, Domain.SOFTWARE)
    assert said == "slurm-gres FAIL: Slurm's Gres says 4 GPUs, the node has 8"


def test_agreeing_or_unknown_is_no_finding():
    assert slurm_gres.judge("gpu:h100:8", 8) is None
    assert slurm_gres.judge("gpu:h100:8", None) is None  # a report without the node's shape
    assert slurm_gres.judge(None, 8) is None  # a site that gives whole nodes and configures no GPUs
