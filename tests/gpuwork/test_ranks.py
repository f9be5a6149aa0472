"""The shared torchrun run logic (preflight/gpuwork/ranks.py): when a failed run has
settled, and the words for a rank (its GPU, the rerun hint). How ranks are blamed:
tests/gpuwork/test_ranks_judge.py."""

from __future__ import annotations

import pytest

from preflight.gpuwork import ranks


# --- settle_rule: stop once the ranks left alive have stopped moving --------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunning:
    """Stands in for launch.Running: ``report(rank)`` is what that rank wrote so far."""

    def __init__(self, reports: dict[int, dict | None]) -> None:
        self.reports = reports

    def report(self, rank: int = 0):
        return self.reports.get(rank)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(ranks.time, "monotonic", c)
    return c


def at(clock: Clock, rule, running: FakeRunning, t: float) -> bool:
    clock.now = t
    return rule(running)


ERR = {"stage": "all_gather_large", "ops": [{}] * 8, "error": "DistBackendError: Connection reset by peer"}


def test_without_an_error_it_never_settles(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: {"stage": "all_gather_large", "ops": [{}] * 8}, 1: {"stage": "import"}})
    assert [at(clock, rule, running, t) for t in (0, 3, 33, 1000, 10_000)] == [False] * 5


def test_an_error_and_a_peer_stuck_in_an_op_settles_after_stuck_seconds(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: dict(ERR), 1: {"stage": "all_gather_large", "ops": [{}] * 8, "error": None}})
    assert at(clock, rule, running, 100.0) is False
    assert at(clock, rule, running, 102.9) is False
    assert at(clock, rule, running, 103.0) is True


def test_a_peer_importing_or_in_init_gets_the_waiting_time(clock):
    for stage in ("import", "init", None):
        rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
        running = FakeRunning({0: dict(ERR), 1: {"stage": stage} if stage else {}})
        assert at(clock, rule, running, 0.0) is False
        assert at(clock, rule, running, 3.0) is False, stage
        assert at(clock, rule, running, 32.9) is False, stage
        assert at(clock, rule, running, 33.0) is True, stage


def test_a_peer_with_no_report_yet_gets_the_waiting_time(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: dict(ERR), 1: None})
    assert at(clock, rule, running, 0.0) is False
    assert at(clock, rule, running, 10.0) is False
    assert at(clock, rule, running, 33.0) is True


def test_a_peer_that_keeps_progressing_resets_its_clock(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    peer = {"stage": "all_reduce_fp32_large", "ops": [{}] * 6}
    running = FakeRunning({0: dict(ERR), 1: peer})
    assert at(clock, rule, running, 0.0) is False
    running.reports[1] = {"stage": "all_reduce_fp32_large", "ops": [{}] * 7}  # one more op done
    assert at(clock, rule, running, 2.0) is False
    assert at(clock, rule, running, 4.0) is False  # 2 s since it moved
    running.reports[1] = {"stage": "all_reduce_bf16_large", "ops": [{}] * 7}  # a new stage
    assert at(clock, rule, running, 4.5) is False
    assert at(clock, rule, running, 7.4) is False
    assert at(clock, rule, running, 7.5) is True


def test_an_erroring_peer_counts_as_settled_at_once(clock):
    rule = ranks.settle_rule(3, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: dict(ERR), 1: {**ERR, "error": "DistBackendError: remote process exited"}, 2: {"stage": "done", "ops": [{}] * 13}})
    assert at(clock, rule, running, 0.0) is True


def test_every_live_rank_must_be_idle(clock):
    rule = ranks.settle_rule(3, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: dict(ERR), 1: {"stage": "broadcast_small", "ops": [{}] * 4}, 2: {"stage": "init"}})
    assert at(clock, rule, running, 0.0) is False
    assert at(clock, rule, running, 3.0) is False  # rank 1 is stuck, rank 2 may still be in init
    assert at(clock, rule, running, 33.0) is True


def test_every_rank_done_but_never_exiting_settles_after_the_grace(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: {"stage": "done", "ops": [{}] * 13}, 1: {"stage": "done", "ops": [{}] * 13}})
    assert at(clock, rule, running, 0.0) is False
    assert at(clock, rule, running, ranks.DONE_GRACE - 0.1) is False
    assert at(clock, rule, running, ranks.DONE_GRACE) is True


def test_a_rank_idle_once_a_peer_finished_settles_after_the_waiting_time(clock):
    # Burn-in and memtest ranks wait on no peer: a rank that hangs there raises no error anywhere.
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: {"stage": "burnin", "step": 40}, 1: {"stage": "burnin", "step": 12}})
    assert at(clock, rule, running, 0.0) is False
    running.reports[0] = {"stage": "done", "step": 80}
    assert at(clock, rule, running, 50.0) is False  # idle 50 s, but counted from the peer's finish
    assert at(clock, rule, running, 82.9) is False
    assert at(clock, rule, running, 83.0) is True


def test_a_rank_still_progressing_after_its_peer_finished_is_waited_for(clock):
    rule = ranks.settle_rule(2, stuck=3.0, waiting=33.0)
    running = FakeRunning({0: {"stage": "done", "step": 66}, 1: {"stage": "walking_ones", "step": 30}})
    assert at(clock, rule, running, 0.0) is False
    for t in range(10, 200, 10):
        running.reports[1] = {"stage": "walking_ones", "step": 30 + t}
        assert at(clock, rule, running, float(t)) is False


# --- the words for a rank and where it stopped -----------------------------------


def test_a_local_rank_is_nvidia_smi_s_gpu_unless_cuda_visible_devices_renumbers():
    assert ranks.gpu_of(3, {}, "nccl") == "GPU 3"
    assert ranks.gpu_of(1, {"CUDA_VISIBLE_DEVICES": "4,6"}, "nccl") == "GPU 6"
    assert ranks.gpu_of(0, {"CUDA_VISIBLE_DEVICES": "GPU-8f2c"}, "nccl") == "CUDA device 0"
    assert ranks.gpu_of(0, {}, "gloo") is None
    assert ranks.gpu_index("GPU 6") == 6 and ranks.gpu_index("CUDA device 0") is None and ranks.gpu_index(None) is None


def test_the_rerun_hint_is_the_torchrun_command_the_check_ran():
    f = ranks.RunFacts(python="/opt/venv/bin/python", backend="gloo", nproc=2)
    hint = ranks.by_hand(f, "bandwidth.py")
    assert hint.startswith("run it by hand to see more: /opt/venv/bin/python -m torch.distributed.run --nproc-per-node 2 ")
    assert hint.endswith("workers/bandwidth.py --backend gloo --device cpu")


def test_a_rank_inside_its_own_wait_is_not_taken_for_hung_before_that_wait_s_deadline(clock):
    # Three ranks, rank 1 stopped: rank 0's wait timed out first, rank 2 is still inside its own 4 s wait.
    rule = ranks.waited_out(3, op_timeout=4.0)
    running = FakeRunning({0: dict(ERR), 1: {"stage": "steps", "step": 2}, 2: {"stage": "steps", "step": 2}})
    assert at(clock, rule, running, 0.0) is False
    assert at(clock, rule, running, 3.5) is False  # under settle_rule's 3 s, rank 2 would be named hung here
    running.reports[2] = {**ERR, "error": "TimeoutError: training step 3 not done after 4 s: a peer stopped, or this GPU hangs"}
    assert at(clock, rule, running, 4.2) is False  # rank 1 silent 4.2 s: it may still be in a wait of its own
    assert at(clock, rule, running, 4.0 + ranks.STUCK) is True
