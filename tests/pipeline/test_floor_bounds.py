"""How far a floor may go before it judges nothing (preflight/pipeline/floor_bounds.py).
The commands' answers (exit 2, nothing written, no /dev/shm segment) are in tests/cli/test_bad_input.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.pipeline import floor_bounds, profiles, registry
from preflight.pipeline.floor_bounds import BY_UNIT

PROFILES = Path(__file__).parents[2] / "preflight" / "pipeline" / "profiles"


@pytest.mark.parametrize("value, unit, bound, words", [
    (0, "bytes", "min", "= 0 bytes (0 B) passes every node"),
    (16, "bytes", "min", "= 16 bytes (16 B) judges nothing: under 1 MiB"),
    (16, "bytes_per_second", "min", "under 1e-06 GB/s"),
    (0, "seconds", "max", "fails every node"),
    (7200, "seconds", "max", "over 3600.00 s"),
    (0.001, "ratio", "min", "under 0.01"),
])
def test_a_floor_that_judges_nothing_says_why_and_what_would(value, unit, bound, words):
    why = floor_bounds.problem(value, unit, bound, BY_UNIT[unit])
    assert why is not None and words in why and "give at " in why


def test_a_plugin_s_floor_in_its_own_terms_is_held_only_above_0():
    assert floor_bounds.problem(1, "bytes", "min", None) is None  # a plugin that names no sane range: any floor above 0
    assert "passes every node" in floor_bounds.problem(0, "widgets", "min", None)


def test_every_floor_every_shipped_profile_sets_judges_something():
    sane = {}
    for name in registry.names():
        sane.update(registry.load(name).floor_sane)
    assert {"shm_min_bytes", "memcpy_bandwidth", "gemm_throughput", "allreduce_latency", "vcpus_per_gpu"} <= set(sane)
    for path in PROFILES.glob("*.toml"):
        for name, f in profiles.load(path).floors.items():
            assert floor_bounds.problem(f.value, f.unit, f.bound, sane.get(name)) is None, (path.name, name)
