"""The NCCL log parser on recorded logs (every fact tests/fixtures/nccl/expected.json
lists), on hand-written lines for each prefix and channel form, on broken and
huge text."""

import json
import random

import pytest
from conftest import FIXTURES
from conftest import nccl_fixture_text as fixture

from preflight.outputs.explain import nccl_log_text
from preflight.outputs.explain.nccl_log_text import render, to_json
from preflight.readers.nccl import nccl_log
from preflight.readers.nccl.nccl_log import Channel, NcclLog, parse

NCCL = FIXTURES / "nccl"
EXPECTED = json.loads((NCCL / "expected.json").read_text())
LOGS = sorted(EXPECTED)


def peer_table(log: NcclLog) -> dict:
    return {f"{r['src']}->{r['dst']}": {"transports": r["transports"], "channels": r["channels"]} for r in to_json(log, "x")["peers"]}


# --- the recorded logs -------------------------------------------------------------

def test_every_log_in_the_folder_has_its_expected_facts():
    assert sorted(p.name for p in NCCL.glob("*.log")) == LOGS


@pytest.mark.parametrize("name", LOGS, ids=lambda n: n[:3])
def test_recorded_log_gives_the_facts_its_index_lists(name):
    want = EXPECTED[name]
    log = parse((NCCL / name).read_text())
    for key in ("version", "versions", "networks", "ib_devices", "socket_interfaces", "env", "nranks", "nnodes", "nvls"):
        assert getattr(log, key) == want[key], key
    assert len(log.channels) == want["channel_lines"] and not log.skipped
    assert peer_table(log) == want["peers"]
    assert {"->".join(map(str, k)): v for k, v in log.peers().items()} == {k: v["transports"] for k, v in want["peers"].items()}
    assert {c.transport: [c.kind, c.net, c.gdr] for c in log.channels} == want["kinds"]
    first = {k: getattr(log.channels[0], k) for k in want["first_channel"]} if log.channels else None
    assert first == want["first_channel"]
    assert len(log.warnings) == want["warnings"]
    first = log.warnings[0].model_dump(include=set(want["first_warning"])) if log.warnings else None
    assert first == want["first_warning"]
    assert [{"category": p.category, "line": p.line, "count": p.count} for p in log.problems] == want["problems"]
    assert all(p.title and p.cause and p.fix and p.text for p in log.problems)


# --- hand-written lines: prefixes ---------------------------------------------------

BODY = "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"
PREFIXES = [
    "",
    "host-1:5969:5969 [0] ",
    "[2026-03-18 11:13:09] host-1:5969:5969 [0] ",
    "(RayWorkerWrapper pid=626, ip=10.244.1.107) host-1:5969:5969 [0] ",
    "[rank1]:host-1:5969:5969 [0] ",
    "[56] host-1:5969:5969 [0] ",
    "2025-11-12 20:42:20,261 - INFO - host-1:5969:5969 [0] ",
    "> > > (WorkerDict pid=3569860) host-1:5969:5969 [0] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_prefix_form_gives_the_same_facts(prefix):
    text = "\n".join(prefix + body for body in (
        "NCCL INFO NCCL version 2.21.5+cuda12.4",
        "NCCL INFO Using network IB",
        "NCCL INFO NCCL_IB_HCA set by environment to mlx5_0,mlx5_1.",
        "misc/shmutils.cc:71 NCCL WARN Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes",
        BODY,
    ))
    log = parse(text)
    assert (log.version, log.networks, log.env) == ("2.21.5+cuda12.4", ["IB"], {"NCCL_IB_HCA": "mlx5_0,mlx5_1"})
    (c,) = log.channels
    assert (c.line, c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev, c.transport) == (5, 0, 0, 0, 1, 1, "P2P/IPC/read")
    (w,) = log.warnings
    assert (w.line, w.where, w.message) == (4, "misc/shmutils.cc:71", "Error: failed to extend /dev/shm/nccl-fjwOOB to 5967876 bytes")
    assert (w.host, w.pid, w.dev) == ((None, None, None) if not prefix else ("host-1", 5969, 0))
    assert [p.category for p in log.problems] == ["shm_no_space"] and log.nccl_lines == 5


def test_the_version_line_nccl_prints_without_a_prefix_and_torchs_version_are_one_version():
    log = parse("NCCL version 2.19.3+cuda12.3\nRuntimeError: NCCL error in: x.cpp:1, unhandled system error, NCCL version 2.19.3\n")
    assert log.versions == ["2.19.3+cuda12.3"] and [p.category for p in log.problems] == ["unhandled_system_error"]
    assert parse("NCCL version 2.19.3\nNCCL version 2.19.3+cuda12.3\n").versions == ["2.19.3+cuda12.3"]


def test_two_nccl_versions_in_one_job_are_both_listed_and_said():
    log = parse("a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nb:2:2 [0] NCCL INFO NCCL version 2.18.3+cuda12.2\n")
    assert (log.version, log.versions) == ("2.21.5+cuda12.4", ["2.21.5+cuda12.4", "2.18.3+cuda12.2"])
    assert "more than one NCCL in one job" in render(log, "x")


# --- hand-written lines: channel forms ------------------------------------------------

CHANNELS = [
    # line, (channel, src, src_dev, dst, dst_dev, direction, kind, net, gdr), buses
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", (0, 0, 0, 1, 1, None, "P2P", None, False), None),
    ("Channel 07/0 : 7[7] -> 6[6] via P2P/direct pointer/read", (7, 7, 7, 6, 6, None, "P2P", None, False), None),
    ("Channel 02 : 1[1] -> 2[2] via SHM/direct/direct", (2, 1, 1, 2, 2, None, "SHM", None, False), None),
    ("Channel 02 : 1[1] -> 2[2] via SHM/direct", (2, 1, 1, 2, 2, None, "SHM", None, False), None),  # NCCL 2.30 (src/transport/shm.cc)
    ("Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3", (3, 15, 7, 6, 6, "send", "NET", "Socket", False), None),
    ("Channel 01/0 : 13[5] -> 4[4] [receive] via NET/IB/3", (1, 13, 5, 4, 4, "receive", "NET", "IB", False), None),
    ("Channel 00/0 : 1[1] -> 9[1] [send] via NET/IB/0(8)/GDRDMA", (0, 1, 1, 9, 1, "send", "NET", "IB", True), None),  # PXN
    ("Channel 04/0 : 2[2] -> 10[2] [send] via NET/IBext_v8/5(2)/GDRDMA", (4, 2, 2, 10, 2, "send", "NET", "IBext_v8", True), None),
    ("Channel 01/1 : 0[0] -> 8[0] [receive] via NET/IB/9/GDRDMA/Shared", (1, 0, 0, 8, 0, "receive", "NET", "IB", True), None),
    ("Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA(PCI)", (2, 3, 3, 11, 3, "send", "NET", "IB", True), None),
    ("Ring 00 : 0[0] -> 1[1] via direct shared memory", (0, 0, 0, 1, 1, None, "SHM", None, False), None),
    ("Ring 00 : 6 -> 2 [receive] via NET/IB/0", (0, 6, None, 2, None, "receive", "NET", "IB", False), None),
    ("Ring 01 : 1[23000] -> 8[1e000] [send] via NET/IB/1/GDRDMA", (1, 1, None, 8, None, "send", "NET", "IB", True), ("23000", "1e000")),
    ("Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA", (1, 2, None, 0, None, "receive", "NET", "IB", True), ("c7000", "87000")),
    ("Channel 00/0 : 0[0] -> 4[4] via P2P/indirect/2[2]", (0, 0, 0, 4, 4, None, "P2P", None, False), None),
    ("Channel 00/0 : 0[0] -> 1[1] via NVLS/IPC", (0, 0, 0, 1, 1, None, "NVLS", None, False), None),
    # NCCL 2.7-2.8: "Channel NN :" without the connection index, the PCI bus id in the brackets
    ("Channel 00 : 0[1000] -> 1[2000] via direct shared memory", (0, 0, None, 1, None, None, "SHM", None, False), ("1000", "2000")),
    ("Channel 00 : 0[1000] -> 1[2000] via shared memory", (0, 0, None, 1, None, None, "SHM", None, False), ("1000", "2000")),
    ("Channel 01 : 0[1000] -> 1[2000] via P2P/direct pointer", (1, 0, None, 1, None, None, "P2P", None, False), ("1000", "2000")),
    ("Channel 01 : 0[1000] -> 1[2000] via P2P/IPC", (1, 0, None, 1, None, None, "P2P", None, False), ("1000", "2000")),
    ("Channel 01 : 0[1000] -> 1[2000] via P2P/IPC/read", (1, 0, None, 1, None, None, "P2P", None, False), ("1000", "2000")),
    ("Channel 00 : 1[2000] -> 2[1000] [send] via NET/IB/0", (0, 1, None, 2, None, "send", "NET", "IB", False), ("2000", "1000")),
    ("Channel 00 : 3[2000] -> 0[1000] [receive] via NET/Socket/0", (0, 3, None, 0, None, "receive", "NET", "Socket", False), ("2000", "1000")),
    ("Channel 00 : 0[1b000] -> 4[3d000] via P2P/indirect/2[1c000]", (0, 0, None, 4, None, None, "P2P", None, False), ("1b000", "3d000")),
    ("Ring 00 : 0[0] -> 1[0] via P2P/common device", (0, 0, 0, 1, 0, None, "P2P", None, False), None),  # two ranks on one GPU, up to 2.7
]


@pytest.mark.parametrize("line, facts, buses", CHANNELS, ids=[c[0].split(" via ")[1] for c in CHANNELS])
def test_each_channel_line_form(line, facts, buses):
    (c,) = parse(f"host:1:2 [0] NCCL INFO {line}\n").channels
    assert (c.channel, c.src_rank, c.src_dev, c.dst_rank, c.dst_dev, c.direction, c.kind, c.net, c.gdr) == facts
    assert c.transport == line.split(" via ")[1] and (c.src_bus, c.dst_bus) == (buses or (None, None))


HANDMADE = NCCL / "handmade"


@pytest.mark.parametrize("prefix, network, kinds, peers", [
    ("H01", ["IB"], {"direct shared memory": ["SHM", None, False], "NET/IB/0": ["NET", "IB", False]},
     {"3->0": ["NET/IB/0"], "1->2": ["NET/IB/0"], "0->1": ["direct shared memory"], "1->0": ["direct shared memory"]}),
    ("H02", ["Socket"], {"P2P/IPC": ["P2P", None, False], "NET/Socket/0": ["NET", "Socket", False]},
     {"3->0": ["NET/Socket/0"], "1->2": ["NET/Socket/0"], "0->1": ["P2P/IPC"], "1->0": ["P2P/IPC"]}),
], ids=["H01-shm-ib", "H02-p2p-socket"])
def test_an_nccl_2_7_log_gives_every_channel_with_its_transport(prefix, network, kinds, peers):
    (path,) = HANDMADE.glob(prefix + "_*.log")
    log = parse(path.read_text())
    assert (log.version, log.networks, log.nranks) == ("2.7.8+cuda11.0", network, 4)
    assert len(log.channels) == 8 and not log.skipped and not log.problems
    assert {c.transport: [c.kind, c.net, c.gdr] for c in log.channels} == kinds
    assert {f"{a}->{b}": t for (a, b), t in log.peers().items()} == peers
    assert all(c.src_bus and c.dst_bus and c.src_dev is None for c in log.channels)


def test_a_bus_id_anywhere_means_every_bracket_of_that_log_is_one():
    log = parse("Channel 00 : 0[50] -> 1[1b000] via P2P/IPC\nChannel 00 : 1[1b000] -> 0[50] via P2P/IPC\n")
    assert [(c.src_dev, c.src_bus, c.dst_dev, c.dst_bus) for c in log.channels] == [(None, "50", None, "1b000"), (None, "1b000", None, "50")]


def test_ring_order_and_tree_lines_are_not_connections():
    log = parse("h:1:1 [0] NCCL INFO Channel 00/24 :    0   1   2   3\nh:1:1 [0] NCCL INFO Ring 00 : 0 1 2 3\n"
                "h:1:1 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1\n"
                "h:1:1 [0] NCCL INFO Ring 00 : 0[0] <- 1[1] via P2P/CUMEM\n")  # TRACE's reverse arrow
    assert log.channels == [] and log.skipped == [] and log.nccl_lines == 4


def test_peers_keep_the_order_of_first_use_and_count_channels_once_per_side():
    log = parse("Channel 00/0 : 3[3] -> 0[0] [send] via NET/IB/0/GDRDMA\n"
                "Channel 00/0 : 3[3] -> 0[0] [receive] via NET/IB/4/GDRDMA\n"
                "Channel 01/0 : 3[3] -> 0[0] [send] via NET/IB/0/GDRDMA\n")
    assert log.peers() == {(3, 0): ["NET/IB/0/GDRDMA", "NET/IB/4/GDRDMA"]}
    assert to_json(log, "x")["peers"] == [{"src": 3, "dst": 0, "transports": ["NET/IB/0/GDRDMA", "NET/IB/4/GDRDMA"], "channels": 2}]


# --- broken, empty, odd and huge text -------------------------------------------------

@pytest.mark.parametrize("line", [
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/rea",  # cut inside the transport
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/IB/0/GDR",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPh:1:3 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[2] via P2P/IPC",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via ",
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/dir",
])
def test_a_channel_line_cut_or_interleaved_is_skipped_not_guessed(line):
    log = parse(line + "\n")
    assert log.channels == [] and log.skipped == [1]
    assert "1 channel line(s) cut or garbled" in render(log, "x")


@pytest.mark.parametrize("text", [
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[\n1] via P2P/IPC\n",  # split across lines
    "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via\n P2P/IPC\n",
    "(WorkerDict pid=3569860) degamts15:3569860:3571297 [0] N\n(WorkerDict pid=3569861) degamts15:3569861:3571306\n",
    "NCCL version 2.\nNCCL version 2.21\nNCCL_IB_HCA set by environment to \nUsing network \n",
    "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [\n\n  13] 1/-1/-1->0->-1 [14] 1/-1/-1->0->-1\n",
])
def test_broken_lines_give_no_facts(text):
    log = parse(text)
    assert (log.channels, log.versions, log.env, log.networks, log.warnings, log.problems) == ([], [], {}, [], [], [])


def test_a_version_cut_inside_its_cuda_suffix_keeps_only_the_part_that_is_whole():
    assert parse("NCCL version 2.21.5+cuda12\n").versions == ["2.21.5"]
    assert parse("NCCL version 2.21.5+cu").versions == ["2.21.5"]


def test_lines_broken_anywhere_never_invent_a_channel_or_a_version():
    rng = random.Random(7)
    for name in LOGS:
        text = (NCCL / name).read_text()
        whole = parse(text)
        real = {(c.channel, c.src_rank, c.dst_rank): c.transport for c in whole.channels}
        lines = text.splitlines()
        for _ in range(30):
            cut = [line[: (at := rng.randrange(len(line) + 1))] + "\n" + line[at:] if line and rng.random() < 0.5 else line for line in lines]
            log = parse("\n".join(cut))
            for c in log.channels:  # a line cut right after "P2P/IPC" of "P2P/IPC/read" cannot be told from a whole one
                assert real[(c.channel, c.src_rank, c.dst_rank)].startswith(c.transport)
            assert all(any(v == w or w.startswith(v) for w in whole.versions) for v in log.versions)


def test_empty_text_and_text_without_nccl():
    for text in ("", "\n\n", "hello\nworld\n"):
        log = parse(text)
        assert log.nccl_lines == 0 and log.channels == [] and log.problems == [] and log.version is None
        assert "no NCCL debug output here" in render(log, "x")
    assert parse("").lines == 0 and parse("a\nb").lines == 2 and parse("a\nb\n").lines == 2


def test_odd_characters_and_crlf_never_crash():
    text = "h:1:2 [0] NCCL INFO Using network Socket\r\n\x00\ufffd\u2028Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\r\n" + "".join(map(chr, range(1, 300)))
    log = parse(text)
    assert log.networks == ["Socket"] and [c.transport for c in log.channels] == ["P2P/IPC"]


def test_200k_lines_parse_whole():
    """Every fact at scale (the timing figure is in tests/perf/bench_nccl_log.py)."""
    unit = fixture("E14") + fixture("05")
    n = 200_000 // unit.count("\n") + 1
    log = parse(unit * n)
    assert log.lines == unit.count("\n") * n and len(log.channels) == 54 * n and len(log.warnings) == n
    assert [(p.category, p.count) for p in log.problems] == [("socket", 2 * n), ("internal_error", n)]
    assert log.peers()[(1, 2)] == ["P2P/direct pointer"] and log.env["NCCL_P2P_DISABLE"] == "1"


def test_a_pathological_line_stays_linear():
    """Quadratic patterns would take minutes here; the parser takes milliseconds."""
    junk = "Channel 00/0 : 0[0] -> 1[1] via /dev/shm/x NCCL_X set by environment to  WorkNCCL( NCCL WARN ocket " * 4000
    log = parse(junk + "\n" + junk)
    assert log.lines == 2 and log.channels == []


def test_the_interface_other_code_imports():
    assert nccl_log.MAX_BYTES == 64 << 20
    assert set(Channel.model_fields) >= {"line", "channel", "src_rank", "src_dev", "dst_rank", "dst_dev", "direction", "transport", "kind", "net", "gdr"}
    assert callable(nccl_log.parse) and callable(nccl_log_text.render) and callable(nccl_log_text.to_json)


# --- looks_like ---------------------------------------------------------------------------

def test_looks_like_says_yes_to_every_nccl_log():
    paths = list(NCCL.rglob("*.log"))
    assert len(paths) >= 17
    for path in paths:
        assert nccl_log.looks_like(path.read_text()), path.name


@pytest.mark.parametrize("line", [
    "host-1:5969:5969 [0] NCCL INFO Using network IB",
    "[2026-03-18 11:13:09] host-1:5969:5969 [0] misc/socket.cc:537 NCCL WARN ncclSocketInit: connecting",
    "NCCL version 2.7.8+cuda11.0",
    "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: x",
    "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled system error, NCCL version 2.7.8",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, ncclRemoteError",
], ids=["info", "warn", "version", "watchdog", "runtime-error", "dist-backend-error"])
def test_looks_like_finds_nccls_words_in_the_first_lines_and_past_them(line):
    assert nccl_log.looks_like(line + "\n")
    training = "".join(f"epoch 0 step {i} loss 2.{i % 97:02d}\n" for i in range(5000))
    assert nccl_log.looks_like(training + line + "\n")
    assert not nccl_log.looks_like(training)


def test_looks_like_says_no_to_every_other_kind_of_capture():
    """nccl-tests output says yes only where NCCL_DEBUG put NCCL's own lines into it."""
    paths = [p for kind in ("topo", "nccltests", "xid", "df", "nvsmi", "dcgmi", "pcie_notice")
             for p in (FIXTURES / kind).rglob("*") if p.is_file() and p.suffix in (".txt", ".log")]
    assert len(paths) >= 20
    for path in paths:
        text = path.read_text(errors="replace")
        assert nccl_log.looks_like(text) is (path.parent.name == "nccltests" and ("NCCL INFO" in text or "NCCL WARN" in text)), path.name
    assert not nccl_log.looks_like("") and not nccl_log.looks_like("libnccl2 is installed\nnccl-tests 2.13.8\n")


def test_nvls_channels_say_whether_nccl_set_nvls_up():
    # "24 coll channels, 16 nvls channels": the 8x H100 run that used NVLS; "0 nvls channels": a 2-GPU consumer box.
    nvls = (FIXTURES / "nccltests" / "11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt").read_text()
    assert nccl_log.parse(nvls).nvls_channels == 16
    consumer = nccl_log.parse((FIXTURES / "nccl" / "02_nccl2.27.5_2gpu-consumer_NET-Socket-16ifaces_SHM-direct-direct_isAllDirectP2p0.log").read_text())
    assert consumer.nvls_channels == 0
    s = nccl_log.summary(consumer)
    assert s.nvls_channels == 0 and s.transports == ["SHM"] and s.peers == {"0->1": ["SHM/direct/direct"], "1->0": ["SHM/direct/direct"]}
    h800 = nccl_log.parse((FIXTURES / "nccl" / "05_nccl2.18.3_8xH800-single-process_nccl-tests-header_NET-Socket_NVLS-available_P2P-direct-pointer.log").read_text())
    assert h800.nvls is True and h800.nvls_channels is None  # available, and no line says what NCCL set up


@pytest.mark.parametrize("line", [
    # NCCL 2.30 (src/debug.cc v2.30.7-1) names the function after file:line: "[%d] %s:%d (%s) NCCL WARN %s".
    "node-7:4242:4250 [3] transport/shm.cc:96 (shmSendSetup) NCCL WARN Error while creating shared memory segment",
    "[2026-03-18 11:13:09] node-7:4242:4250 [3] transport/shm.cc:96 (shmSendSetup) NCCL WARN Error while creating "
    "shared memory segment",
    # Up to 2.29: "[%d] %s:%d NCCL WARN %s".
    "node-7:4242:4250 [3] transport/shm.cc:96 NCCL WARN Error while creating shared memory segment",
])
def test_a_warn_line_gives_its_host_pid_device_and_place_in_every_releases_layout(line):
    (w,) = parse(line + "\n").warnings
    assert (w.host, w.pid, w.dev, w.where) == ("node-7", 4242, 3, "transport/shm.cc:96")
    assert w.message == "Error while creating shared memory segment"
