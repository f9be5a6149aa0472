"""TOML files people write (preflight/pipeline/tomlfile.py): whatever the file, one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from preflight.base.errors import UsageError
from preflight.pipeline import tomlfile

PROFILES = Path(__file__).parents[2] / "preflight" / "pipeline" / "profiles"


@pytest.mark.parametrize("depth", [17, 300, 1000, 5000])
def test_nesting_past_any_real_file_is_one_line(tmp_path, depth):
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(UsageError, match=r"nests tables or arrays more than 16 deep; no config or profile goes past 4"):
        tomlfile.load(path, "config")
    path.write_text(f"[{'.'.join(['t'] * depth)}]\nx = 1\n")  # tables, one dotted header
    with pytest.raises(UsageError, match="nests tables or arrays more than 16 deep"):
        tomlfile.load(path, "profile")


def test_every_shipped_profile_is_well_within_the_depth():
    for path in PROFILES.glob("*.toml"):
        data, _ = tomlfile.load(path, "profile")
        assert tomlfile.depth(data) <= 4, path


def test_a_fifo_is_judged_by_what_was_opened_and_never_blocks(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        tomlfile.load(fifo, "config")
