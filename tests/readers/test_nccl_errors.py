"""The catalogue of known NCCL and PyTorch errors, through the parser on the
recorded logs of tests/fixtures/nccl: one problem per category, the watchdog
wording, and causes and fixes an operator can act on."""

import json

from conftest import FIXTURES
from conftest import nccl_fixture_text as fixture

from preflight.readers.nccl_log import parse

NCCL = FIXTURES / "nccl"
EXPECTED = json.loads((NCCL / "expected.json").read_text())
LOGS = sorted(EXPECTED)


def test_watchdog_timeout_names_the_op_its_seqnum_the_timeout_and_the_ranks_that_waited():
    want = EXPECTED[next(n for n in LOGS if n.startswith("W01"))]["watchdog"]
    (p,) = parse(fixture("W01")).problems
    assert want["op"] in p.title and f"SeqNum {want['seq']}" in p.title and f"{want['timeout_s']} s" in p.title
    assert p.title.endswith("on ranks " + ", ".join(map(str, want["ranks"])))
    assert "py-spy" in p.fix and "NCCL_DEBUG=INFO" in p.fix and "TORCH_NCCL_TRACE_BUFFER_SIZE" in p.fix


def test_watchdog_names_the_ranks_that_did_not_report_when_the_world_size_is_known():
    text = "x [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0\n" + fixture("W01")
    (p,) = parse(text).problems
    assert "rank(s) 3 did not report it" in p.cause


def test_a_create_error_after_failed_to_extend_is_the_same_problem_and_alone_its_own():
    assert [p.category for p in parse(fixture("E03")).problems] == ["shm_no_space"]
    (p,) = parse(fixture("E03").splitlines()[0]).problems  # "Error while creating shared memory segment" only
    assert p.category == "shm_create" and "/dev/shm" in p.fix


def test_problem_causes_and_fixes_say_what_an_operator_does():
    fixes = {p.category: p.fix for name in LOGS for p in parse((NCCL / name).read_text()).problems}
    assert "--shm-size" in fixes["shm_no_space"] and "--ipc=host" in fixes["shm_no_space"] and "medium: Memory" in fixes["shm_no_space"]
    for words in ("ibv_devinfo", "ulimit -l", "memlock", "RDMA device plugin", "NCCL_IB_HCA"):
        assert words in fixes["ib_verbs"]
    assert "NCCL_SOCKET_IFNAME" in fixes["socket"] and "failed first" in fixes["socket"]

