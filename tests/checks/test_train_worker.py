"""The train probe worker's own parts (checks/workers/train_probe.py), run
in this process: the memory arithmetic that shrinks a probe that would not
fit, the bit checksum that must see one flipped bit, and the model's size.
The whole worker runs for real in test_train.py."""

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

GIB = 1 << 30


def test_probe_memory_by_hand():
    # 8 x 1024 tokens x (56 x 1024 x 12 + 16 x 32768) = 8192 x 1,212,416 = 9,932,111,872 bytes of activations and logits;
    # params 12 x 12 x 1024^2 + 32768 x 1024 = 184,549,376 -> x 16 = 2,952,790,016 bytes.
    assert worker.probe_bytes(8, 12, 1024, 1024, 32768) == 9_932_111_872 + 2_952_790_016


def test_a_probe_that_fits_is_left_alone():
    assert worker.fit_model(80 * GIB, 8, 12, 1024, 1024, 32768) == (8, 12)


def test_the_batch_halves_first_until_the_probe_fits_half_the_free_memory():
    # 12.0 GiB at batch 8, 7.4 at 4, 5.1 at 2: with 16 GiB free, half is 8 GiB -> batch 4.
    batch, layers = worker.fit_model(16 * GIB, 8, 12, 1024, 1024, 32768)
    assert (batch, layers) == (4, 12)
    assert worker.probe_bytes(batch, layers, 1024, 1024, 32768) <= 8 * GIB < worker.probe_bytes(8, 12, 1024, 1024, 32768)


def test_then_the_layers_halve_and_one_of_each_is_the_least():
    assert worker.fit_model(4 * GIB, 8, 12, 1024, 1024, 32768)[0] == 1
    assert worker.fit_model(1 << 20, 8, 12, 1024, 1024, 32768) == (1, 1)


def test_one_flipped_bit_changes_the_checksum():
    x = torch.randn(1000)
    y = x.clone()
    y.view(torch.int32)[500] ^= 1  # the last bit of one value's mantissa
    assert worker._bits_checksum(torch, [x]) == worker._bits_checksum(torch, [x.clone()])
    assert worker._bits_checksum(torch, [x]) != worker._bits_checksum(torch, [y])


def test_values_in_another_order_change_the_checksum():
    x = torch.randn(64)
    assert worker._bits_checksum(torch, [x]) != worker._bits_checksum(torch, [x.flip(0)])


@pytest.mark.parametrize("layers, d, heads, seq, vocab", [(2, 64, 4, 64, 256), (1, 32, 2, 16, 64)])
def test_the_model_has_the_parameters_the_flop_count_assumes(layers, d, heads, seq, vocab):
    model = worker._gpt(torch, vocab, d, heads, layers, seq)
    # 12 d^2 a block (qkv 3, proj 1, MLP 8), the tied embedding once, positions, and the norms' d each.
    assert sum(p.numel() for p in model.parameters()) == 12 * layers * d * d + vocab * d + seq * d + (2 * layers + 1) * d
    logits = model(torch.randint(0, vocab, (2, seq)))
    assert logits.shape == (2, seq, vocab)


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
