"""The nccl check's judges, on recorded facts: rank reports built by hand (the
shape checks/workers/nccl_smoke.py writes), real NCCL_DEBUG=INFO logs from
tests/fixtures/nccl/, no processes but a stand-in `nvidia-smi topo -m` printing a capture."""

from __future__ import annotations

import time

import fakes
import pytest
from conftest import FIXTURES, make_ctx
from preflight.base.host import Host
from preflight.checks import nccl
from preflight.checkkit.nccl_settings import gpu_pairs, layout_of
from preflight.checkkit.placement import linked_pairs
from preflight.pipeline import profiles
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.checks.nccl import NcclFacts, OpResult, RankOutcome, RankReport

from preflight.readers.nccl import nccl_env, nccl_log
from preflight.pipeline.check import Result
from preflight.base.findings import Status
from preflight.pipeline.expectations import NcclExpect

FAIL, WARN = Status.FAIL, Status.WARN
PY = "/opt/venv/bin/python"
NCCL_LOGS = FIXTURES / "nccl"
ENV = nccl_env.ENVIRONMENT
NICS: dict[str, list[str] | None] = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"], "ib0": []}  # the node's interfaces, as in tests/checkkit/test_nccl_settings.py

# The worker's plan: every op small then large, then a barrier (checks/workers/nccl_smoke.py).
OP_NAMES = ("all_reduce_fp32", "all_reduce_bf16", "all_gather", "reduce_scatter", "broadcast", "send_recv")
PLAN = [(f"{op}_{size}", op, nbytes) for size, nbytes in (("small", 4096), ("large", 32 << 20)) for op in OP_NAMES] + [("barrier", "barrier", 0)]


def nccl_fixture(prefix: str) -> nccl_log.NcclLog:
    (path,) = NCCL_LOGS.glob(f"{prefix}_*.log")
    return nccl_log.parse(path.read_text())


def expect(**kw) -> NcclExpect:
    base: dict = {"init_source": "test profile: a healthy node inits in a few seconds"}
    if kw.get("p2p", "any") != "any":
        base["p2p_source"] = "test profile: every GPU pair has NVLink"
    return NcclExpect(**{**base, **kw})


def ops(n: int = len(PLAN), seconds: float = 0.001, errors: dict[str, str] | None = None) -> list[OpResult]:
    """The first ``n`` ops of the plan as a rank reports them."""
    out = []
    for name, op, nbytes in PLAN[:n]:
        out.append(OpResult(name=name, op=op, dtype=None if op == "barrier" else "float32", bytes=nbytes, seconds=seconds, error=(errors or {}).get(name)))
    return out


def report(rank: int, stage: str = "done", world: int = 2, host: str = "node1", **kw) -> RankReport:
    if "ops" not in kw:
        kw["ops"] = ops() if stage == "done" else ops(next(i for i, p in enumerate(PLAN) if p[0] == stage) if stage in {p[0] for p in PLAN} else 0)
    base = dict(rank=rank, local_rank=rank, world_size=world, host=host, pid=1000 + rank, python=PY, backend="nccl", device="cuda",
                torch_version="2.5.1", nccl_version="2.21.5", init_seconds=1.2, first_collective_seconds=0.05)
    return RankReport(**{**base, "stage": stage, **kw})


def outcome(rank: int, rep: RankReport | None, **kw) -> RankOutcome:
    kw.setdefault("gpu", f"GPU {rank}")
    kw.setdefault("last_line", f"rank {rank}: last line")
    return RankOutcome(rank=rank, report=rep, **kw)


def facts(ranks: list[RankOutcome], **kw) -> NcclFacts:
    base = dict(python=PY, backend="nccl", nproc=len(ranks), ended="exit 0", returncode=0, seconds=12.5)
    return NcclFacts(**{**base, "ranks": ranks, **kw})


def healthy(n: int = 2, **kw) -> NcclFacts:
    return facts([outcome(r, report(r, world=n)) for r in range(n)], **kw)


# --- judge: the environment part, on the pairs the ranks use and the node's use ---------


def test_p2p_level_is_judged_on_the_pairs_the_ranks_use():
    # Two ranks on GPUs 0 and 1 (NVLink); GPUs 2 and 3 behind a PCIe switch are another job's.
    pairs = {frozenset((0, 1)): "NVL", frozenset((2, 3)): "PIX"}
    f = healthy(env={"NCCL_P2P_LEVEL": [("NVL", ENV)]})
    assert nccl.judge(f, expect(), set(), pairs=pairs)["environment"] == []
    assert [x.summary for x in nccl.judge(f, expect(), set(), pairs={frozenset((0, 1)): "PIX"})["environment"]] == ["NCCL_P2P_LEVEL=NVL is set"]


def test_a_site_wide_p2p_disable_on_a_one_gpu_node_is_nothing():
    # /etc/nccl.conf's NCCL_P2P_DISABLE=1 (a fleet of consumer cards sets it everywhere) on a node with one GPU:
    # NCCL reads it as NCCL_P2P_LEVEL=LOC (src/graph/paths.cc ncclGetLevel), and there is no pair to cut.
    from preflight.checkkit.nccl_settings import gpu_pairs
    from preflight.pipeline.shape import NodeShape
    one = NodeShape(gpus=1, gpus_from="test", fabric="single", fabric_from="test")
    f = facts([outcome(0, report(0, world=1))], env={"NCCL_P2P_DISABLE": [("1", "/etc/nccl.conf")]})
    assert nccl.judge(f, expect(), set(), pairs=gpu_pairs(None, one), spans_nodes=False)["environment"] == []


def test_ib_disable_in_a_one_node_run_is_nothing_where_the_node_serves_no_multi_node_jobs():
    # Within one node NCCL moves data by P2P and shared memory; the setting matters only to a job spanning nodes.
    env = {"NCCL_IB_DISABLE": [("1", "/etc/nccl.conf")]}
    assert nccl.judge_env(env, rdma=["mlx5_0"], spans_nodes=False) == []
    assert "this run is one node" in nccl.env_without_cost(env, rdma=["mlx5_0"], spans_nodes=False)["NCCL_IB_DISABLE"]
    f = healthy(env=env, rdma=["mlx5_0"])
    assert nccl.judge(f, expect(), set(), spans_nodes=False)["environment"] == []
    assert [x.summary for x in nccl.judge(f, expect(), set(), spans_nodes=True)["environment"]] == ["NCCL_IB_DISABLE=1 is set"]


# --- judge_transports: what NCCL chose between local GPUs ----------------------


def four_ranks(log: nccl_log.NcclLog | None, hosts=("node1",) * 4, gpus=None, **kw) -> NcclFacts:
    ranks = [outcome(r, report(r, world=4, host=hosts[r]), gpu=(gpus[r] if gpus else f"GPU {r}")) for r in range(4)]
    return facts(ranks, nccl=log, **kw)


def test_fixture_09_shm_between_nvlink_islands_fails_where_the_profile_wants_p2p():
    f = four_ranks(nccl_fixture("09"))
    (x,) = nccl.judge_transports(f, expect(p2p="fail"), set())
    assert x.status is FAIL and x.summary == "GPUs fall back from P2P (2 pairs)"
    assert "rank 1 (GPU 1) -> rank 2 (GPU 2) via SHM/direct/direct" in x.cause
    assert "rank 3 (GPU 3) -> rank 0 (GPU 0) via SHM/direct/direct" in x.cause
    assert "rank 0 (GPU 0) -> rank 1" not in x.cause and "rank 2 (GPU 2) -> rank 3" not in x.cause
    assert "every GPU pair has NVLink" in x.cause  # the profile's source
    assert "NCCL_P2P_DISABLE" in x.remedy and "nvidia-smi nvlink" in x.remedy


def test_nccl_2_30_shm_fallback_between_nvlink_gpus_fails():
    # NCCL 2.30 prints "via SHM/direct" (src/transport/shm.cc, v2.30.7-1): still a fallback from NVLink.
    text = ("h:1:2 [0] NCCL INFO NCCL version 2.30.7+cuda13.0\n"
            "h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct\n"
            "h:1:3 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct\n")
    (x,) = nccl.judge_transports(healthy(nccl=nccl_log.parse(text)), expect(p2p="any"), {frozenset({0, 1})})
    assert x.status is FAIL and "rank 0 (GPU 0) -> rank 1 (GPU 1) via SHM/direct" in x.cause


def test_fixture_09_with_p2p_warn_warns():
    (x,) = nccl.judge_transports(four_ranks(nccl_fixture("09")), expect(p2p="warn"), set())
    assert x.status is WARN and "2 pair(s)" in x.cause


def test_fixture_09_with_p2p_any_is_nothing_unless_the_pair_has_nvlink():
    f = four_ranks(nccl_fixture("09"))
    assert nccl.judge_transports(f, expect(p2p="any"), set()) == []
    (x,) = nccl.judge_transports(f, expect(p2p="any"), {frozenset({1, 2}), frozenset({0, 1})})
    assert x.status is FAIL and x.summary == "GPUs fall back from P2P (1 pairs)"
    assert "rank 1 (GPU 1) -> rank 2 (GPU 2)" in x.cause and "rank 3" not in x.cause


def test_nvlink_pairs_fail_and_the_rest_warn_as_two_findings():
    found = nccl.judge_transports(four_ranks(nccl_fixture("09")), expect(p2p="warn"), {frozenset({0, 3})})
    by = {x.status: x for x in found}
    assert set(by) == {FAIL, WARN}
    assert "rank 3 (GPU 3) -> rank 0 (GPU 0)" in by[FAIL].cause and "rank 1" not in by[FAIL].cause
    assert "rank 1 (GPU 1) -> rank 2 (GPU 2)" in by[WARN].cause


def test_ranks_on_different_hosts_are_not_judged():
    f = four_ranks(nccl_fixture("09"), hosts=("a", "a", "b", "b"))
    assert nccl.judge_transports(f, expect(p2p="fail"), {frozenset({1, 2}), frozenset({0, 3})}) == []


def test_ranks_without_a_report_are_not_judged():
    f = four_ranks(nccl_fixture("09"))
    f.ranks[2].report = None
    f.ranks[0].report = None
    assert nccl.judge_transports(f, expect(p2p="fail"), set()) == []


def test_a_network_between_two_ranks_on_one_host_always_fails():
    # E14: NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1, so rank 0 sends to rank 1 over a socket.
    env = {"NCCL_P2P_DISABLE": [("1", ENV)], "NCCL_SHM_DISABLE": [("1", ENV)]}
    f = facts([outcome(0, report(0)), outcome(1, report(1))], nccl=nccl_fixture("E14"), env=env)
    (x,) = nccl.judge_transports(f, expect(p2p="any"), set())
    assert x.status is FAIL
    assert "rank 0 (GPU 0) -> rank 1 (GPU 1) via NET/Socket/0/Shared" in x.cause
    assert "(NCCL_SHM_DISABLE=1, NCCL_P2P_DISABLE=1 set)" in x.cause


def test_a_network_between_hosts_is_right():
    f = facts([outcome(0, report(0, host="a")), outcome(1, report(1, host="b"))], nccl=nccl_fixture("E14"))
    assert nccl.judge_transports(f, expect(p2p="fail"), {frozenset({0, 1})}) == []


def test_fixture_01a_all_p2p_is_nothing():
    f = facts([outcome(r, report(r, world=8)) for r in range(8)], nccl=nccl_fixture("01a"))
    assert nccl.judge_transports(f, expect(p2p="fail"), {frozenset({0, 1})}) == []


def test_fixture_02_consumer_gpus_on_shm_warn_where_p2p_is_a_bonus():
    f = facts([outcome(0, report(0)), outcome(1, report(1))], nccl=nccl_fixture("02"))
    (x,) = nccl.judge_transports(f, expect(p2p="warn"), set())
    assert x.status is WARN and x.summary == "GPUs fall back from P2P (2 pairs)"


def test_no_nccl_log_is_nothing():
    assert nccl.judge_transports(four_ranks(None), expect(p2p="fail"), {frozenset({1, 2})}) == []


def test_more_than_four_pairs_are_counted_not_listed():
    text = "\n".join(f"NCCL INFO Channel 00 : {a}[{a}] -> {b}[{b}] via SHM/direct/direct" for a in range(8) for b in range(8) if a != b and b == (a + 1) % 8)
    f = facts([outcome(r, report(r, world=8)) for r in range(8)], nccl=nccl_log.parse(text))
    (x,) = nccl.judge_transports(f, expect(p2p="fail"), set())
    assert x.summary == "GPUs fall back from P2P (8 pairs)" and "; and 4 more" in x.cause


def test_nvlink_from_the_topology_is_judged_by_gpu_not_by_rank_number():
    # CUDA_VISIBLE_DEVICES=4,5,6,7: rank N drives GPU N+4, and `nvidia-smi topo -m`
    # (the topology check's matrix) names GPUs by nvidia-smi's index.
    ctx = make_ctx()
    links = {"0-1": "NV12", "2-3": "NV12", "0-3": "NV12", "1-2": "NODE",  # GPUs 0-3: another job's
             "4-5": "NV12", "5-6": "NV12", "6-7": "NV12", "4-7": "NODE"}
    ctx.results["topology"] = Result(check="topology", status=Status.PASS, summary="ok", details={"matrix": {"links": links}})
    f = four_ranks(nccl_fixture("09"), gpus=["GPU 4", "GPU 5", "GPU 6", "GPU 7"])
    found = nccl.judge_transports(f, expect(p2p="any"), (linked_pairs(ctx.results.get("topology"), ("NV",)) or set()))
    assert [x.status for x in found] == [FAIL]
    assert "rank 1 (GPU 5) -> rank 2 (GPU 6)" in found[0].cause  # NVLinked GPUs on SHM
    assert "rank 3 (GPU 7) -> rank 0 (GPU 4)" not in found[0].cause  # NODE: SHM is what NCCL does there


# --- judge_run: did every rank run every op right, and who failed first ----------


def test_a_launch_error_fails_with_its_own_cause_and_remedy():
    cause = "the rendezvous port 127.0.0.1:29500 is taken by pid 77 (python train.py) (Address already in use): torchrun's store cannot listen there"
    remedy = "stop that process, or choose another port (rdzv_port in the config, 0 for a free one)"
    f = NcclFacts(python=PY, backend="nccl", nproc=8, launch_error=(cause, remedy))
    (x,) = nccl.judge_run(f)
    assert x.status is FAIL and x.summary == "the NCCL smoke test could not start"
    assert x.cause == cause and x.remedy == remedy


def test_not_started_is_said_by_the_environment_judge_not_here():
    f = NcclFacts(python=PY, backend="nccl", nproc=2, env={"NCCL_SOCKET_IFNAME": [("enp", ENV)]}, interfaces=NICS,
                  not_started="NCCL_SOCKET_IFNAME=enp names no interface")
    assert nccl.judge_run(f) == []
    parts = nccl.judge(f, expect(), set())
    assert [x.summary for x in parts["environment"]] == ["NCCL_SOCKET_IFNAME names a missing interface"]


def test_torch_missing_reported_by_the_ranks():
    err = "ModuleNotFoundError: No module named 'torch'"
    rep = lambda r: report(r, stage="import", ops=[], error=err, error_kind="no_torch", torch_version=None, init_seconds=None)  # noqa: E731
    f = facts([outcome(0, rep(0)), outcome(1, rep(1))], ended="exit 1", returncode=1)
    (x,) = nccl.judge_run(f)
    assert x.status is FAIL and x.summary == "torch is not importable"
    assert PY in x.cause and "No module named 'torch'" in x.cause
    assert "--python" in x.remedy and "install torch" in x.remedy


def test_torch_missing_for_torchrun_itself_with_no_reports():
    tail = ["/opt/venv/bin/python: Error while finding module specification for 'torch.distributed.run' (ModuleNotFoundError: No module named 'torch')"]
    f = facts([outcome(0, None), outcome(1, None)], ended="exit 1", returncode=1, log_tail=tail)
    (x,) = nccl.judge_run(f)
    assert x.summary == "torch is not importable"
    assert "No module named 'torch'" in x.cause and PY in x.cause and "never reported" not in x.cause


def test_another_missing_module_next_to_torch_is_not_torch_missing():
    # torch's own import warns about numpy; that line names torch's path and "No module named".
    tail = ["/v/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed to initialize NumPy: No module named 'numpy'"]
    silent = [outcome(r, None, last_line="none") for r in (0, 1)]  # no rank wrote a line: torchrun never got that far
    f = facts(silent, ended="killed at the deadline after 2 s", returncode=None, timed_out=True, log_tail=tail)
    (x,) = nccl.judge_run(f)
    assert x.summary == "torchrun never started the ranks"
    assert "torchrun was killed at the deadline after 2 s before any rank started" in x.cause and "[timeouts]" in x.remedy


def test_no_cuda_device():
    rep = lambda r: report(r, stage="init", ops=[], error="torch 2.5.1+cpu sees no CUDA device", error_kind="no_device")  # noqa: E731
    (x,) = nccl.judge_run(facts([outcome(0, rep(0)), outcome(1, rep(1))], ended="exit 1", returncode=1))
    assert x.status is FAIL and x.summary == "no CUDA device for NCCL"
    assert "sees no CUDA device" in x.cause and "--only cuda" in x.remedy


def test_a_rank_killed_before_it_said_a_word_is_named_not_torchrun():
    # torchrun's summary holds the ranks' exits even where no rank wrote a line: rank 1 died, rank 0 was stopped.
    silent = [outcome(0, None, exit="killed by SIGTERM", last_line="none"), outcome(1, None, exit="killed by SIGKILL", last_line="none")]
    (x,) = nccl.judge_run(facts(silent, ended="exit 1", returncode=1, root_cause=1))
    assert x.summary == "rank 1 (GPU 1) never reported (killed by SIGKILL)" and "OOM killer" in x.remedy
    only_stopped = [outcome(r, None, exit="killed by SIGTERM", last_line="none") for r in (0, 1)]
    (y,) = nccl.judge_run(facts(only_stopped, ended="killed at the deadline after 45 s", returncode=None, timed_out=True))
    assert y.summary == "torchrun never started the ranks"  # stopped in torchrun's teardown: no sign they ever ran


def test_a_killed_rank_that_never_reported_is_named_first():
    peer = report(0, stage="all_reduce_fp32_small", error="DistBackendError: NCCL error: remote process exited or there was a network error, Connection reset by peer",
                  error_time=1000.0)
    ranks = [outcome(0, peer), outcome(1, None, exit="killed by SIGKILL", last_line="[rank1] initializing")]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1))
    assert x.status is FAIL
    assert x.summary == "rank 1 (GPU 1) never reported (killed by SIGKILL)"
    assert x.cause.startswith("rank 1 (GPU 1) never reported (killed by SIGKILL): last log line: [rank1] initializing")
    then = "rank 0 (GPU 0) then failed in all_reduce_fp32_small (op 1): DistBackendError"
    assert then in x.cause and x.cause.index("rank 1") < x.cause.index(then)
    assert "nvidia-smi -r" in x.remedy and "run it by hand" in x.remedy


def test_an_unreadable_report_keeps_the_summary_whole():
    ranks = [outcome(0, report(0, stage="all_gather_small", error="DistBackendError: Connection reset by peer", error_time=5.0)),
             outcome(1, None, unreadable="rank1.json is not JSON (Expecting value: line 1 column 1 (char 0))")]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1))
    assert x.summary.startswith("rank 1 (GPU 1) never reported")
    assert x.summary.count("(") == x.summary.count(")"), x.summary  # not cut inside the reason
    assert "rank1.json is not JSON" in x.cause


@pytest.mark.parametrize(("kw", "how"), [
    ({"settled": True, "ended": "stopped after 40 s, once no rank made progress"}, "once it made no progress after another rank failed"),
    ({"timed_out": True, "ended": "killed at the deadline after 117 s"}, "at the deadline"),
])
def test_a_hung_rank_is_named_before_the_peer_that_timed_out_waiting(kw, how):
    timeout = "DistBackendError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=_ALLGATHER_BASE, Timeout(ms)=30000)"
    ranks = [outcome(0, report(0, stage="all_gather_large", error=timeout, error_time=2000.0)),
             outcome(1, report(1, stage="all_gather_large"), last_line="[rank1] step 9")]
    (x,) = nccl.judge_run(facts(ranks, returncode=None, **kw))
    assert x.status is FAIL
    assert x.summary == "rank 1 (GPU 1) hung in all_gather_large (op 9)"
    assert f"rank 1 (GPU 1) hung in all_gather_large (op 9) and was stopped {how}" in x.cause
    hung = x.cause.index("rank 1 (GPU 1) hung")
    then = x.cause.index("rank 0 (GPU 0) then failed in all_gather_large (op 9): DistBackendError")
    assert hung < then and "Watchdog caught" in x.cause


# NCCL's watchdog, as torch 2.x words it in the rank's log before the SIGABRT (tests/fixtures/nccl/W01 has the whole line).
WATCHDOG_LINE = "[rank0]:[E1127 02:14:07.523] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE) ran for 70000 milliseconds before timing out."


def test_a_hung_rank_is_named_not_the_peer_the_watchdog_killed_first():
    # Issue 33: the healthy rank 0 waited for rank 1 in all_gather_large; NCCL's watchdog ended it (SIGABRT),
    # torchrun saw that exit first and named it the root cause. Rank 1 stopped reporting and was still there.
    ranks = [outcome(0, report(0, stage="all_gather_large"), exit="killed by SIGABRT", last_line=WATCHDOG_LINE),
             outcome(1, report(1, stage="all_gather_large"), last_line="rank 1: op 9")]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1, root_cause=0, settled=True))
    assert x.summary == "rank 1 (GPU 1) hung in all_gather_large (op 9)", x.summary
    assert x.cause.startswith("rank 1 (GPU 1) hung in all_gather_large (op 9) and was stopped once it made no progress"), x.cause
    assert "; rank 0 (GPU 0) then died in all_gather_large (op 9) (killed by SIGABRT: NCCL's watchdog ends a rank" in x.cause


def test_a_hung_rank_is_named_not_the_peer_torchrun_saw_time_out_first():
    # The peer's own deadline fired (the worker's spin) and it exited first: still the symptom.
    late = report(0, stage="all_gather_large", error="TimeoutError: all_gather not done after 30 s: a peer stopped, or this GPU hangs", error_time=2000.0)
    ranks = [outcome(0, late, exit="exit 1"), outcome(1, report(1, stage="all_gather_large"), last_line="rank 1: op 9")]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1, root_cause=0, settled=True))
    assert x.summary == "rank 1 (GPU 1) hung in all_gather_large (op 9)", x.summary
    assert "; rank 0 (GPU 0) then failed in all_gather_large (op 9): TimeoutError" in x.cause


def test_a_rank_that_raised_on_its_own_stays_the_cause_before_a_peer_left_waiting_for_it():
    # Not a wait: rank 0's GPU faulted, and rank 1 then sat in the collective rank 0 never joined.
    crash = report(0, stage="all_gather_large", error="RuntimeError: CUDA error: an illegal memory access was encountered", error_time=2000.0)
    ranks = [outcome(0, crash, exit="exit 1"), outcome(1, report(1, stage="all_gather_large"))]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1, root_cause=0, settled=True))
    assert x.summary == "rank 0 (GPU 0) failed in all_gather_large (op 9)", x.summary
    # Without a hung peer a SIGABRT is no sign of a wait: the rank died of its own.
    alone = [outcome(0, report(0, stage="broadcast_large"), exit="killed by SIGABRT"), outcome(1, report(1, stage="broadcast_large", error="DistBackendError: remote process exited", error_time=3.0))]
    (y,) = nccl.judge_run(facts(alone, ended="exit 1", returncode=1, root_cause=0))
    assert y.summary == "rank 0 (GPU 0) died in broadcast_large (op 11) (killed by SIGABRT)", y.summary


def test_a_rank_that_died_in_an_op_is_said_so():
    ranks = [outcome(0, report(0, stage="broadcast_large", error="DistBackendError: remote process exited", error_time=3.0)),
             outcome(1, report(1, stage="broadcast_large"), exit="killed by SIGSEGV")]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1))
    assert x.summary == "rank 1 (GPU 1) died in broadcast_large (op 11) (killed by SIGSEGV)"


def test_the_earliest_error_leads():
    late = report(0, stage="all_reduce_bf16_small", error="DistBackendError: NCCL error: remote process exited", error_time=1002.0)
    early = report(1, stage="all_reduce_bf16_small", error="RuntimeError: CUDA error: an illegal memory access was encountered", error_time=1001.5)
    (x,) = nccl.judge_run(facts([outcome(0, late), outcome(1, early)], ended="exit 1", returncode=1))
    assert x.summary == "rank 1 (GPU 1) failed in all_reduce_bf16_small (op 2)"
    assert x.cause.startswith("rank 1 (GPU 1) failed first, in all_reduce_bf16_small (op 2): RuntimeError: CUDA error: an illegal memory access")
    assert "; rank 0 (GPU 0) then failed in all_reduce_bf16_small (op 2): DistBackendError" in x.cause


def test_an_error_without_a_time_comes_after_one_with_a_time():
    untimed = report(0, stage="init", ops=[], error="DistStoreError: timed out", error_time=None)
    timed = report(1, stage="init", ops=[], error="RuntimeError: NCCL error: unhandled cuda error", error_time=50.0)
    (x,) = nccl.judge_run(facts([outcome(0, untimed), outcome(1, timed)], ended="exit 1", returncode=1))
    assert x.summary == "rank 1 (GPU 1) failed in init_process_group"


def test_a_failed_run_carries_what_nccl_said_in_its_cause():
    # E04: /dev/shm full, then socket errors on the peers.
    ranks = [outcome(0, report(0, stage="init", ops=[], error="DistBackendError: NCCL error: unhandled system error", error_time=1.0)),
             outcome(1, report(1, stage="init", ops=[], error="DistBackendError: NCCL error: remote process exited", error_time=2.0))]
    f = facts(ranks, ended="exit 1", returncode=1, nccl=nccl_fixture("E04"))
    parts = nccl.judge(f, expect(), set())
    (x,) = parts["run"]
    assert x.summary == "rank 0 (GPU 0) failed in init_process_group"
    assert "NCCL said (/dev/shm is too small for NCCL's shared-memory segments)" in x.cause and "No space left on device" in x.cause
    assert "--shm-size" in x.remedy and "run it by hand" in x.remedy
    assert parts["log"] == []  # said once, in the run's cause


def test_a_failed_run_names_nccls_first_failure_not_a_warning_before_it():
    collnet = "dgx-01:5501:5630 [0] transport.cc:356 NCCL WARN Cannot initialize CollNet, using point-to-point network instead\n"
    log = nccl_log.parse(collnet + next((FIXTURES / "nccl").glob("E04_*.log")).read_text())
    assert [p.category for p in log.problems][:2] == ["collnet_fallback", "shm_no_space"]
    ranks = [outcome(0, report(0, stage="init", ops=[], error="DistBackendError: NCCL error: unhandled system error", error_time=1.0)),
             outcome(1, report(1, stage="init", ops=[], error="DistBackendError: NCCL error: remote process exited", error_time=2.0))]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1, nccl=log))
    assert "NCCL said (/dev/shm is too small for NCCL's shared-memory segments)" in x.cause and "CollNet" not in x.cause


def test_leftover_processes_fail_naming_the_pid():
    f = healthy(leftover=["pid 4242 (/opt/venv/bin/python -u nccl_smoke.py)"])
    found = nccl.judge_run(f)
    assert [x.summary for x in found] == ["worker processes outlived the check"]
    assert "pid 4242" in found[0].cause and "SIGKILL" in found[0].cause
    assert "drain the node and reboot it" in found[0].remedy


def test_wrong_answers_fail_naming_the_op_and_the_ranks():
    bad = {"all_reduce_bf16_large": "1 of 16777216 elements wrong; element 8388608 is 94, expected 93"}
    ranks = [outcome(0, report(0, world=3, ops=ops(errors=bad))), outcome(1, report(1, world=3)), outcome(2, report(2, world=3, ops=ops(errors=bad)))]
    (x,) = nccl.judge_run(facts(ranks, ended="exit 1", returncode=1))
    assert x.status is FAIL and x.summary == "all_reduce_bf16_large returned wrong values"
    assert "rank(s) 0, 2" in x.cause and "element 8388608 is 94, expected 93" in x.cause
    assert "dcgmi diag" in x.remedy


def test_wrong_answers_on_gloo_are_a_software_bug():
    bad = {"broadcast_small": "1 of 1024 elements wrong; element 512 is 9, expected 8"}
    f = facts([outcome(0, report(0, ops=ops(errors=bad)), gpu=None), outcome(1, report(1), gpu=None)], backend="gloo", ended="exit 1", returncode=1)
    (x,) = nccl.judge_run(f)
    assert x.summary == "broadcast_small returned wrong values" and "rank(s) 0" in x.cause
    assert "report it" in x.remedy and "dcgmi" not in x.remedy


def test_every_rank_done_and_exit_0_is_nothing():
    assert nccl.judge_run(healthy(8)) == []


def test_every_rank_done_but_torchrun_exit_1_fails():
    f = healthy(2, ended="exit 1", returncode=1, log_tail=["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: nccl_smoke.py FAILED"])
    (x,) = nccl.judge_run(f)
    assert x.status is FAIL and x.summary == "torchrun failed"
    assert "torchrun exit 1 although every rank reported success" in x.cause and "ChildFailedError" in x.cause
    assert x.remedy.startswith("run it by hand to see more: /opt/venv/bin/python -m torch.distributed.run --nproc-per-node 2")
    assert x.remedy.endswith("nccl_smoke.py")


def test_every_rank_done_but_the_deadline_passed_fails():
    (x,) = nccl.judge_run(healthy(2, ended="killed at the deadline after 120 s", returncode=None, timed_out=True))
    assert x.summary == "torchrun failed" and "last output: none" in x.cause


def test_by_hand_on_gloo_names_the_cpu_flags():
    f = facts([outcome(r, report(r), gpu=None) for r in range(2)], backend="gloo", ended="exit 1", returncode=1)
    (x,) = nccl.judge_run(f)
    assert x.remedy.endswith("--backend gloo --device cpu")


# --- judge_timing ----------------------------------------------------------------


def test_slow_init_on_one_rank_warns_naming_it():
    ranks = [outcome(0, report(0, init_seconds=3.1)), outcome(1, report(1, init_seconds=12.0))]
    (x,) = nccl.judge_timing(facts(ranks), expect(init_warn_seconds=10))
    assert x.status is WARN and x.summary == "slow NCCL init (12.0 s)"
    assert "12.0 s on rank 1 (GPU 1)" in x.cause and "the 10 s" in x.cause and "a healthy node inits" in x.cause
    assert "NCCL_SOCKET_IFNAME" in x.remedy


@pytest.mark.parametrize("seconds", [9.0, 10.0])
def test_init_within_the_bound_is_nothing(seconds):
    ranks = [outcome(0, report(0, init_seconds=1.0)), outcome(1, report(1, init_seconds=seconds))]
    assert nccl.judge_timing(facts(ranks), expect(init_warn_seconds=10)) == []


def test_no_init_figure_is_nothing():
    ranks = [outcome(0, report(0, init_seconds=None)), outcome(1, None)]
    assert nccl.judge_timing(facts(ranks), expect(init_warn_seconds=1)) == []


# --- judge_log ---------------------------------------------------------------------


def test_a_problem_in_the_log_of_a_passing_run_warns():
    found = nccl.judge_log(healthy(nccl=nccl_fixture("E04")), run_failed=False)
    assert [x.status for x in found] == [WARN, WARN]
    assert found[0].summary == "NCCL: /dev/shm is too small for NCCL's shared-memory segments"
    assert "No space left on device" in found[0].cause and "(line: " in found[0].cause
    assert "--shm-size" in found[0].remedy
    assert found[1].summary == "NCCL: a socket connection between ranks failed"


def test_a_failed_run_leaves_the_log_to_its_cause():
    assert nccl.judge_log(healthy(nccl=nccl_fixture("E04")), run_failed=True) == []


def test_plain_warnings_on_a_passing_run_are_counted():
    text = ("node1:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
            "node1:100:100 [0] misc/nvmlwrap.cc:183 NCCL WARN nvmlDeviceGetNvLinkRemoteDeviceType() failed: Not Supported\n")
    (x,) = nccl.judge_log(healthy(nccl=nccl_log.parse(text)), run_failed=False)
    assert x.status is WARN and x.summary == "NCCL warned 1 time(s)"
    assert x.cause == "NCCL WARN nvmlDeviceGetNvLinkRemoteDeviceType() failed: Not Supported"


def test_a_clean_log_or_none_is_nothing():
    assert nccl.judge_log(healthy(nccl=nccl_fixture("01a")), run_failed=False) == []
    assert nccl.judge_log(healthy(), run_failed=False) == []


def test_judge_puts_a_passing_runs_log_problem_in_the_log_part():
    parts = nccl.judge(healthy(nccl=nccl_fixture("E03")), expect(), set())
    assert parts["run"] == [] and [x.status for x in parts["log"]] == [WARN]


# --- op_table, lines, measurements, summary -------------------------------------------


def timed(rank: int, small: float, large: float, barrier: float, init: float = 1.0, first: float = 0.05) -> RankOutcome:
    rows = [OpResult(name="all_reduce_fp32_small", op="all_reduce_fp32", dtype="float32", bytes=4096, seconds=small),
            OpResult(name="all_reduce_fp32_large", op="all_reduce_fp32", dtype="float32", bytes=32 << 20, seconds=large),
            OpResult(name="send_recv_small", op="send_recv", dtype="float32", bytes=4096, skipped="a ring needs two ranks"),
            OpResult(name="barrier", op="barrier", bytes=0, seconds=barrier)]
    return outcome(rank, report(rank, ops=rows, init_seconds=init, first_collective_seconds=first))


def test_op_table_takes_the_slowest_rank_per_op_and_size():
    f = facts([timed(0, 0.002, 0.250, 0.001), timed(1, 0.004, 0.120, 0.003)])
    assert nccl.op_table(f) == {"all_reduce_fp32": {"small": 0.004, "large": 0.250}, "barrier": {"none": 0.003}}


def test_op_table_ignores_ranks_without_a_report():
    f = facts([timed(0, 0.002, 0.250, 0.001), outcome(1, None)])
    assert nccl.op_table(f)["all_reduce_fp32"] == {"small": 0.002, "large": 0.250}


def test_lines_show_the_slowest_rank_per_op():
    f = facts([timed(0, 0.002, 0.250, 0.001), timed(1, 0.004, 0.120, 0.003)])
    assert nccl.lines(f, expect()) == [
        "slowest rank per op: small = 4 KiB, large = 32 MiB",
        "  all_reduce_fp32  small 4 ms  large 250 ms",
        "  barrier          3 ms",
    ]
    assert nccl.lines(facts([outcome(0, None)]), expect()) == []
    # On NVLink every op is under a millisecond: said in microseconds, never "0 ms".
    fast = nccl.lines(facts([timed(0, 28e-6, 0.0004, 12e-6)]), expect())
    assert fast[1:] == ["  all_reduce_fp32  small 28.0 us  large 400.0 us", "  barrier          12.0 us"]


def test_measurements_name_init_first_collective_and_each_op():
    f = facts([timed(0, 0.002, 0.250, 0.001, init=1.5, first=0.2), timed(1, 0.004, 0.120, 0.003, init=2.5, first=0.1)])
    ms = {(m.name, tuple(sorted(m.labels.items()))): m for m in nccl.measurements(f, expect(init_warn_seconds=10))}
    init = ms[("nccl_init_duration", ())]
    assert (init.value, init.unit, init.ceiling) == (2.5, "seconds", 10)
    first = ms[("nccl_first_collective_duration", ())]
    assert (first.value, first.unit, first.ceiling) == (0.2, "seconds", None)
    op = ms[("nccl_op_duration", (("op", "all_reduce_fp32"), ("size", "large")))]
    assert (op.value, op.unit) == (0.250, "seconds")
    assert ms[("nccl_op_duration", (("op", "all_reduce_fp32"), ("size", "small")))].value == 0.004
    assert ms[("nccl_op_duration", (("op", "barrier"), ("size", "none")))].value == 0.003
    assert len(ms) == 5


def test_no_reports_no_measurements():
    assert nccl.measurements(facts([outcome(0, None), outcome(1, None)]), expect()) == []


def test_summary_says_ranks_ops_init_nccl_and_torch():
    f = four_ranks(nccl_fixture("09"))
    f.ranks[2].report.init_seconds = 2.5  # type: ignore[union-attr]
    assert nccl.summary(f, expect()) == (
        "4 nccl rank(s): 13 ops right on every rank (4 KiB and 32 MiB), init 2.50 s; "
        "NCCL 2.28.9+cuda12.9, transports P2P/CUMEM/read, SHM/direct/direct; torch 2.5.1"
    )


def test_summary_names_the_network_and_falls_back_to_the_ranks_nccl_version():
    f = facts([outcome(r, report(r, world=8)) for r in range(8)], nccl=nccl_fixture("01a"))
    assert "NCCL 2.21.5+cuda12.4, transports P2P/IPC/read, network IB; torch 2.5.1" in nccl.summary(f, expect())
    f = healthy(nccl=nccl_log.parse("no nccl here\n"))
    assert "NCCL 2.21.5, transports none logged" in nccl.summary(f, expect())


def test_summary_on_gloo_without_a_log():
    f = facts([outcome(r, report(r, backend="gloo", device="cpu", nccl_version=None), gpu=None) for r in range(2)], backend="gloo")
    assert nccl.summary(f, expect()) == "2 gloo rank(s): 13 ops right on every rank (4 KiB and 32 MiB), init 1.20 s; torch 2.5.1"


def test_ranks_done_but_stopped_at_teardown_warn():
    f = healthy(2, returncode=None, settled=True, ended="stopped after 12 s, once no rank made progress")
    (x,) = nccl.judge_run(f)
    assert x.status is WARN and x.summary == "ranks did not exit after finishing" and "teardown" in x.cause


# --- who is blamed (from the review) ---------------------------------------------


def test_torchrun_s_root_cause_leads_and_a_rank_it_terminated_is_a_victim():
    # NCCL ranks spin in the collective; torchrun SIGTERMs rank 0 right after rank 1 was SIGKILLed.
    r0 = outcome(0, report(0, stage="all_gather_large", ops=[]), exit="killed by SIGTERM")
    r1 = outcome(1, report(1, stage="all_gather_large", ops=[]), exit="killed by SIGKILL")
    (x,) = nccl.judge_run(facts([r0, r1], ended="exit 1", returncode=1, root_cause=1))
    assert x.summary == "rank 1 (GPU 1) died in all_gather_large (op 1) (killed by SIGKILL)"
    # without torchrun's word, SIGTERM still marks the victim
    (x,) = nccl.judge_run(facts([r0, r1], ended="exit 1", returncode=1))
    assert x.summary.startswith("rank 1 (GPU 1) died")


def test_torchrun_failing_before_any_rank_speaks_is_blamed_on_torchrun():
    silent = [outcome(r, None, last_line="none") for r in (0, 1)]
    tail = ["torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed."]
    (x,) = nccl.judge_run(facts(silent, ended="exit 1", returncode=1, log_tail=tail))
    assert x.summary == "torchrun never started the ranks" and "RendezvousConnectionError" in x.cause
    assert "never reported" not in x.cause and "[timeouts]" not in x.remedy


def test_pcie_shm_warns_only_for_gpus_under_one_switch_when_the_topology_is_known():
    f = four_ranks(nccl_fixture("09"))  # SHM on 1->2 and 3->0
    assert nccl.judge_transports(f, expect(p2p="warn", p2p_source="test"), set(), {frozenset({0, 1}), frozenset({2, 3})}) == []
    (x,) = nccl.judge_transports(f, expect(p2p="warn", p2p_source="test"), set(), {frozenset({1, 2})})
    assert x.status is WARN and "rank 1 (GPU 1) -> rank 2 (GPU 2)" in x.cause and "rank 3" not in x.cause
    (x,) = nccl.judge_transports(f, expect(p2p="warn", p2p_source="test"), set(), None)  # no topology: every pair
    assert x.summary == "GPUs fall back from P2P (2 pairs)"


def test_a_rank_that_raised_leads_over_the_peer_torchrun_then_terminated():
    raised = outcome(1, report(1, stage="broadcast_small", ops=[], error="RuntimeError: CUDA error: unspecified launch failure", error_time=5.0), exit="exit 1")
    victim = outcome(0, report(0, stage="broadcast_small", ops=[]), exit="killed by SIGTERM")
    (x,) = nccl.judge_run(facts([victim, raised], ended="exit 1", returncode=1, root_cause=1))
    assert x.summary == "rank 1 (GPU 1) failed in broadcast_small (op 1)"
    assert x.cause.index("unspecified launch failure") < x.cause.index("rank 0 (GPU 0) died")
    (x,) = nccl.judge_run(facts([victim, raised], ended="exit 1", returncode=1))  # no summary from torchrun
    assert x.summary.startswith("rank 1 (GPU 1) failed")


def test_of_two_ranks_that_raised_the_earlier_error_leads_whichever_exit_torchrun_saw_first():
    # Rank 1 raised; rank 0's collective then failed. On a busy machine both exited within one of
    # torchrun's polls, and torchrun named rank 0 as its first observed failure.
    raised = outcome(1, report(1, stage="all_reduce_fp32_small", ops=[], error="RuntimeError: PREFLIGHT_WORKER_FAULT asked rank to raise", error_time=5.0), exit="exit 1")
    waited = outcome(0, report(0, stage="all_reduce_fp32_small", ops=[], error="RuntimeError: gloo: Connection closed by peer", error_time=5.2), exit="exit 1")
    (x,) = nccl.judge_run(facts([waited, raised], ended="exit 1", returncode=1, root_cause=0))
    assert x.summary == "rank 1 (GPU 1) failed in all_reduce_fp32_small (op 1)"
    assert x.cause.startswith("rank 1 (GPU 1) failed first") and "rank 0 (GPU 0) then failed" in x.cause


def test_across_nodes_sockets_on_an_ib_profile_fail_naming_the_cause():
    # A group run's facts (2 nodes, one GPU each): this node has rank 0; NCCL's log says sockets because IB was disabled.
    from preflight.readers.nccl import nccl_net

    path = next((FIXTURES / "nccl" / "net-logs").glob("net-socket-ib-disabled-no-device_*.log"))
    text = path.read_text()
    f = NcclFacts(python="python", backend="nccl", nproc=1, nccl=nccl_log.parse(text), nccl_text=text,
                  net=nccl_net.NetFacts(env={"NCCL_IB_DISABLE": "1"}))
    f.ranks = [RankOutcome(rank=0, gpu="GPU 0", global_rank=0, node="node 0 (a)")]
    expect = NcclExpect(init_source="test", network="ib_gdrdma", network_source="test")
    found, details = nccl.judge_network(f, expect)
    assert found and found[0].status == Status.FAIL and "NCCL_IB_DISABLE" in found[0].cause and details
    alone = f.model_copy(update={"net": None})  # one node: no network judged
    assert nccl.judge_network(alone, expect) == ([], None)


def test_the_details_carry_nccl_s_nvls_channels_for_the_bandwidth_check(monkeypatch):
    # In a shared launch bandwidth reuses this stage's communicator, whose "K nvls channels" line
    # NCCL printed here, at its init (checkkit/nvls.py from_shared).
    monkeypatch.setattr(nccl, "gather", lambda *a, **kw: healthy(2, nccl=nccl_fixture("02"), world={"launch": 1, "stage": 2, "ended_it": False}))
    from preflight.pipeline import profiles

    ctx = make_ctx()
    path = profiles.BUILTIN_DIR / "h100-sxm.toml"
    ctx.profile = profiles.resolve(profiles.load(path), path, {}, "test")
    r = nccl.Nccl().run(ctx)
    assert r.details["nccl_log"]["nvls_channels"] == 0 and r.details["world"]["launch"] == 1


# --- the GPU pairs where the topology check did not run (`--only nccl`) -----------------

A100_PCIE = FIXTURES / "nvml" / "a100-pcie-2x.json"
SPLIT_TOPO = FIXTURES / "topo" / "08_a100-pcie-2x_no-nvlink_SYS_split-numa-0-1_2mlx5.txt"


def pcie_ctx(tmp_path, capture=SPLIT_TOPO):
    """The a100-pcie profile on the two cards NVML's recording holds, `nvidia-smi topo -m` printing ``capture``."""
    path = fakes.nvidia_smi(tmp_path / "bin", capture)
    profile = profiles.resolve(profiles.load(profiles.BUILTIN_DIR / "a100-pcie.toml"), profiles.BUILTIN_DIR / "a100-pcie.toml", {}, "--profile a100-pcie")
    return Context(profile=profile, settings=Settings(nvml_fake=A100_PCIE), host=Host(environ={"PATH": str(path)}), deadline=time.monotonic() + 60)


SHM_PAIR = "NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct\nNCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct\n"


def test_without_the_topology_check_the_matrix_is_read_so_a_cross_socket_pair_on_shm_is_no_fallback(tmp_path):
    # Two A100 PCIe cards on two sockets (SYS): NCCL joins them through host memory by its own default
    # level on an Intel host. With `--only nccl` no topology result says so; every SHM pair warned.
    ctx = pcie_ctx(tmp_path)
    layout = layout_of(ctx)
    assert gpu_pairs(layout) == {frozenset({0, 1}): "SYS"}
    f = facts([outcome(0, report(0)), outcome(1, report(1))], nccl=nccl_log.parse(SHM_PAIR))
    assert nccl.judge_transports(f, expect(p2p="warn"), linked_pairs(layout, ("NV",)) or set(), linked_pairs(layout, ("PIX", "PXB"))) == []
    # Nothing known of the pairs, as before: each SHM pair is a fallback.
    assert [x.status for x in nccl.judge_transports(f, expect(p2p="warn"), set(), None)] == [WARN]


def test_without_the_topology_check_a_pair_under_one_switch_on_shm_still_warns(tmp_path):
    capture = tmp_path / "topo.txt"
    capture.write_text(SPLIT_TOPO.read_text().replace("GPU0\t X \tSYS", "GPU0\t X \tPIX").replace("GPU1\tSYS\t X ", "GPU1\tPIX\t X "))
    layout = layout_of(pcie_ctx(tmp_path, capture))
    assert gpu_pairs(layout) == {frozenset({0, 1}): "PIX"}
    f = facts([outcome(0, report(0)), outcome(1, report(1))], nccl=nccl_log.parse(SHM_PAIR))
    (x,) = nccl.judge_transports(f, expect(p2p="warn"), linked_pairs(layout, ("NV",)) or set(), linked_pairs(layout, ("PIX", "PXB")))
    assert x.status is WARN and "rank 0 (GPU 0) -> rank 1 (GPU 1) via SHM/direct/direct" in x.cause


def test_the_topology_check_s_own_reading_is_not_read_again(tmp_path):
    ctx = pcie_ctx(tmp_path / "none")  # an nvidia-smi that would fail the test if run: it is not
    done = Result(check="topology", status=Status.WARN, summary="GPU layout not judged", details={"matrix": None})
    ctx.results["topology"] = done
    assert layout_of(ctx) is done
    ctx.results["topology"] = Result(check="topology", status=Status.SKIP, summary="profile has no [topology] table")
    assert layout_of(ctx).details["matrix"]["links"] == {"0-1": "SYS"}
