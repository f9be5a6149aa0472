"""NCCL's transports between two GPUs of one node, judged (preflight/checkkit/transports.py),
on recorded NCCL logs. The nccl check's own cases are in tests/checks/test_nccl_judge.py
(judge_transports), the bandwidth check's in tests/checks/test_bandwidth_judge.py."""

from __future__ import annotations

from conftest import nccl_fixture_text

from preflight.base.findings import Status
from preflight.checkkit import transports
from preflight.gpuwork import ranks
from preflight.pipeline.expectations import NcclExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.nccl import nccl_log

WANT_P2P = NcclExpect(init_source="test", p2p="fail", p2p_source="test: GPUs joined by NVLink")


def two_ranks() -> list[ranks.RankOutcome]:
    return [ranks.RankOutcome(rank=r, gpu=f"GPU {r}", report=ranks.RankReport(rank=r, local_rank=r, world_size=2, host="n", pid=r, python="py", stage="done",
                                                                              backend="nccl", device="cuda")) for r in (0, 1)]


def test_shm_between_two_gpus_fails_where_p2p_is_expected_naming_the_collectives():
    log = nccl_log.parse(nccl_fixture_text("02"))  # a 2-GPU consumer box: SHM both ways
    (x,) = transports.judge(log, two_ranks(), {}, WANT_P2P, set(), during=" in the large collectives")
    assert x.status is Status.FAIL and x.summary == "GPUs fall back from P2P in the large collectives (2 pairs)"
    assert x.cause.startswith("2 pair(s) of GPUs on this node do not use P2P in the large collectives: rank 0 (GPU 0) -> rank 1 (GPU 1) via SHM/direct/direct")
    assert transports.judge(None, two_ranks(), {}, WANT_P2P, set()) == []  # no NCCL lines (gloo): nothing to judge


def test_on_gpus_joined_by_pcie_only_a_fallback_warns():
    pcie = NodeShape(gpus=2, gpus_from="test", fabric="pcie", fabric_from="test")
    expect = transports.p2p_for_shape(WANT_P2P, pcie)
    assert expect.p2p == "warn" and "P2P over PCIe is not promised" in (expect.p2p_source or "")
    (x,) = transports.judge(nccl_log.parse(nccl_fixture_text("02")), two_ranks(), {}, expect, set())
    assert x.status is Status.WARN
    assert transports.p2p_for_shape(WANT_P2P, NodeShape(gpus=8, gpus_from="test", fabric="nvswitch", fabric_from="test")) == WANT_P2P
