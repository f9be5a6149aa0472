"""The cap on drains, judged on recorded `sinfo -h -N -p P -o %N|%R|%E` output."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from preflight.outputs.schedulers import slurm, slurm_cap

SINFO = FIXTURES / "slurm"


def rows(name: str) -> list[slurm_cap.Row]:
    return slurm_cap.parse_sinfo((SINFO / name).read_text())


@pytest.mark.parametrize(("nodes", "allowed"), [(1, 1), (9, 1), (10, 1), (20, 2), (29, 2), (30, 3), (100, 10)])
def test_the_share_allowed_is_at_least_one_node(nodes, allowed):
    assert slurm_cap.allowed(0.10, nodes) == allowed


def test_reasons_with_a_bar_and_blank_lines_are_read():
    got = slurm_cap.parse_sinfo("a|p|preflight [node] drain: x FAIL: a|b\n\nb|p|none\n")
    assert got == [slurm_cap.Row("a", "p", "preflight [node] drain: x FAIL: a|b"), slurm_cap.Row("b", "p", "none")]
    with pytest.raises(ValueError, match="not NODE|PARTITION|REASON"):
        slurm_cap.parse_sinfo("just a node\n")


def test_one_node_drained_by_preflight_of_three_holds_the_next():
    found = slurm_cap.counts("node2", ["test"], rows("sinfo-3-nodes-1-drained.txt"), 0.10, slurm.ours)
    assert found == [slurm_cap.Count("test", 1, 3, 1)]
    full = slurm_cap.past_cap(found)
    assert slurm_cap.would_drain(full, 0.10).startswith("would drain: 1 of 3 nodes already drained by preflight, past the cap")


def test_an_admins_drain_and_the_node_itself_do_not_count():
    found = slurm_cap.counts("node1", ["test"], rows("sinfo-3-nodes-1-drained.txt"), 0.10, slurm.ours)
    assert found == [slurm_cap.Count("test", 0, 3, 1)] and slurm_cap.past_cap(found) is None


def test_the_fullest_of_several_partitions_holds():
    found = slurm_cap.counts("node2", ["test", "big"], rows("sinfo-3-nodes-1-drained.txt"), 0.5, slurm.ours)
    assert slurm_cap.past_cap(found) == slurm_cap.Count("test", 1, 3, 1)
    assert slurm_cap.past_cap(slurm_cap.counts("node2", ["test"], rows("sinfo-3-nodes-1-drained.txt"), 0.7, slurm.ours)) is None
