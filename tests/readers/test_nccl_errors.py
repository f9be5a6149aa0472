"""The catalogue of known NCCL and PyTorch errors, through the parser on the
recorded logs of tests/fixtures/nccl: one problem per category, the watchdog
wording, and causes and fixes an operator can act on."""

import json

from conftest import FIXTURES
from conftest import nccl_fixture_text as fixture

import pytest

from preflight.readers.nccl.nccl_log import parse

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



HANDMADE = NCCL / "handmade"


def handmade(prefix: str) -> str:
    (path,) = HANDMADE.glob(prefix + "_*.log")
    return path.read_text()


def test_old_nccls_posix_fallocate_failure_is_dev_shm_too_small():
    """NCCL up to 2.11 grew its segment in include/shm.h; its WARN names no /dev/shm path."""
    log = parse(handmade("H03"))
    assert [(p.category, p.severity, p.line, p.count) for p in log.problems] == [
        ("shm_no_space", "fail", 12, 1), ("unhandled_system_error", "fail", 26, 1)]
    shm = log.problems[0]
    assert shm.text.endswith("include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device")
    new = parse(fixture("E03")).problems[0]
    assert (shm.title, shm.cause, shm.fix) == (new.title, new.cause, new.fix)
    # posix_fallocate failing for another reason is not a full /dev/shm
    assert not parse("x [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : Operation not supported\n").problems


COLLNET = [
    ("transport.cc:356 NCCL WARN Cannot initialize CollNet, using point-to-point network instead", True),  # 2.9 and later
    ("init.cc:524 NCCL WARN Cannot initialize CollNet, using IB instead", True),  # 2.7-2.8
    ("graph/tuning.cc:276 NCCL WARN CollNet is not supported or fails to initialize, ignoring NCCL_ALGO=COLLNET", True),
    ("init.cc:1198 NCCL WARN CollNet currently only supports up to 8 GPUs per node, disabling CollNet", True),
    # by design: a communicator within one node has nothing to reduce in the switches
    ("NCCL INFO Communicator has 1 nodes which is less than CollNet node threshold 2, disabling CollNet", False),
]


@pytest.mark.parametrize("line, fell_back", COLLNET, ids=["p2p-instead", "net-instead-2.7", "algo-ignored", "gpus-per-node", "node-threshold"])
def test_collnet_that_could_not_be_set_up_is_a_warning(line, fell_back):
    problems = parse(f"dgx-01:5501:5630 [0] {line}\n").problems
    assert [(p.category, p.severity) for p in problems] == ([("collnet_fallback", "warn")] if fell_back else [])


def test_collnet_fallback_says_what_the_job_lost_and_what_to_check():
    log = parse(handmade("H04"))
    (p,) = log.problems
    assert (p.category, p.severity, p.line) == ("collnet_fallback", "warn", 17)
    assert log.env["NCCL_COLLNET_ENABLE"] == "1" and log.nnodes == 2
    assert "in-network reduction" in p.cause and "all_reduce across nodes" in p.cause and "slower" in p.cause
    for words in ("SHARP plugin", "NCCL_COLLNET_ENABLE", "sharp_am", "ConnectX-6", "Quantum"):
        assert words in p.fix


def test_every_other_known_problem_is_a_failure():
    severities = {p.category: p.severity for name in LOGS for p in parse((NCCL / name).read_text()).problems}
    assert len(severities) >= 5 and set(severities.values()) == {"fail"}


@pytest.mark.parametrize("line, found", [
    # NCCL 2.26-2.28 (src/misc/socket.cc) at INFO: a connect refused and retried is NCCL coping, not a failure.
    ("h:1:2 [1] misc/socket.cc:587 NCCL INFO socketPollConnect: connect to 10.0.0.2<43121> returned Connection refused, "
     "retrying (1/34) after sleep for 100 msec", []),
    ("h:1:2 [0] NCCL INFO socketFinalizeAccept: didn't receive a valid magic from 10.0.0.9<51234>", []),
    # Out of retries, NCCL WARNs: that is the failure.
    ("h:1:2 [1] misc/socket.cc:582 NCCL WARN socketPollConnect: connect to 10.0.0.2<43121> returned Connection refused, "
     "exceeded error retry count after 35 attempts", ["socket"]),
    ("h:1:2 [0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer h2<42362>", ["socket"]),
    # NCCL 2.29+ (src/os/linux.cc): the same words under ncclOsSocket* names, and its WARN format's "(function)".
    ("h:1:2 [1] os/linux.cc:293 NCCL INFO ncclOsSocketPollConnect: connect to 10.0.0.2<43121> returned Connection refused, "
     "retrying (2/34) after sleep for 200 msec", []),
    ("h:1:2 [1] os/linux.cc:362 (ncclOsSocketProgressOpt) NCCL WARN ncclOsSocketProgressOpt: Call to recv from "
     "10.0.0.2<43121> failed : Connection reset by peer", ["socket"]),
    ("h:1:2 [1] os/linux.cc:328 (ncclOsSocketPollConnect) NCCL WARN ncclOsSocketPollConnect to 10.0.0.2<43121> failed "
     "with error Connection refused", ["socket"]),
])
def test_a_socket_connect_nccl_retries_is_no_problem_until_it_gives_up(line, found):
    assert [p.category for p in parse(line + "\n").problems] == found



@pytest.mark.parametrize("line, found", [
    # INFO lines NCCL prints while coping, verbatim formats from its sources: none is a failure of the node.
    # src/misc/socket.cc v2.30.7-1: a connection that never sent the magic (a port scanner, a health probe) is dropped.
    ("h:1:2 [0] NCCL INFO socketFinalizeAccept: handshake receive from 10.0.0.9<51234> failed, discarding peer connection", []),
    ("h:1:2 [0] NCCL INFO socketFinalizeAccept: peer 10.0.0.9<51234> closed before magic handshake, discarding", []),
    # src/misc/socket.cc 2.19-2.28, src/os/linux.cc 2.29+: the application aborted the communicator on purpose.
    ("h:1:2 [0] NCCL INFO socketProgressOpt: abort called", []),
    ("h:1:2 [0] NCCL INFO ncclOsSocketProgressOpt: abort called", []),
    # src/misc/ibvwrap.cc 2.26+: a QP transition retried (NCCL_IB_MQP_RETRY_CNT); only the WARN after the last try fails.
    ("h:1:2 [0] NCCL INFO Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state INIT, "
     "next state RTR, retrying 1/34 after 100 msec of sleep", []),
    ("h:1:2 [0] misc/ibvwrap.cc:376 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, "
     "curr state INIT, next state RTR", ["ib_verbs"]),
    # src/include/checks.h CUDACHECKIGNORE (all releases): NCCL reports a CUDA error it clears and ignores, at INFO.
    ("h:1:2 [0] NCCL INFO enqueue.cc:893 Cuda failure 'invalid argument'", []),
    ("h:1:2 [0] NCCL INFO dev_runtime.cc:197 Cuda failure 'invalid argument'", []),
    ("h:1:2 [0] include/checks.h:20 NCCL WARN Cuda failure 'out of memory'", ["unhandled_cuda_error"]),
])
def test_what_nccl_logs_at_info_while_it_copes_is_no_problem(line, found):
    assert [p.category for p in parse(line + "\n").problems] == found


# NVIDIA/Fuser#3055 (turn 3, NCCL 2.23.4, mpirun -np 4, ncclCommAbort at teardown), lines as posted: after the
# application aborts its communicators, each thread blocked in a socket returns ncclInternalError (3) from
# socketProgressOpt's "abort called" (INFO of the NET subsystem, not shown by default) up its call chain.
_ABORTED = """\
dgx1v-loki-23:5890:6275 [0] NCCL INFO comm 0x7f00faaa5c00 rank 0 nranks 4 cudaDev 0 busId 6000 - Abort COMPLETE
dgx1v-loki-23:5890:6279 [0] NCCL INFO misc/socket.cc:47 -> 3
dgx1v-loki-23:5890:6279 [0] NCCL INFO misc/socket.cc:58 -> 3
dgx1v-loki-23:5890:6279 [0] NCCL INFO misc/socket.cc:781 -> 3
dgx1v-loki-23:5890:6080 [0] NCCL INFO misc/socket.cc:832 -> 3
dgx1v-loki-23:5891:6280 [1] NCCL INFO misc/socket.cc:47 -> 3
dgx1v-loki-23:5893:6277 [3] NCCL INFO comm 0x7fe3d6f51880 rank 3 nranks 4 cudaDev 3 busId b000 - Abort COMPLETE
"""


def test_the_socket_return_chain_of_a_communicator_the_application_aborted_is_no_problem():
    assert parse(_ABORTED).problems == []


def test_a_socket_failure_nccl_warned_of_is_a_problem_even_in_a_log_that_aborts():
    # A real failure WARNs first (misc/socket.cc's "socketProgress: Connection closed by remote peer"), then aborts.
    text = ("h:1:2 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer h2<42362>\n"
            "h:1:2 [0] NCCL INFO misc/socket.cc:749 -> 6\n" + _ABORTED)
    assert [p.category for p in parse(text).problems] == ["socket"]


def test_a_socket_return_chain_without_an_abort_is_still_a_problem():
    text = "".join(line + "\n" for line in _ABORTED.splitlines() if "Abort COMPLETE" not in line)
    assert [p.category for p in parse(text).problems] == ["socket"]
