"""How a failed run's ranks are blamed (preflight/gpuwork/ranks_judge.py): the words for
where a rank stopped, and a rank waiting at a barrier told from the one it waits for. The
rest of the blame is tested through the checks that use it (tests/checks/test_nccl_judge.py)."""

from __future__ import annotations

from preflight.gpuwork import ranks, ranks_judge


def test_where_a_rank_stopped_counts_its_steps_from_one():
    base = dict(rank=0, local_rank=0, world_size=2, host="n", pid=1, python="p", backend="gloo", device="cpu")
    assert ranks_judge.stage_words(ranks.RankReport(stage="init", **base)) == "in init_process_group"
    assert ranks_judge.stage_words(ranks.RankReport(stage="all_gather", **base)) == "in all_gather (step 1)"
    assert ranks_judge.stage_words(None) == ""


def _rank_at(rank: int, stage: str, waiting: str | None = None) -> ranks.RankOutcome:
    report = ranks.RankReport(rank=rank, local_rank=rank, world_size=2, host="h", pid=100 + rank, python="python",
                              stage=stage, backend="gloo", device="cpu", waiting=waiting)
    return ranks.RankOutcome(rank=rank, gpu=None, report=report, last_line=f"rank {rank}'s last line")


def test_a_rank_waiting_at_a_barrier_for_a_hung_peer_is_the_symptom_not_the_cause():
    # bandwidth's memcpy, one rank at a time: rank 1 stopped before its turn, rank 0 waits at the
    # barrier between turns (whose deadline is longer than the check's), and the deadline ends both.
    f = ranks.RunFacts(python="python", backend="gloo", nproc=2, timed_out=True, ended="killed at the deadline",
                       ranks=[_rank_at(0, "memcpy", waiting="the barrier between turns"), _rank_at(1, "memcpy")])
    (found,) = ranks_judge.judge_run(f, "the bandwidth worker", "by hand")
    assert found.summary == "rank 1 hung in memcpy (step 1)"
    assert found.cause.startswith("rank 1 hung in memcpy (step 1) and was stopped at the deadline: last log line: rank 1's last line; ")
    assert "rank 0 waited in memcpy (step 1) at the barrier between turns for the rank(s) that never came" in found.cause
    # Every rank waiting (no peer to wait for): each is hung, as before.
    f.ranks[1] = _rank_at(1, "memcpy", waiting="the barrier between turns")
    assert ranks_judge.judge_run(f, "the bandwidth worker", "by hand")[0].summary == "rank 0 hung in memcpy (step 1)"
