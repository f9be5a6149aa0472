"""The memtest check: its judges on the facts a memory test gathers (a word read
back wrong, patterns the time cap cut off), and the worker for real on the cpu
profile's host buffers through the CLI, healthy and with a flipped bit."""

import json

from conftest import clean_env, fast_profile, load_worker, run_preflight, workers_left

from preflight.base.findings import Status
from preflight.checks import memtest
from preflight.gpuwork import ranks
from preflight.pipeline.load_expectations import MemtestExpect

EXPECT = MemtestExpect(seconds=120, source="test")
PATTERNS = [{"name": "address", "passes": 1, "seconds": 0.5, "mismatched_words": 0}, {"name": "walking_ones", "passes": 64, "seconds": 9.0, "mismatched_words": 0},
            {"name": "random", "passes": 1, "seconds": 1.0, "mismatched_words": 0}]


def facts(*reports: dict) -> memtest.MemtestFacts:
    f = memtest.MemtestFacts(python="py", backend="nccl", nproc=len(reports), ended="exit 0", returncode=0)
    for r, extra in enumerate(reports):
        rep = {"rank": r, "local_rank": r, "world_size": len(reports), "host": "n1", "pid": 1, "python": "py", "stage": "done", "backend": "nccl",
               "device": "cuda", "buffer_bytes": 72 << 30, "patterns": PATTERNS, "test_seconds": 10.5, **extra}
        f.ranks.append(ranks.RankOutcome(rank=r, gpu=f"GPU {r}", report=memtest.RankReport.model_validate(rep)))
    return f


def test_intact_memory_passes():
    f = facts({}, {})
    assert memtest.judge(f, EXPECT) == []
    assert memtest.summary(f) == "2 nccl rank(s), 72.0 GiB per GPU, patterns address, walking_ones, random read back intact, in 10.5 s"


def test_the_gpus_holding_local_rank_0_s_p2p_context_are_said_not_judged():
    # In a launch shared with bandwidth, local rank 0's process made the GPU->GPU copies
    # over every GPU and keeps one context on each of the others (checks/workers/bandwidth.py).
    f = facts({"contexts_elsewhere": [1, 2]}, {}, {})
    held = memtest.foreign_contexts(f)
    assert sorted(held) == ["GPU 1", "GPU 2"] and "bandwidth's GPU->GPU copies" in held["GPU 1"] and "rank 0" in held["GPU 1"]
    assert memtest.judge(f, EXPECT) == [] and memtest.foreign_contexts(facts({}, {})) == {}


def test_a_word_read_back_wrong_names_the_gpu_the_pattern_and_the_first_offsets():
    bad = [{"pattern": "walking_ones bit 17", "offset": 0x3A0000008, "wrote": "0x0000000000020000", "read": "0x0000000000000000"}]
    patterns = [PATTERNS[0], {**PATTERNS[1], "mismatched_words": 3}, PATTERNS[2]]
    found = memtest.judge(facts({}, {"mismatches": bad, "patterns": patterns}), EXPECT)
    assert [x.status for x in found] == [Status.FAIL]
    assert found[0].summary == "GPU 1: memory reads back wrong at offset 0x3a0000008 (walking_ones bit 17)"
    assert "3 word(s) of GPU memory read back other than written in a 72.0 GiB buffer" in found[0].cause
    assert "wrote 0x0000000000020000 read 0x0000000000000000" in found[0].cause


def test_patterns_the_time_cap_cut_off_are_said_not_passed_over():
    found = memtest.judge(facts({"not_reached": ["walking_ones", "random"], "patterns": PATTERNS[:1]}), EXPECT)
    assert [x.status for x in found] == [Status.WARN]
    assert "rank 0 (GPU 0): walking_ones, random" in found[0].cause


def test_a_gpu_of_which_too_little_was_free_to_test_warns_instead_of_passing():
    # 80 GiB GPUs: GPU 1 had 0.5 GiB free (another process holds the rest) and its test covered almost nothing.
    found = memtest.judge(facts({"total_bytes": 80 << 30, "free_bytes": 76 << 30},
                                {"total_bytes": 80 << 30, "free_bytes": 1 << 29, "buffer_bytes": 8}), EXPECT)
    assert [(x.summary, x.status) for x in found] == [("memory test covered under half of GPU 1's memory", Status.WARN)]
    assert found[0].cause == "too little was free to test: GPU 1: 0 MiB of 80.0 GiB (512 MiB free)"


def test_a_gpu_on_the_hosts_memory_tested_at_the_half_its_worker_took_is_covered():
    # A unified-memory GPU (GB10's kin, under generic's 0.9): its worker took half of the 100 GiB free.
    took = {"total_bytes": 120 << 30, "free_bytes": 100 << 30, "buffer_bytes": 50 << 30, "fraction": 0.5}
    assert memtest.judge(facts({}, took), EXPECT) == []
    assert [x.summary for x in memtest.judge(facts({}, {**took, "fraction": None}), EXPECT)] == ["memory test covered under half of GPU 1's memory"]


def test_memtest_runs_over_the_cpu_profiles_host_buffers(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--level", "full", "--only", "memtest", "--json"], env={**clean_env(), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock")})
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)["checks"][0]
    assert result["status"] == "PASS" and "64 MiB per host buffer, patterns address, walking_ones, random read back intact" in result["summary"]


def test_a_flipped_bit_fails_naming_the_rank_and_its_offset(tmp_path):
    env = {**clean_env(), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"), "PREFLIGHT_WORKER_FAULT": "1:wrong=4096@memtest"}
    p = run_preflight(["run", "--profile", "cpu", "--level", "full", "--only", "memtest", "--json"], env=env)
    assert p.returncode == 1, p.stderr
    result = json.loads(p.stdout)["checks"][0]
    assert result["status"] == "FAIL" and result["summary"] == "rank 1: memory reads back wrong at offset 0x1000 (address)"
    assert "offset 0x1000 wrote 0x0000000000000200 read 0x0000000000000201" in result["cause"]


def test_a_rank_hung_in_memtest_is_named_once_its_peer_finished_not_at_the_deadline(tmp_path):
    # No rank waits on another here, so no error ever comes: the agent itself must see that rank 1
    # stopped while rank 0 finished, and not wait out the check's 90 s.
    env = {**fast_profile(tmp_path, "memtest", 90.0), "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"), "PREFLIGHT_WORKER_FAULT": "1:stop@memtest",
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    p = run_preflight(["run", "--profile", "cpu-fast", "--level", "full", "--only", "memtest", "--json"], env=env, timeout=180)
    assert p.returncode == 1, p.stderr
    result = json.loads(p.stdout)["checks"][0]
    assert result["status"] == "FAIL" and result["summary"].startswith("rank 1 hung"), result["summary"]
    assert "once it made no progress after the other ranks finished" in result["cause"], result["cause"]
    assert result["details"]["timed_out"] is False and result["duration_seconds"] < 90
    assert not workers_left(tmp_path)


def test_a_gpu_on_the_hosts_memory_is_tested_over_at_most_half_its_free_memory_whatever_the_profile_asks():
    worker = load_worker("memtest")
    assert (worker.fraction_of_free(0.9, True), worker.fraction_of_free(0.3, True), worker.fraction_of_free(0.9, False)) == (0.5, 0.3, 0.9)


# /proc/meminfo of a healthy, idle GB10 (128 GB LPDDR5X), its memory mostly page cache: the
# figures of gpud's capture of one (leptonai/gpud PR 1170: total 128501256192 bytes, used 6.4 GiB,
# free 7.4 GiB) with the rest cached and so available, as the kernel reclaims it for an allocation.
GB10_MEMINFO = """MemTotal:       125489508 kB
MemFree:          7789944 kB
MemAvailable:   117695912 kB
Buffers:           512300 kB
Cached:         109904012 kB
SwapTotal:       16777212 kB
SwapFree:        16777212 kB
"""


def test_a_unified_memory_gpu_whose_memory_is_page_cache_is_sized_by_what_the_host_can_give_and_passes():
    """cudaMemGetInfo's free on GB10 leaves out the page cache the kernel would reclaim (NVIDIA's
    DGX Spark known issues; llama.cpp PR 17368 takes MemAvailable): sized by it, an idle node's
    test covered under a quarter of its memory and warned "run on an idle node"."""
    worker = load_worker("memtest")
    cuda_free, total = 7976902656, 128501256192  # as free as the OS says: the page cache not counted
    free = worker.free_to_test(cuda_free, True, GB10_MEMINFO)
    assert free == 117695912 * 1024
    fraction = worker.fraction_of_free(0.5, True)
    buffer = int(free * fraction) - 2 * worker.CHUNK_WORDS * 8
    gb10 = {"total_bytes": total, "free_bytes": free, "buffer_bytes": buffer, "fraction": fraction}
    assert memtest.judge(facts(gb10), EXPECT) == []
    # Sized by cudaMemGetInfo's free alone (as before), the same idle node warned.
    before = {**gb10, "free_bytes": cuda_free, "buffer_bytes": int(cuda_free * fraction) - 2 * worker.CHUNK_WORDS * 8}
    assert [x.summary for x in memtest.judge(facts(before), EXPECT)] == ["memory test covered under half of GPU 0's memory"]
    # A discrete GPU's memory is its own: the host's page cache says nothing of it; no meminfo, nothing to add.
    assert worker.free_to_test(cuda_free, False, GB10_MEMINFO) == cuda_free
    assert worker.free_to_test(cuda_free, True, None) == cuda_free == worker.free_to_test(cuda_free, True, "MemTotal: 1 kB\n")
    # What a process really holds still shows: MemAvailable low too, the test small, the WARN kept.
    held = GB10_MEMINFO.replace("117695912", "9000000")
    free = worker.free_to_test(cuda_free, True, held)
    small = {"total_bytes": total, "free_bytes": free, "buffer_bytes": int(free * fraction) - 2 * worker.CHUNK_WORDS * 8, "fraction": fraction}
    assert [x.summary for x in memtest.judge(facts(small), EXPECT)] == ["memory test covered under half of GPU 0's memory"]
