"""The all_reduce judged against the floor of the algorithm NCCL ran (preflight/checkkit/nvls.py):
the fact from the environment and NCCL's log (recorded files), the judge on recorded figures
with the h100-sxm profile's own floors."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.base.findings import Status
from preflight.checkkit import nvls
from preflight.checks import bandwidth
from preflight.checkkit.bandwidth_figures import Figure
from preflight.pipeline import profiles
from preflight.readers.nccl import nccl_log

NCCL = Path(__file__).parents[1] / "fixtures" / "nccl"


def builtin(name: str) -> profiles.ResolvedProfile:
    path = profiles.BUILTIN_DIR / f"{name}.toml"
    return profiles.resolve(profiles.load(path), path, {}, "test")


H100, H200 = builtin("h100-sxm"), builtin("h200-sxm")
GB = 1e9
ON = nvls.Nvls(on=True, source="NCCL's log of the bandwidth stage: 16 nvls channels (NCCL set NVLS up for its collectives)")
AVAILABLE = nvls.Nvls(on=None, available=True, source="NCCL's log of the nccl check: NVLS multicast support is available")
OFF = nvls.Nvls(on=False, source="NCCL_NVLS_ENABLE=0 in the environment")
UNKNOWN = nvls.Nvls(on=None, source="unknown: no NCCL setting names it and the nccl check did not run")


def judged(busbw: float, fact: nvls.Nvls, profile=H100):
    """What the bandwidth check says of an 8-GPU all_reduce at ``busbw``: the floors' findings and nvls's."""
    floors = dict(profile.floors)
    figs = [Figure(name="allreduce_bus_bandwidth", unit="bytes_per_second", value=busbw, where="8 ranks")]
    found = bandwidth.judge_floors(figs, nvls.fit(floors, fact), 0.05)
    more, lines = nvls.explain([busbw], floors, fact)
    return found + more, lines


def test_every_nvswitch_profile_cites_a_ring_floor_under_its_nvls_floor():
    for p in (H100, H200):
        ring, top = p.floors[nvls.RING_FLOOR], p.floors[nvls.NVLS_FLOOR]
        assert ring.value < top.value and "nccl-tests/issues/212" in ring.source and ring.gpus == top.gpus == 8


def test_nvls_on_at_480_passes():
    assert judged(480 * GB, ON) == ([], [])


def test_nvls_on_under_its_floor_still_fails_blaming_nvlink():
    [f], _ = judged(368 * GB, ON)
    assert f.status == Status.FAIL and "430.0 GB/s floor" in f.cause and "NVLink or NVSwitch" in f.remedy


@pytest.mark.parametrize("profile", [H100, H200], ids=["h100", "h200"])
def test_nvls_off_at_368_passes_saying_rings_explain_it(profile):
    found, [line] = judged(368 * GB, OFF, profile)
    assert found == []
    assert "NVLS was off (NCCL_NVLS_ENABLE=0 in the environment)" in line and "ring floor 330.0 GB/s" in line and "NVLS floor 430.0 GB/s" in line


def test_nvls_off_at_200_fails_blaming_nvlink_against_the_ring_floor():
    [f], lines = judged(200 * GB, OFF)
    assert f.status == Status.FAIL and "330.0 GB/s floor" in f.cause and "nccl-tests/issues/309" in f.cause
    assert "NVLink or NVSwitch" in f.remedy and lines == []


def test_nvls_unknown_at_368_warns_that_the_fact_is_missing_and_blames_no_link():
    [f], lines = judged(368 * GB, UNKNOWN)
    assert f.status == Status.WARN and f.summary == "all_reduce busbw 368.0 GB/s: NVLS state unknown"
    assert "NVLS being off would explain it" in f.cause and "NVLink" not in f.remedy and lines == []


def test_nvls_unknown_at_480_passes_and_at_200_fails():
    assert judged(480 * GB, UNKNOWN) == ([], [])
    assert [f.status for f in judged(200 * GB, UNKNOWN)[0]] == [Status.FAIL]


def test_a_site_s_own_all_reduce_floor_stands_whatever_ran():
    floors = dict(H100.floors)
    floors[nvls.NVLS_FLOOR] = floors[nvls.NVLS_FLOOR].model_copy(update={"value": 400 * GB, "origin": "config /etc/preflight/config.toml line 3"})
    fitted = nvls.fit(floors, OFF)
    assert fitted[nvls.NVLS_FLOOR].value == 400 * GB and nvls.RING_FLOOR not in fitted
    assert nvls.explain([368 * GB], floors, UNKNOWN) == ([], [])


@pytest.mark.parametrize("env, on", [
    ({"NCCL_NVLS_ENABLE": [("0", "environment")]}, False),
    ({"NCCL_NVLS_ENABLE": [("1", "environment")]}, None),
    ({"NCCL_ALGO": [("Ring,Tree", "/etc/nccl.conf")]}, False),
    ({"NCCL_ALGO": [("^NVLS", "environment")]}, False),
    ({"NCCL_ALGO": [("^NVLSTree", "environment")]}, None),
    ({"NCCL_ALGO": [("NVLS,Ring", "environment")]}, None),
    ({"NCCL_ALGO": [("allreduce:ring;allgather:ring", "environment")]}, False),
    ({"NCCL_ALGO": [("allgather:ring", "environment")]}, None),
    ({}, None),
])
def test_the_environment_says_when_nvls_cannot_run(env, on):
    found = nvls.from_env(env)
    assert (found.on if found else None) is on


@pytest.mark.parametrize("log, on, available", [
    # "available" is printed before NCCL's graph search, which may still clear NVLS: not proof it ran.
    ("05_nccl2.18.3_8xH800-single-process_nccl-tests-header_NET-Socket_NVLS-available_P2P-direct-pointer.log", None, True),
    ("01a_vllm083_nccl2.21.5_8xGPU_NET-IB-listed_P2P-IPC-read_rank0-init.log", False, False),
    ("02_nccl2.27.5_2gpu-consumer_NET-Socket-16ifaces_SHM-direct-direct_isAllDirectP2p0.log", None, False),
])
def test_nccl_s_own_nvls_line_answers_through_the_nccl_check_s_details(log, on, available):
    parsed = nccl_log.parse((NCCL / log).read_text(errors="replace"))
    fact = nvls.decide({}, {"nccl_log": {"nvls": parsed.nvls}})
    assert fact.on is on and fact.available is available
    if on is None and not available:
        assert fact.source.startswith("unknown: ") and "no NVLS line" in fact.source


def test_a_setting_wins_over_the_log():
    fact = nvls.decide({"NCCL_NVLS_ENABLE": [("0", "the environment")]}, {"nccl_log": {"nvls": True}})
    assert fact == nvls.Nvls(on=False, source="NCCL_NVLS_ENABLE=0 in the environment")


def stage(log: str) -> nccl_log.Summary:
    path = NCCL / log if (NCCL / log).exists() else NCCL.parent / "nccltests" / log
    return nccl_log.summary(nccl_log.parse(path.read_text(errors="replace")))


TWO_GPU = "02_nccl2.27.5_2gpu-consumer_NET-Socket-16ifaces_SHM-direct-direct_isAllDirectP2p0.log"  # "0 nvls channels"
NVLS_RUN = "11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt"  # "16 nvls channels"
H800 = "05_nccl2.18.3_8xH800-single-process_nccl-tests-header_NET-Socket_NVLS-available_P2P-direct-pointer.log"  # "available", no channels line


def test_the_bandwidth_stage_s_nvls_channels_decide_before_the_nccl_check_s_line():
    said = {"nccl_log": {"nvls": True}}  # the nccl check: "NVLS multicast support is available"
    off = nvls.decide({}, said, stage(TWO_GPU))
    assert off.on is False and off.source == "NCCL's log of the bandwidth stage: 0 nvls channels (NCCL set no NVLS up for its collectives)"
    ran = nvls.decide({}, said, stage(NVLS_RUN))
    assert ran.on is True and "16 nvls channels" in ran.source


def test_an_nccl_algo_without_nvls_wins_over_the_stage_s_nvls_channels():
    # NCCL sets its NVLS channels up whatever NCCL_ALGO says (src/transport/nvls.cc ncclNvlsInit,
    # src/init.cc) and NCCL_ALGO only zeroes the tuner's bandwidth of the algorithms it leaves out
    # (src/graph/tuning.cc): under NCCL_ALGO=Ring the log says "16 nvls channels" and rings ran.
    fact = nvls.decide({"NCCL_ALGO": [("Ring", "/etc/nccl.conf")]}, None, stage(NVLS_RUN))
    assert fact.on is False and fact.source == "NCCL_ALGO=Ring in /etc/nccl.conf leaves NVLS out of the all_reduce"
    # A healthy 8x H100 at the rings' ~368 GB/s passes against the ring floor, saying so.
    found, lines = judged(368 * GB, fact)
    assert found == [] and "is what NCCL's rings give" in lines[0]
    # An NCCL_ALGO that allows NVLS leaves the stage's channels to answer.
    assert nvls.decide({"NCCL_ALGO": [("NVLS,Ring", "environment")]}, None, stage(NVLS_RUN)).on is True


@pytest.mark.parametrize("algo, allowed", [
    ("Ring;allgather:NVLS", False),  # the first entry, without a prefix, sets every collective (tuning.cc parseList)
    ("^NVLS;allreduce:NVLS,Ring", True),  # a later allreduce entry sets it anew
    ("NVLS;allreduce:Ring", False),
    ("NVLSTree", False),  # another algorithm, off on one node (tuning.cc)
    ("nvls", True),
    ("allreduce:^tree", True),
])
def test_nccl_algo_is_read_as_nccl_parses_it(algo, allowed):
    assert nvls.allows_nvls(algo) is allowed


def test_the_bandwidth_stage_s_lines_come_before_the_nccl_check_s():
    # A stage whose lines say nothing of NVLS (the 4x A100's transport lines) leaves the settings to answer.
    silent = stage("09_nccl2.28.9-cuda12.9_4xa100-vastai_grep-transport-lines_P2P-CUMEM-read-on-NVLink-pairs_SHM-direct-direct-across_prefix-stripped.log")
    assert silent.nvls is None and silent.nvls_channels is None
    assert nvls.decide({"NCCL_NVLS_ENABLE": [("0", "environment")]}, {"nccl_log": {"nvls": True}}, silent).on is False
    assert nvls.decide({}, {"nccl_log": {"nvls": True}}, silent).available


def test_a_stage_that_says_only_available_leaves_nvls_unproven():
    fact = nvls.decide({}, None, stage(H800))
    assert fact.on is None and fact.available and "bandwidth stage: NVLS multicast support is available" in fact.source


def test_available_alone_between_the_floors_names_both_causes_and_fails_nothing():
    [f], lines = judged(368 * GB, AVAILABLE)
    assert f.status == Status.WARN and f.summary == "all_reduce busbw 368.0 GB/s: NVLS may not have run"
    assert "NVLS was not used by this communicator" in f.cause and "NVLink/NVSwitch is degraded" in f.cause and lines == []
    assert judged(480 * GB, AVAILABLE) == ([], [])
    [f], _ = judged(200 * GB, AVAILABLE)  # under the ring floor too: the link, as before
    assert f.status == Status.FAIL and "NVLink or NVSwitch" in f.remedy


def test_in_a_shared_launch_the_nccl_check_s_channels_line_is_the_bandwidth_communicator_s():
    # The nccl stage made the group and bandwidth's stage reused it: NCCL printed "K nvls channels"
    # once, at that communicator's init, so it is in the nccl check's lines, not the bandwidth stage's.
    two_gpu = nccl_log.parse((NCCL / TWO_GPU).read_text(errors="replace"))
    nccl_details = {"nccl_log": {"nvls": True, "nvls_channels": two_gpu.nvls_channels}, "world": {"launch": 1, "stage": 2, "ended_it": False}}
    silent = stage("09_nccl2.28.9-cuda12.9_4xa100-vastai_grep-transport-lines_P2P-CUMEM-read-on-NVLink-pairs_SHM-direct-direct-across_prefix-stripped.log")
    fact = nvls.decide({}, nccl_details, silent, {"launch": 1, "stage": 3, "ended_it": False})
    assert fact.on is False and "whose communicator the bandwidth stage reused (launch 1): 0 nvls channels" in fact.source
    # A fresh launch for bandwidth (the nccl stage ended its own) made a communicator of its own: the line is not its.
    assert nvls.decide({}, nccl_details, silent, {"launch": 2, "stage": 1, "ended_it": False}).available
    ended = {**nccl_details, "world": {"launch": 1, "stage": 2, "ended_it": True}}
    assert nvls.decide({}, ended, silent, {"launch": 1, "stage": 3, "ended_it": False}).on is None
    ran = {**nccl_details, "nccl_log": {"nvls": True, "nvls_channels": 16}}
    assert nvls.decide({}, ran, None, {"launch": 1, "stage": 3, "ended_it": False}).on is True
