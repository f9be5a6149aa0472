"""The train probe's model (checks/workers/_probe_model.py), run in this process:
the memory arithmetic that shrinks a probe that would not fit, the bit checksum
that must see one flipped bit, and the model's size. The whole worker runs for
real in test_train.py."""

from __future__ import annotations

import sys

import pytest
import torch

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # as torchrun runs the workers: siblings import by bare name
import _probe_model as probe_model  # noqa: E402

GIB = 1 << 30


def test_probe_memory_by_hand():
    # 8 x 1024 tokens x (56 x 1024 x 12 + 16 x 32768) = 8192 x 1,212,416 = 9,932,111,872 bytes of activations and logits;
    # params 12 x 12 x 1024^2 + 32768 x 1024 = 184,549,376 -> x 16 = 2,952,790,016 bytes.
    assert probe_model.probe_bytes(8, 12, 1024, 1024, 32768) == 9_932_111_872 + 2_952_790_016


def test_a_probe_that_fits_is_left_alone():
    assert probe_model.fit_model(80 * GIB, 8, 12, 1024, 1024, 32768) == (8, 12)


def test_the_batch_halves_first_until_the_probe_fits_half_the_free_memory():
    # 12.0 GiB at batch 8, 7.4 at 4, 5.1 at 2: with 16 GiB free, half is 8 GiB -> batch 4.
    batch, layers = probe_model.fit_model(16 * GIB, 8, 12, 1024, 1024, 32768)
    assert (batch, layers) == (4, 12)
    assert probe_model.probe_bytes(batch, layers, 1024, 1024, 32768) <= 8 * GIB < probe_model.probe_bytes(8, 12, 1024, 1024, 32768)


def test_then_the_layers_halve_and_one_of_each_is_the_least():
    assert probe_model.fit_model(4 * GIB, 8, 12, 1024, 1024, 32768)[0] == 1
    assert probe_model.fit_model(1 << 20, 8, 12, 1024, 1024, 32768) == (1, 1)


def test_one_flipped_bit_changes_the_checksum():
    x = torch.randn(1000)
    y = x.clone()
    y.view(torch.int32)[500] ^= 1  # the last bit of one value's mantissa
    assert probe_model.bits_checksum(torch, [x]) == probe_model.bits_checksum(torch, [x.clone()])
    assert probe_model.bits_checksum(torch, [x]) != probe_model.bits_checksum(torch, [y])


def test_values_in_another_order_change_the_checksum():
    x = torch.randn(64)
    assert probe_model.bits_checksum(torch, [x]) != probe_model.bits_checksum(torch, [x.flip(0)])


@pytest.mark.parametrize("layers, d, heads, seq, vocab", [(2, 64, 4, 64, 256), (1, 32, 2, 16, 64)])
def test_the_model_has_the_parameters_the_flop_count_assumes(layers, d, heads, seq, vocab):
    model = probe_model.gpt(torch, vocab, d, heads, layers, seq)
    # 12 d^2 a block (qkv 3, proj 1, MLP 8), the tied embedding once, positions, and the norms' d each.
    assert sum(p.numel() for p in model.parameters()) == 12 * layers * d * d + vocab * d + seq * d + (2 * layers + 1) * d
    logits = model(torch.randint(0, vocab, (2, seq)))
    assert logits.shape == (2, seq, vocab)
