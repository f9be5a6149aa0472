"""The train probe worker's own parts (checks/workers/train_probe.py and its
GEMM stage, _probe_gemm.py), run in this process: the GEMM's warm-up, and every
wait with a deadline. The model's arithmetic is test_probe_model.py's; the
whole worker runs for real in test_train.py."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys

import pytest
import torch

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
_spec = importlib.util.spec_from_file_location("train_probe_worker", launch.WORKERS_DIR / "train_probe.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def probe_for_gemm(warmup_seconds: float):
    """A Probe with what its gemm stage uses, on this CPU, one rank (no process group)."""
    probe = object.__new__(worker.Probe)
    probe.torch, probe.cuda, probe.device, probe.factor, probe.pause = torch, False, torch.device("cpu"), None, None
    probe.args = argparse.Namespace(gemm_n=64, gemm_burst=5, gemm_warmup_seconds=warmup_seconds, gemm_repeats=5, max_gemm_repeats=5,
                                    tolerance=10.0, max_seconds=60.0)
    probe._more = lambda flag: flag
    return probe


def test_the_gemm_runs_untimed_bursts_until_the_clocks_settle_before_it_times_one():
    # The H200's first burst after two warm-up matmuls read 741 TFLOP/s, the nine after 629-678:
    # boost, then the power cap (tests/fixtures/node/h200-1x-vm/report-standard-keep-going.json).
    report: dict = {}
    probe_for_gemm(0.2).gemm(report, None, lambda: None)
    assert report["gemm_warmup"]["seconds"] >= 0.2 and report["gemm_warmup"]["matmuls"] > 2
    assert (report["gemm_warmup"]["matmuls"] - 2) % 5 == 0  # whole bursts after the first two
    assert len(report["gemm_seconds"]) == 5 and all(s > 0 for s in report["gemm_seconds"])


def test_no_warm_up_seconds_still_runs_two_matmuls_first():
    report: dict = {}
    probe_for_gemm(0).gemm(report, None, lambda: None)
    assert report["gemm_warmup"]["matmuls"] == 2


# --- every wait has a deadline (issue 33) ---------------------------------------------------------


class Pending:
    def item(self):
        raise AssertionError("item() waited on the GPU with no deadline")


class StuckGpu:
    """A rank's GPU whose peer stopped: what NCCL queued never completes. A wait with no
    deadline would block for ever; here it fails the test instead."""

    float32, int64 = "float32", "int64"

    class cuda:  # noqa: N801 - torch's name
        class Event:
            def record(self) -> None:
                pass

            def query(self) -> bool:
                return False

        @staticmethod
        def synchronize(device=None) -> None:
            raise AssertionError("torch.cuda.synchronize waited with no deadline")

    @staticmethod
    def tensor(values, dtype=None, device=None) -> Pending:
        return Pending()

    @staticmethod
    def zeros_like(t) -> Pending:
        return Pending()


class Work:
    def wait(self) -> bool:
        return True  # NCCL without blocking wait: the stream waits, the host goes on


class Dist:
    class ReduceOp:
        MAX = MIN = "max"

    def all_reduce(self, t, op=None, async_op=False):
        return Work() if async_op else None

    def all_gather(self, out, t, async_op=False):
        return Work() if async_op else None


@pytest.mark.parametrize("call, args, what", [
    ("_more", (1.0,), "agreeing on more repeats"),
    ("_gather", (12345,), "gathering every rank's checksum"),
    ("_sync", ("training step 3 (its gradient all-reduce)",), "training step 3 (its gradient all-reduce)"),
])
def test_a_wait_on_a_peer_that_stopped_raises_at_the_deadline_naming_what_it_waited_for(call, args, what):
    import argparse

    import _rank

    probe = worker.Probe.__new__(worker.Probe)
    probe.torch, probe.dist, probe.device, probe.cuda = StuckGpu, Dist(), torch.device("cuda", 0), True
    probe.args, probe.me = argparse.Namespace(timeout=0.2), _rank.Rank(0, 0, 2, 2)
    with pytest.raises(TimeoutError, match="^" + re.escape(f"{what} not done after 0.2 s: a peer stopped")):
        getattr(probe, call)(*args)
