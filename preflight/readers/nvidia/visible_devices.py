"""CUDA_VISIBLE_DEVICES, read as CUDA reads it: which of the GPUs CUDA would enumerate without
it a process sees. A pure function of the variable's value and those GPUs' UUIDs; the run's
shape (pipeline/visible_gpus.py), the cuda check and the topology judges all read it here.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Visible(NamedTuple):
    """What CUDA_VISIBLE_DEVICES leaves CUDA (``cuda_visible``)."""

    picked: list[int]  # positions in CUDA's enumeration without it, in the variable's order
    unplaced: int  # entries CUDA takes whose GPU cannot be told here: a UUID with no NVML to match, a MIG instance
    stop: str | None  # where CUDA stops and why, or the repeat that empties the list; None where it reads every entry

    @property
    def count(self) -> int:
        return len(self.picked) + self.unplaced


def _stops(item: str, why: str) -> str:
    return f"CUDA stops at {item!r}: {why}, so no entry after it counts"


def _strtoul(text: str) -> int:
    """The number ``text`` starts with, -1 where it starts with none ("1gpu" is 1)."""
    digits = re.match(r"[+-]?[0-9]*", text).group()  # type: ignore[union-attr]
    return int(digits) if digits.lstrip("+-") else -1


def cuda_visible(value: str, uuids: list[str | None]) -> Visible:
    """The devices CUDA shows under CUDA_VISIBLE_DEVICES=``value``, of the GPUs it enumerates
    without it (``uuids``: each one's NVML UUID, "GPU-...", in CUDA's order; None where not known).
    Read as torch models CUDA's own reading (torch/cuda/__init__.py, _parse_visible_devices and
    _transform_uuid_to_ordinals): the value's start says what it lists. "GPU-" (or "MIG-"): UUIDs,
    each enough of one to name a single GPU, up to the first entry of another kind or one that names
    no GPU or several. Otherwise indices, each read as strtoul reads it ("1gpu" is 1, spaces around
    it ignored), up to the first that is no number or no GPU of those. A GPU named twice empties the
    list: CUDA shows none. So an empty value, or Slurm's "NoDevFiles", shows none."""
    if value.startswith(("GPU-", "MIG-")):
        prefix, entries, stop = value[:4], [], None
        for item in value.split(","):
            if item in entries:
                return Visible([], 0, f"{item!r} is named a second time, and CUDA then shows no GPU")
            if not item.startswith(prefix):
                stop = _stops(item, f"not a {prefix} entry like the first")
                break
            entries.append(item)
        if prefix == "MIG-" or not uuids or any(u is None for u in uuids):
            return Visible([], len(entries), stop)  # valid or not, nothing here can tell: CUDA's own count will say
        picked: list[int] = []
        for item in entries:
            match = [k for k, u in enumerate(uuids) if u is not None and u.startswith(item)]
            if len(match) != 1:
                return Visible(picked, 0, _stops(item, f"{'no GPU here has' if not match else f'{len(match)} GPUs here have'} that UUID"))
            if match[0] in picked:
                return Visible([], 0, f"{item!r} names GPU {match[0]} a second time, and CUDA then shows no GPU")
            picked.append(match[0])
        return Visible(picked, 0, stop)
    # As torch orders it: the list read whole first (a repeat empties it, a non-number ends it),
    # then cut at the first index past the GPUs there are.
    listed: list[tuple[str, int]] = []
    stop = None
    for item in value.split(","):
        i = _strtoul(item.strip())
        if i in [n for _, n in listed]:
            return Visible([], 0, f"{item!r} names GPU {i} a second time, and CUDA then shows no GPU")
        if i < 0:
            stop = _stops(item, "not a GPU index or UUID") if item.strip() else "CUDA stops at an empty entry, so no entry after it counts"
            break
        listed.append((item, i))
    picked = []
    for item, i in listed:
        if i >= len(uuids):
            return Visible(picked, 0, _stops(item, f"there is no GPU {i} among the {len(uuids)} it would show"))
        picked.append(i)
    return Visible(picked, 0, stop)
