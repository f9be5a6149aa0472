"""The bandwidth worker's own parts (checks/workers/bandwidth.py and the
_bw_*.py beside it), run in this process: how it shrinks sizes that do not fit
(_bw_bench.py), and its copy steps' plan (_bw_copies.py) on torch for N GPUs.
How it reads the machine is test_bw_machine.py's; its timing runs for real in
test_bandwidth.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
_spec = importlib.util.spec_from_file_location("bandwidth_worker", launch.WORKERS_DIR / "bandwidth.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

import _bw_bench  # noqa: E402 - the worker's siblings, as it imports them (bare, from WORKERS_DIR)
import _bw_copies  # noqa: E402

GIB, MIB = 1 << 30, 1 << 20


def test_a_size_that_fits_is_used_as_asked():
    assert _bw_bench.fit("hbm_copy", GIB, 2, 80 * GIB, "cuda:0") == (GIB, None)


def test_a_size_past_the_free_memory_is_clamped_and_says_so():
    # 4 GiB x 2 (src + dst) x 2 sets = 16 GiB needed; 10 GiB free, 70% usable -> 1.75 GiB buffers
    nbytes, said = _bw_bench.fit("hbm_copy", 4 * GIB, 2, 10 * GIB, "cuda:3")
    assert nbytes == int(0.7 * 10 * GIB / 4) // MIB * MIB and nbytes % MIB == 0
    assert said == "hbm_copy: 4.00 GiB asked, 1.75 GiB used: 10.00 GiB free on cuda:3"


def test_memory_too_small_for_even_a_mebibyte_is_an_error_naming_the_device():
    with pytest.raises(MemoryError, match=r"all_reduce: 0.00 GiB free on cuda:1, not enough"):
        _bw_bench.fit("all_reduce", GIB, 1, 2 * MIB, "cuda:1")


def test_unknown_free_memory_uses_the_size_asked():
    assert _bw_bench.fit("memcpy", 64 * MIB + 3, 2, None, "this host") == (64 * MIB, None)


# ---- the copy steps' plan, on torch for N GPUs (tests/fakes.py: no multi-GPU machine here) ----

from types import SimpleNamespace  # noqa: E402

from fakes import FakeDist, FakeTorch  # noqa: E402

from preflight.checks import bandwidth  # noqa: E402
from preflight.checkkit import bandwidth_figures, bandwidth_plan  # noqa: E402
from preflight.checkkit.bandwidth_figures import BandwidthFacts, RankReport, StepResult  # noqa: E402
from preflight.gpuwork import ranks  # noqa: E402

GB = 1e9
ARGS = dict(tolerance=0.02, repeats=6, max_repeats=9, max_seconds=2.0, warmup=2, timeout=30.0, p2p_bytes=256 * MIB, host_bytes=256 * MIB, copy_bytes=GIB)


def bench(torch: FakeTorch, local_rank: int, n: int):
    me = worker._rank.Rank(local_rank, local_rank, n, n)
    return worker.Bench(torch, FakeDist(torch), torch.device("cuda", local_rank), me, SimpleNamespace(**ARGS))


def p2p_on(n: int, local_rank: int = 0, **kw) -> tuple[list[dict], FakeTorch, object]:
    torch = FakeTorch(n, current=local_rank, **kw)
    b = bench(torch, local_rank, n)
    return b.p2p(), torch, b


def test_local_rank_0_times_every_ordered_pair_from_its_one_process():
    results, torch, b = p2p_on(4)
    assert [(r["src"], r["peer"]) for r in results] == _bw_copies.pairs(4)
    assert sorted(_bw_copies.pairs(4)) == [(a, c) for a in range(4) for c in range(4) if a != c]
    assert {r["peer_pci_bus_id"] for r in results} == {f"00000000:{0x18 + i:02x}:00.0" for i in range(4)}
    assert all(r["src_pci_bus_id"] == f"00000000:{0x18 + r['src']:02x}:00.0" and r["peer_access"] is True for r in results)


def test_its_contexts_and_buffers_are_made_once_before_any_copy_is_timed():
    results, torch, b = p2p_on(4)
    first_copy = next(i for i, e in enumerate(torch.log) if e[0] == "copy")
    contexts = [e[1] for e in torch.log if e[0] == "context"]
    assert sorted(contexts) == [0, 1, 2, 3] and all(torch.log.index(("context", g)) < first_copy for g in contexts)
    sets = results[0]["sets"]
    mallocs = [e for e in torch.log if e[0] == "malloc" and e[2] == 256 * MIB]
    assert len(mallocs) == 4 * 2 * sets and torch.log.index(mallocs[-1]) < first_copy  # a source and a destination per set on each GPU
    assert b.setup["p2p"]["contexts"] == 3 and b.setup["p2p"]["bytes_per_gpu"] == 2 * sets * 256 * MIB
    assert torch.log[-1] == ("empty_cache",)  # the buffers given back for the next stages
    assert worker._rank.WORLD["contexts_elsewhere"] >= {1, 2, 3}  # memtest, in the same launch, says so


def test_each_copy_and_its_events_run_on_the_source_gpu():
    # The fake refuses a copy issued while another GPU is current, and events of two GPUs.
    results, torch, _ = p2p_on(3)
    copies = [(e[1], e[2]) for e in torch.log if e[0] == "copy"]
    per_pair = ARGS["warmup"] + ARGS["repeats"]  # every repeat alike here: converged at the least repeats
    assert copies == [pair for pair in _bw_copies.pairs(3) for _ in range(per_pair)]
    assert all(len(r["seconds"]) == ARGS["repeats"] and r["stopped"] == "converged" for r in results)


def test_the_other_ranks_only_wait_at_as_many_barriers_as_rank_0():
    results, torch, _ = p2p_on(4, local_rank=2)
    leader, lead_torch, _ = p2p_on(4)
    assert results == [] and torch.contexts == {2}  # no context on a peer's GPU, no copy
    barriers = [e for e in torch.log if e == ("barrier",)]
    assert len(barriers) == len([e for e in lead_torch.log if e == ("barrier",)]) == bandwidth_plan.p2p_plan(4).barriers


def test_by_hand_each_pair_has_its_own_line_entry():
    results, _, _ = p2p_on(3)
    assert [worker._label(r) for r in results[:3]] == ["p2p 0->1", "p2p 1->2", "p2p 2->0"]
    assert worker._label({"step": "hbm_copy"}) == "hbm_copy"


def test_the_check_s_plan_counts_what_the_worker_runs():
    for n in (1, 2, 3, 8):
        plan = bandwidth_plan.p2p_plan(n)
        assert plan.timed == len(_bw_copies.pairs(n)) == len(set(_bw_copies.pairs(n))) == n * (n - 1)
        assert plan.contexts == plan.foreign_contexts == max(0, n - 1)
    results, torch, _ = p2p_on(8)
    assert len(results) == 56 and len([e for e in torch.log if e == ("barrier",)]) == bandwidth_plan.p2p_plan(8).barriers
    assert len([e for e in torch.log if e[0] == "context"]) == bandwidth_plan.p2p_plan(8).contexts + 1  # and its own GPU's


def test_every_pair_reaches_the_judges_as_its_own_figure():
    """Rank 0's report in the new shape, through the check's arithmetic: each ordered pair a
    figure named by its source and destination GPU, GPU 2 -> GPU 3 slow and named."""
    slow = {(2, 3): 40 * GB}
    results, _, _ = p2p_on(4, rate=lambda a, c: slow.get((a, c), 300 * GB))
    reports = [RankReport(rank=r, local_rank=r, world_size=4, host="n", pid=r, python="py", stage="done", backend="nccl", device="cuda",
                          results=[StepResult(**x) for x in results] if r == 0 else []) for r in range(4)]
    f = BandwidthFacts(python="py", backend="nccl", nproc=4, ranks=[ranks.RankOutcome(rank=r, gpu=f"GPU {r}", report=reports[r]) for r in range(4)])
    figs = [g for g in bandwidth_figures.figures(f) if g.name == "p2p_bandwidth"]
    assert len(figs) == 12 and {(g.labels["gpu"], g.labels["peer_gpu"]) for g in figs} == {(str(a), str(c)) for a, c in _bw_copies.pairs(4)}
    by_pair = {(g.labels["gpu"], g.labels["peer_gpu"]): g for g in figs}
    assert by_pair[("2", "3")].value == pytest.approx(40 * GB) and by_pair[("3", "2")].value == pytest.approx(300 * GB)
    assert by_pair[("2", "3")].rank == 2 and by_pair[("2", "3")].where == "GPU 2 -> GPU 3"
    floor = bandwidth.ResolvedFloor(value=100 * GB, unit="bytes_per_second", source="test", bound="min", origin="test")
    (x,) = bandwidth.judge_floors(figs, {"p2p_bandwidth": floor}, 0.05)
    assert x.status.value == "FAIL" and "GPU 2 -> GPU 3" in x.summary


# ---- pinned host buffers: made before the turns -----------------------------------------------


def test_pinned_buffers_are_made_by_every_rank_before_the_first_turn():
    # Local rank 2 of 4 measures in the third turn; its pinning (0.3-0.6 s a rank on a GPU node)
    # must not wait for the turns before it, or 8 ranks pin one after the other.
    for step in ("h2d", "d2h"):
        torch = FakeTorch(4, current=2)
        (r,) = getattr(bench(torch, 2, 4), step)()
        pins = [i for i, e in enumerate(torch.log) if e[0] == "pin"]
        first_barrier = torch.log.index(("barrier",))
        assert pins and max(pins) < first_barrier, (step, torch.log[:12])
        assert len([e for e in torch.log if e == ("barrier",)]) == bandwidth_plan.host_copy_plan(4).barriers
        assert r["step"] == step and r["moved_bytes"] == 256 * MIB and len(r["seconds"]) == ARGS["repeats"]


@pytest.mark.gpu
def test_the_p2p_pair_code_runs_on_the_one_gpu_the_kit_has(tmp_path, monkeypatch):
    """No pair exists on one GPU, so the pair's own code runs for the GPU to itself: local
    rank 0's context and buffers, the copy timed by events on the source GPU's stream, the
    PCI addresses. A torch call that fails or behaves otherwise on a real GPU shows here
    before a multi-GPU node runs it; pairs, plan and barriers are held on tests/fakes.py above."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import torch.distributed as dist

    # A GPU with itself is no pair CUDA's peer-access query is meant for: answered here, as for any pair of an NVSwitch node.
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: True)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        me = worker._rank.Rank(0, 0, 1, 1)
        b = worker.Bench(torch, dist, torch.device("cuda", 0), me, SimpleNamespace(**{**ARGS, "p2p_bytes": 64 * MIB}))
        held = b._p2p_buffers(1)
        b.alone = True  # as p2p() measures each pair: local rank 0 decides its repeats alone
        r = b._p2p_pair(held, 0, 0)
        rate = r["moved_bytes"] / sorted(r["seconds"])[len(r["seconds"]) // 2]
        print(f"cuda:0 -> cuda:0 through the p2p code: {rate / GB:.1f} GB/s, setup {b.setup['p2p']}")
        assert r["src"] == r["peer"] == 0 and len(r["seconds"]) >= ARGS["repeats"] and all(s > 0 for s in r["seconds"])
        assert r["src_pci_bus_id"] == r["peer_pci_bus_id"] and b.setup["p2p"]["contexts"] == 0 and rate > 10 * GB
        held.clear()
        assert b.p2p() == []  # one GPU: no pair, nothing made
    finally:
        dist.destroy_process_group()
