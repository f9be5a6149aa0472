"""What a group's meeting finds, judged: recorded meetings in, the words a
node's report gives out. The meetings themselves run for real in
test_multinode_netns.py; here the judge and the launcher's torchrun line."""

from __future__ import annotations

import stat
import sys

import pytest

from preflight.gpuwork import launch, meeting, multinode
from preflight.base.errors import UsageError


def a_meeting(node_rank: int = 0, nnodes: int = 3) -> meeting.Meeting:
    g = multinode.group(nnodes, node_rank, "10.0.0.1:29500", "job-7")
    # Only node rank 0 starts a store; the judge needs none.
    m = meeting.Meeting.__new__(meeting.Meeting)
    m.group, m.side, m.python, m.last, m.host, m.reached, m.broken = g, multinode.LocalSide("10.0.0.2", "eth0"), sys.executable, {}, None, None, False
    return m


def test_a_node_kept_out_is_named_with_its_host_and_reason():
    m = a_meeting(node_rank=1)
    kept_out = {"ok": False, "why": "its shm check did not pass (FAIL): /dev/shm is 64 MiB", "host": "gpu-03", "addr": "10.0.0.3"}
    g = meeting.Gathered("nccl", {0: {"ok": True, "host": "gpu-01", "addr": "10.0.0.1"}, 1: {"ok": True}, 2: kept_out})
    m.last.update(g.nodes)
    summary, cause, remedy = meeting.problem(m, g, 300)
    assert summary == "node 2 (gpu-03, 10.0.0.3) kept out of the group"
    assert "/dev/shm is 64 MiB" in cause and "node 2" in remedy


def test_this_nodes_own_absence_is_not_its_peers_problem():
    m = a_meeting(node_rank=2)
    g = meeting.Gathered("nccl", {0: {"ok": True}, 1: {"ok": True}, 2: {"ok": False, "why": "shm"}})
    assert meeting.problem(m, g, 300) is None


def test_nodes_that_never_came_are_named_with_the_wait():
    m = a_meeting(node_rank=0)
    g = meeting.Gathered("nccl", {0: {"ok": True}}, missing=[1, 2])
    summary, cause, _ = meeting.problem(m, g, 8)
    assert summary == "node 1, node 2 did not come to the nccl meeting within 8 s" and "job-7" in cause


def test_an_unreachable_meeting_point_names_rank_0_and_the_ports():
    m = a_meeting(node_rank=1)
    g = meeting.Gathered("nccl", error="could not reach node rank 0's meeting point 10.0.0.1:29501: DistNetworkError")
    summary, cause, remedy = meeting.problem(m, g, 8)
    assert summary == "could not meet the group at 10.0.0.1:29501"
    assert "node 0 (10.0.0.1) hosts the meeting point" in cause and "29500-29501" in remedy


def test_the_torchrun_line_joins_the_group_from_this_nodes_address(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\nenv > {tmp_path}/env\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    group = launch.Group(2, 1, "10.0.0.1:29500", "job-7-nccl", "10.0.0.2", "eth7", 20)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    launch.start(str(fake), launch.Worker("nccl_smoke.py", nproc=4, group=group), 20).wait()
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:2] == ["-m", "torch.distributed.run"]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--nnodes"] == "2" and pairs["--nproc-per-node"] == "4" and pairs["--rdzv-endpoint"] == "10.0.0.1:29500"
    # torchrun's static rendezvous: this node's rank given, nothing unpickled from the store.
    assert pairs["--rdzv-backend"] == "static" and pairs["--node-rank"] == "1"
    assert pairs["--rdzv-conf"] == "timeout=20" and pairs["--local-addr"] == "10.0.0.2"
    seen = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert seen["GLOO_SOCKET_IFNAME"] == "eth7" and seen["NCCL_SOCKET_IFNAME"] == "eth7" and seen["PREFLIGHT_NODE_RANK"] == "1"
    # The id in the environment: a command line is every user's to read.
    assert "--rdzv-id" not in argv and "job-7-nccl" not in " ".join(argv) and seen["PET_RDZV_ID"] == "job-7-nccl"


def test_local_side_finds_the_interface_towards_the_endpoint():
    side = multinode.local_side(multinode.group(2, 0, "127.0.0.1:29500", "t"))
    assert side.addr == "127.0.0.1" and side.ifname == "lo"


@pytest.mark.parametrize("rank, endpoint, words", [
    (0, "192.0.2.1:29500", "192.0.2.1 is not an address of this node"),  # TEST-NET-1: never this node's
    (1, "no-such-host.invalid:29500", "no-such-host.invalid does not resolve"),
])
def test_local_side_refuses_an_endpoint_it_cannot_use(rank, endpoint, words):
    with pytest.raises(UsageError, match=words):
        multinode.local_side(multinode.group(2, rank, endpoint, "t"))


def test_the_group_record_takes_a_peers_post_as_it_came_but_for_its_rank_and_verdict():
    # A post's "ok" must be the JSON true, and its rank is where it was posted: the report's readers rely on both.
    from types import SimpleNamespace

    from preflight.pipeline.report import GroupRecord

    m = a_meeting(node_rank=1)
    m.reached, m.broken, m.missing = "bandwidth", True, set()  # broken: no more meetings, only the record
    m.final = meeting.Gathered("after", {})
    m.last = {0: {"ok": True, "host": "gpu-01", "phase": "after"}, 1: {"ok": True, "phase": "after"},
              2: {"ok": "true", "node_rank": 7, "host": "gpu-03", "figures": {"internode_allreduce_bus_bandwidth": 4.1e11}}}
    record = meeting.finish(SimpleNamespace(meeting=m, settings=SimpleNamespace(rdzv_timeout=10)), [])
    assert [(n["node_rank"], n["ok"]) for n in record["nodes"]] == [(0, True), (1, True), (2, False)]
    assert record["nodes"][2]["figures"] == {"internode_allreduce_bus_bandwidth": 4.1e11} and "phase" not in record["nodes"][0]
    assert not record["passed"] and record["missing"] == []
    assert GroupRecord.model_validate(record).nodes[2].host == "gpu-03"


def test_this_node_is_never_among_the_missing_of_its_own_record():
    from types import SimpleNamespace

    m = a_meeting(node_rank=1, nnodes=2)
    m.reached, m.broken, m.missing, m.last = "nccl", True, set(), {}
    m.final = meeting.Gathered("nccl", error="could not reach node rank 0's meeting point 10.0.0.1:29501")
    record = meeting.finish(SimpleNamespace(meeting=m, settings=SimpleNamespace(rdzv_timeout=10)), [])
    assert record["missing"] == [0] and not record["passed"] and record["meeting_error"].startswith("could not reach")


def test_rank_0_s_secret_is_taken_from_the_store_only_in_the_shape_rank_0_makes():
    assert meeting.secret_of("0f" * 16) == "0f" * 16
    for forged in ("ab\x00cd" * 6, "x" * 32, "0f" * 17, "", None, 42, ["0f" * 16]):
        assert meeting.secret_of(forged) is None  # a NUL byte in the group's id broke the launch: an ERROR, exit 3
