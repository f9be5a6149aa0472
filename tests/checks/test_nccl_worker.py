"""How the nccl_smoke worker (checks/workers/nccl_smoke.py) times its ops, run
without a GPU: on NCCL no blocking wait (its 1-10 ms polling sleep would
land in every small op's figure), CUDA events around the op, waited for by
spinning with a deadline (checks/workers/_rank.py, shared with the bandwidth
worker). The GPU path itself runs only on a GPU node (test_nccl.py's gpu
test); gloo runs for real in test_nccl.py."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
import _rank  # noqa: E402

_spec = importlib.util.spec_from_file_location("nccl_smoke_worker", launch.WORKERS_DIR / "nccl_smoke.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


class Event:
    """A CUDA event stand-in: done after ``polls`` queries; what it was asked, in order, in ``log``."""

    def __init__(self, log: list[str], name: str, polls: int = 0, ms: float = 0.0):
        self.log, self.name, self.polls, self.ms = log, name, polls, ms
        self.queries = 0

    def record(self) -> None:
        self.log.append(f"record {self.name}")

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.polls

    def elapsed_time(self, end: Event) -> float:
        return end.ms


class Work:
    def __init__(self, log: list[str], name: str, polls: int = 0):
        self.log, self.name, self.polls, self.checks = log, name, polls, 0

    def wait(self) -> bool:
        self.log.append(f"wait {self.name}")
        return True

    def is_completed(self) -> bool:
        self.checks += 1
        return self.checks > self.polls


class Torch:
    """torch as the timing code uses it on a GPU: Event, synchronize."""

    def __init__(self, log: list[str], ms: float = 0.042):
        self.log, made = log, []
        ends = iter([Event(log, "begin"), Event(log, "end", polls=50, ms=ms)])

        class Cuda:
            @staticmethod
            def Event(enable_timing: bool = False):  # noqa: N802 - torch's name
                assert enable_timing
                made.append(next(ends))
                return made[-1]

            @staticmethod
            def synchronize(device) -> None:
                log.append("synchronize")

        self.cuda, self.events = Cuda, made


class Device:
    type, index = "cuda", 0


class Dist:
    def __init__(self):
        self.init = {}

    def init_process_group(self, backend, timeout=None, device_id=None):
        self.init = {"backend": backend, "timeout": timeout.total_seconds(), "blocking_wait": os.environ.get("TORCH_NCCL_BLOCKING_WAIT")}

    all_gather_into_tensor = reduce_scatter_tensor = None


def ops(log: list[str], ms: float = 0.042):
    return worker.Ops(Torch(log, ms), Dist(), Device(), rank=0, world=2, timeout=5.0)


def test_spin_returns_once_done_without_sleeping():
    event = Event([], "end", polls=20000)
    start = time.monotonic()
    _rank.spin(event.query, 5.0, "an all_reduce")
    # 20000 polls: a 1 ms sleep between them would take 20 s.
    assert event.queries == 20001 and time.monotonic() - start < 2.0


def test_spin_past_its_deadline_raises_naming_what_it_waited_for():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^the small all_reduce not done after 0.2 s: a peer stopped, or this GPU hangs$"):
        _rank.spin(lambda: False, 0.2, "the small all_reduce")
    assert 0.2 <= time.monotonic() - start < 2.0


def test_wait_for_gpu_records_an_event_where_none_is_given():
    log: list[str] = []
    torch = Torch(log)
    torch.cuda.Event = lambda: Event(log, "marker", polls=3)
    _rank.wait_for_gpu(torch, 1.0, "a barrier")
    assert log == ["record marker"]


def test_an_nccl_op_is_timed_by_cuda_events_the_host_spinning_on_the_end():
    log: list[str] = []
    o = ops(log, ms=0.042)
    seconds = o._timed(lambda: [Work(log, "all_reduce")], "all_reduce")
    assert seconds == 0.000042  # the events' figure, not the host clock's
    assert log == ["synchronize", "record begin", "wait all_reduce", "record end"]  # nothing after the end: no host sync
    assert o.torch.events[1].queries == 51  # spun on the end event until done


def test_an_nccl_barrier_is_waited_for_by_spinning_before_its_wait_syncs():
    log: list[str] = []
    work = Work(log, "barrier", polls=30)
    ops(log)._timed(lambda: [work], "barrier")
    assert work.checks == 31 and log.index("wait barrier") < log.index("record end")


def test_an_nccl_op_that_never_finishes_raises_at_the_deadline():
    log: list[str] = []
    o = ops(log)
    o.timeout = 0.2
    o.torch.events.clear()
    stuck = Event(log, "end", polls=10**12)
    o.torch.cuda.Event = staticmethod(lambda enable_timing=False: stuck)
    with pytest.raises(TimeoutError, match=r"^send_recv not done after 0.2 s"):
        o._timed(lambda: [Work(log, "send"), Work(log, "recv")], "send_recv")


@pytest.mark.parametrize("backend, timeout", [("nccl", 30.0 + _rank.GRACE), ("gloo", 30.0)])
def test_the_group_has_no_blocking_wait_and_outlasts_the_rank_s_own_deadline(monkeypatch, backend, timeout):
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")  # restored after the test
    dist = Dist()
    worker.start_group(dist, backend, "cuda:0" if backend == "nccl" else "cpu", 30.0)
    assert dist.init["timeout"] == timeout
    if backend == "nccl":
        assert dist.init["blocking_wait"] == "0"


def test_a_fault_kind_may_carry_a_number_for_the_worker_to_read(monkeypatch):
    monkeypatch.setenv(_rank.FAULT_ENV, "1:slow=2.5@memcpy,*:wrong=30@burn,0:kill@latency")
    one = _rank.Fault(1, first_op="memcpy")
    assert one.kinds == {"memcpy": "slow", "burn": "wrong"}
    assert one.value("memcpy", 3.0) == 2.5 and one.value("burn", 0.0) == 30.0
    zero = _rank.Fault(0, first_op="memcpy")
    assert zero.kinds == {"burn": "wrong", "latency": "kill"} and zero.value("latency", 3.0) == 3.0
    monkeypatch.setenv(_rank.FAULT_ENV, "1:slow-once=0.5s@memcpy")
    seconds = _rank.Fault(1, first_op="memcpy")
    assert seconds.kinds == {"memcpy": "slow-once"} and seconds.pauses == {"memcpy": 0.5} and seconds.values == {}


def test_a_group_an_earlier_stage_made_outlasts_each_later_worker_s_own_deadline(monkeypatch):
    # Issue 33: train kept the nccl stage's group with its own --timeout as the group's, so NCCL's
    # watchdog fired exactly when the rank's own wait gave up, and killed it without a word.
    set_to = []

    class Reused(Dist):
        distributed_c10d = type("c10d", (), {"_set_pg_timeout": staticmethod(lambda t: set_to.append(t.total_seconds()))})

        def is_initialized(self) -> bool:
            return True

    monkeypatch.setitem(_rank.WORLD, "active", True)
    _rank.init_group(Reused(), "nccl", "cuda:0", 60.0)
    _rank.init_group(Reused(), "gloo", "cpu", 60.0)
    assert set_to == [60.0 + _rank.GRACE, 60.0]
