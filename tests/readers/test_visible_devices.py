"""CUDA_VISIBLE_DEVICES read as CUDA reads it (preflight/readers/nvidia/visible_devices.py), case by case
against torch's own model of CUDA's reading (torch/cuda/__init__.py, _parse_visible_devices)."""

from __future__ import annotations

import pytest

from preflight.readers.nvidia.visible_devices import cuda_visible

UUIDS = [f"GPU-{i}aaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]


@pytest.mark.parametrize("value, picked, unplaced, stopped", [
    ("2,0", [2, 0], 0, False),
    ("1gpu2,2ampere", [1, 2], 0, False),  # torch's own example: like `1,2`
    ("0,2,-1,1", [0, 2], 0, True),  # the CUDA guide's: what follows -1 is not seen
    ("1,1", [], 0, True),  # a repeat empties the list
    ("GPU-2,GPU-0", [2, 0], 0, False),
    ("GPU-2,1", [2], 0, True),  # the first entry says what the list holds: an index after UUIDs stops it
    ("1,GPU-2", [1], 0, True),
    ("GPU-2,GPU-2", [], 0, True),
    ("GPU-", [], 0, True),  # names every GPU: none in particular
    ("MIG-a,MIG-b", [], 2, False),
    ("", [], 0, True),
    ("NoDevFiles", [], 0, True),
    ("4", [], 0, True),  # no GPU 4 among the 4
    ("0,9,0", [], 0, True),  # the repeat is read before the cut at the GPUs there are: none
])
def test_the_devices_cuda_shows(value, picked, unplaced, stopped):
    vis = cuda_visible(value, UUIDS)
    assert (vis.picked, vis.unplaced, vis.stop is not None) == (picked, unplaced, stopped)


def test_uuids_nothing_here_can_match_are_counted_for_cuda_to_say():
    assert cuda_visible("GPU-2,GPU-0", [None] * 4).count == 2
