"""NCCL's transports between two GPUs of one node, judged (preflight/checkkit/transports.py),
on recorded NCCL logs. The nccl check's own cases are in tests/checks/test_nccl_judge.py
(judge_transports), the bandwidth check's in tests/checks/test_bandwidth_judge.py."""

from __future__ import annotations

from conftest import FIXTURES, nccl_fixture_text

from preflight.base.findings import Status
from preflight.checkkit import transports
from preflight.gpuwork import ranks
from preflight.pipeline.expectations import NcclExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.nccl import nccl_log
from preflight.readers.nvidia.nvml import FakeNvml

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


def test_gpus_that_cannot_do_p2p_by_design_go_through_host_memory_with_no_finding():
    # Two GeForce cards (`nvidia-smi topo -p2p r` prints GNS between them, noonghunna/club-3090#1130):
    # NVML says the GPU does not support P2P, so NCCL's SHM is how this node works, under any profile.
    inv = FakeNvml(FIXTURES / "nvml" / "l40s-2x.json")
    gpus = [g.model_copy(update={"p2p_read": {other.pci_bus_id: "gpu_not_supported"}}) for g, other in zip(inv.gpus, reversed(inv.gpus))]
    consumer = inv.model_copy(update={"gpus": gpus})
    assert transports.without_p2p(consumer) == {frozenset((0, 1))}
    log = nccl_log.parse(nccl_fixture_text("02"))
    warn = transports.p2p_for_shape(WANT_P2P, NodeShape(gpus=2, gpus_from="test", fabric="pcie", fabric_from="test"))
    assert transports.judge(log, two_ranks(), {}, warn, set(), by_design=transports.without_p2p(consumer)) == []
    # Where P2P is merely off (ACS, the chipset), the fallback is still said; between NVLink peers it still fails.
    chipset = inv.model_copy(update={"gpus": [g.model_copy(update={"p2p_read": {o.pci_bus_id: "chipset_not_supported"}}) for g, o in zip(inv.gpus, reversed(inv.gpus))]})
    assert [x.status for x in transports.judge(log, two_ranks(), {}, warn, set(), by_design=transports.without_p2p(chipset))] == [Status.WARN]
    assert [x.status for x in transports.judge(log, two_ranks(), {}, warn, {frozenset((0, 1))}, by_design={frozenset((0, 1))})] == [Status.FAIL]
    # ... and where the node or the profile wants P2P (an NVSwitch, an SXM board), NVML's word does not excuse it.
    assert [x.status for x in transports.judge(log, two_ranks(), {}, WANT_P2P, set(), by_design={frozenset((0, 1))})] == [Status.FAIL]


def test_geforce_cards_whose_driver_words_the_refusal_cns_go_through_host_memory_with_no_finding():
    # NVIDIA's driver refuses P2P between GeForce cards; some drivers say CNS, not GNS (an 8x RTX 5090
    # server, RTX 3090 pairs without a bridge): two 4090s under one PCIe switch are no fallback.
    inv = FakeNvml(FIXTURES / "nvml" / "l40s-2x.json")
    cns = {"chipset_not_supported"}
    geforce = inv.model_copy(update={"gpus": [g.model_copy(update={"name": "NVIDIA GeForce RTX 4090", "p2p_read": {o.pci_bus_id: "chipset_not_supported"}})
                                              for g, o in zip(inv.gpus, reversed(inv.gpus))]})
    assert transports.without_p2p(geforce) == {frozenset((0, 1))}
    log = nccl_log.parse(nccl_fixture_text("02"))
    warn = transports.p2p_for_shape(WANT_P2P, NodeShape(gpus=2, gpus_from="test", fabric="pcie", fabric_from="test"))
    assert transports.judge(log, two_ranks(), {}, warn, set(), {frozenset((0, 1))}, by_design=transports.without_p2p(geforce)) == []
    # A data-center card's CNS (ACS, an IOMMU, a hypervisor) is still said.
    l40s = inv.model_copy(update={"gpus": [g.model_copy(update={"p2p_read": {o.pci_bus_id: s for s in cns}}) for g, o in zip(inv.gpus, reversed(inv.gpus))]})
    assert transports.without_p2p(l40s) == set()

